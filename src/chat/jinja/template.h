// A parsed Jinja2 template and how to render it. The template is immutable
// after parsing; each render() builds its own interpreter state, so one
// Template serves concurrent renders.
#pragma once

#include <cstddef>
#include <cstdint>
#include <ctime>
#include <optional>
#include <string>
#include <string_view>

#include "chat/jinja/ast.h"

namespace pagellm::jinja {

// Bounds that stop a hostile template, or hostile request data rendered by
// one, with an error naming the limit and its value (SyntaxError when parsing,
// RenderError "ResourceLimitError" / "RecursionError" when rendering) instead
// of exhausting the stack, memory or CPU. The defaults are far above what real
// chat templates need: the ones in tests/fixtures nest less than 20 deep, call
// macros a few levels deep and render in well under 100k steps.
struct Limits {
  // ---- parsing (Template / ChatTemplate constructor) ----
  // Blocks, brackets and unary operators nested in the source. Bounds the
  // parser's recursion: ~2 KB of stack per level (measured), 0.6 MB at 256.
  int max_nesting = 256;
  // Depth of one expression's tree, chains included: `a.b.c`, `x|f|g`,
  // `1 + 2 + 3` and `f()()` each add a level per link. Evaluating and
  // destroying a tree recurse over it, so a 200,000-link chain must be refused.
  int max_expr_depth = 256;

  // ---- rendering (RenderOptions) ----
  // Statements, expressions and filter links being evaluated at once, summed
  // over nested macro calls (a call counts 2 more): the interpreter's
  // recursion depth. A level takes ~0.5 KB of stack in a release build and
  // up to ~6 KB under ASan (measured), so 512 needs 0.25 MB, or 3 MB with
  // sanitizers. A 40-deep recursive macro with 10 levels in its body fits.
  int max_eval_depth = 512;
  // Macro calls, call blocks (`caller()`) and recursive loops nested at once.
  // Recursive tool-schema macros nest as deep as the schema (< 20).
  int max_call_depth = 64;
  // `for` iterations (and `for ... if` tests) in one render: 1000 messages x
  // a few inner loops is ~10k.
  uint64_t max_loop_iterations = 1'000'000;
  // Work in one render: statements, expressions, iterations, bytes/64 and
  // items/16 that builtins produce, copy, compare or scan, and each item of a
  // new list (see jinja::charge): ~1 s of CPU and a few hundred MB at most.
  // A 1 MB message costs 16k steps a pass over it.
  uint64_t max_steps = 5'000'000;
  // The rendered text; twice the server's default request cap (16 MiB), so
  // any accepted request renders even if a template prints it twice.
  size_t max_output_bytes = 32u << 20;
  // Any one string a template builds (the output is one too), e.g. a macro
  // result or a `{% set %}` block holding the whole prompt.
  size_t max_string_bytes = 32u << 20;
  // Any one list or dict a template builds, and strings iterated by character.
  size_t max_items = 1'000'000;
};

struct RenderOptions {
  Limits limits;
  // strftime_now() formats this time instead of the local clock (tests).
  std::optional<std::tm> now;
};

class Template {
 public:
  // Parses once; throws SyntaxError (a pagellm::Error naming line and column),
  // also when the source exceeds limits.max_nesting or max_expr_depth.
  explicit Template(std::string_view source, const Limits& limits = {});
  Template(Template&&) noexcept = default;
  Template& operator=(Template&&) noexcept = default;

  // context: a dict value of variables. Throws pagellm::TemplateError for
  // raise_exception() and RenderError for other failures.
  std::string render(const Value& context, const RenderOptions& options = {}) const;

 private:
  Body body_;
};

}  // namespace pagellm::jinja
