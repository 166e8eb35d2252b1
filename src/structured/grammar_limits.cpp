// Structural limits of a structured-output spec, measured by linear scans of
// its text before xgrammar builds anything from it: the size, the nesting and
// the number of nodes. A regex or EBNF repetition {n,m} multiplies the nodes
// of what it repeats (xgrammar unrolls bounded repetition), so "(a{1000}){1000}"
// counts a million.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <limits>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "core/json_limits.h"
#include "structured/grammar.h"

namespace pagellm::structured {
namespace {

using Kind = StructuredOutputs::Kind;
constexpr int64_t kMany = std::numeric_limits<int64_t>::max() / 4;

int64_t saturating_mul(int64_t a, int64_t b) { return (b != 0 && a > kMany / b) ? kMany : a * b; }
int64_t saturating_add(int64_t a, int64_t b) { return std::min(kMany, a + b); }

struct Shape {
  int64_t depth = 0;
  int64_t nodes = 0;
};

// Reads "{n}", "{n,}" or "{n,m}" at text[i] ('{'); the count it unrolls to
// (m, or n + 1 when open), or -1 when it is no repetition (then a literal).
int64_t repetition_count(std::string_view text, size_t& i) {
  size_t j = i + 1;
  int64_t lo = 0, hi = -1;
  bool digits = false, comma = false;
  for (; j < text.size() && text[j] != '}'; ++j) {
    const char c = text[j];
    if (c >= '0' && c <= '9') {
      int64_t& v = comma ? hi : lo;
      if (v < 0) v = 0;
      v = v > kMany / 10 ? kMany : std::min<int64_t>(kMany, v * 10 + (c - '0'));  // saturates, never overflows
      digits = true;
    } else if (c == ',' && !comma) {
      comma = true;
    } else if (c != ' ') {
      return -1;
    }
  }
  if (j >= text.size() || !digits) return -1;
  i = j;
  if (!comma) return std::max<int64_t>(lo, 1);
  return hi < 0 ? saturating_add(lo, 1) : std::max<int64_t>(hi, 1);
}

// Nesting and atoms of a regex or an EBNF text. Groups nest with ( ); an atom
// is a character, an escape, a class [...], a string literal "..." (EBNF, one
// node per byte) or a rule name; a repetition multiplies the atom or group
// before it.
Shape pattern_shape(std::string_view text, bool ebnf) {
  struct Group {
    int64_t nodes = 0;
    int64_t last = 0;  // nodes of the latest atom or group, for a repetition after it
  };
  std::vector<Group> stack(1);
  Shape shape;
  auto add_atom = [&](int64_t n) {
    stack.back().nodes = saturating_add(stack.back().nodes, n);
    stack.back().last = n;
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\\') {
      ++i;
      add_atom(1);
    } else if (c == '[') {  // a class: one atom, whatever it holds
      for (++i; i < text.size() && text[i] != ']'; ++i)
        if (text[i] == '\\') ++i;
      add_atom(1);
    } else if (ebnf && (c == '"' || c == '\'')) {
      int64_t n = 0;
      for (++i; i < text.size() && text[i] != c; ++i, ++n)
        if (text[i] == '\\') ++i;
      add_atom(std::max<int64_t>(n, 1));
    } else if (ebnf && c == '#') {  // a comment to the end of the line
      while (i < text.size() && text[i] != '\n') ++i;
    } else if (c == '(') {
      stack.emplace_back();
      shape.depth = std::max<int64_t>(shape.depth, static_cast<int64_t>(stack.size()) - 1);
    } else if (c == ')') {
      if (stack.size() == 1) {
        add_atom(1);  // unbalanced: the parser will say so
        continue;
      }
      const int64_t n = stack.back().nodes;
      stack.pop_back();
      add_atom(std::max<int64_t>(n, 1));
    } else if (c == '{') {
      const int64_t count = repetition_count(text, i);
      if (count < 0) {
        add_atom(1);
        continue;
      }
      Group& g = stack.back();
      const int64_t extra = saturating_mul(g.last, count - 1);
      g.nodes = saturating_add(g.nodes, extra);
      g.last = saturating_add(g.last, extra);
    } else if (c == '|' || c == '*' || c == '+' || c == '?' || c == ' ' || c == '\n' || c == '\t' || c == '\r' ||
               (ebnf && (c == ':' || c == '='))) {
      // alternation, unbounded repetition and EBNF's "::=" add no node
    } else if (ebnf && (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) {
      while (i + 1 < text.size() &&
             (std::isalnum(static_cast<unsigned char>(text[i + 1])) || text[i + 1] == '_' || text[i + 1] == '-'))
        ++i;
      add_atom(1);  // a rule name (or "::=")
    } else {
      add_atom(1);
    }
  }
  while (stack.size() > 1) {  // unclosed groups: count them anyway
    const int64_t n = stack.back().nodes;
    stack.pop_back();
    stack.back().nodes = saturating_add(stack.back().nodes, n);
  }
  shape.nodes = stack.back().nodes;
  return shape;
}

Shape json_shape(std::string_view text) {
  const JsonCost cost = estimate_json_cost(text);
  return {static_cast<int64_t>(cost.depth), static_cast<int64_t>(std::min<size_t>(cost.elements, kMany))};
}

const char* nodes_of(Kind k) {
  switch (k) {
    case Kind::Regex:
    case Kind::Grammar: return "atoms (bounded repetitions counted in full)";
    case Kind::Choice: return "choices";
    default: return "JSON values";
  }
}

const char* depth_of(Kind k) {
  switch (k) {
    case Kind::Regex: return "nests groups";
    case Kind::Grammar: return "nests parentheses";
    default: return "nests";
  }
}

}  // namespace

void check_grammar_limits(const StructuredOutputs& s, const GrammarLimits& limits, const char* param) {
  if (!s.active() || s.kind == Kind::JsonObject) return;
  const std::string what = fmt::format("the {}", kind_name(s.kind));
  if (s.spec.size() > limits.max_bytes)
    throw InvalidRequest(fmt::format("{} has {} bytes; the limit is {} (--grammar-max-bytes)", what, s.spec.size(),
                                     limits.max_bytes),
                         param);
  const bool pattern = s.kind == Kind::Regex || s.kind == Kind::Grammar;
  const Shape shape = pattern ? pattern_shape(s.spec, s.kind == Kind::Grammar) : json_shape(s.spec);
  // A choice list is one JSON array: its strings are the nodes that count.
  const int64_t nodes = s.kind == Kind::Choice ? std::max<int64_t>(shape.nodes - 1, 0) : shape.nodes;
  if (shape.depth > limits.max_depth)
    throw InvalidRequest(fmt::format("{} {} {} levels deep; the limit is {} (--grammar-max-depth)", what,
                                     depth_of(s.kind), shape.depth, limits.max_depth),
                         param);
  if (nodes > limits.max_nodes)
    throw InvalidRequest(fmt::format("{} has {}{} {}; the limit is {} (--grammar-max-nodes)", what,
                                     nodes >= kMany ? "over " : "", std::min(nodes, kMany), nodes_of(s.kind),
                                     limits.max_nodes),
                         param);
}

}  // namespace pagellm::structured
