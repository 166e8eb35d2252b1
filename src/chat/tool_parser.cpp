#include "chat/tool_parser.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "core/error.h"
#include "core/utf8.h"

namespace pagellm::chat {
namespace {

// ordered_json keeps the model's key order in arguments, as vLLM's json.dumps does.
using Json = nlohmann::ordered_json;

// Like kRequestJsonLimits' depth: dump() and the Python-literal parser recurse once per level.
constexpr size_t kMaxNesting = 64;

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kMistralMarker = "[TOOL_CALLS]";
constexpr std::string_view kMistralArgs = "[ARGS]";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kPythonStart = "<|python_start|>";
constexpr std::string_view kPythonEnd = "<|python_end|>";

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_ident_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_ident_char(char c) { return is_ident_start(c) || is_digit(c); }
// vLLM's Mistral function-name pattern, [a-zA-Z0-9_-]+.
bool is_mistral_name_char(char c) { return is_ident_char(c) || c == '-'; }

size_t skip_space(std::string_view s, size_t i) {
  while (i < s.size() && is_space(s[i])) ++i;
  return i;
}

std::string_view trim(std::string_view s) {
  const size_t begin = skip_space(s, 0);
  size_t end = s.size();
  while (end > begin && is_space(s[end - 1])) --end;
  return s.substr(begin, end - begin);
}

// Length of the longest suffix of `text` that is a proper prefix of `marker`: text that may still become it.
size_t partial_marker_len(std::string_view text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n)
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  return 0;
}

// Model output need not be valid UTF-8 (a Python \x escape, raw bytes); never throw for it.
std::string dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

// Finds where a JSON object or array ends, one byte at a time, so streams learn a call's end without
// re-parsing. Only strings and brackets are tracked; nlohmann checks the rest once the extent is known.
class JsonExtent {
 public:
  enum class Step { kMore, kDone, kError };

  Step push(char c) {
    if (in_string_) {
      if (escaped_)
        escaped_ = false;
      else if (c == '\\')
        escaped_ = true;
      else if (c == '"')
        in_string_ = false;
      return Step::kMore;
    }
    switch (c) {
      case '{':
      case '[':
        if (open_.size() >= kMaxNesting) return Step::kError;
        open_.push_back(c);
        return Step::kMore;
      case '}':
      case ']':
        if (open_.empty() || open_.back() != (c == '}' ? '{' : '[')) return Step::kError;
        open_.pop_back();
        return open_.empty() ? Step::kDone : Step::kMore;
      case '"':
        if (open_.empty()) return Step::kError;
        in_string_ = true;
        return Step::kMore;
      default:
        // Before the first bracket only whitespace may come: the value must be a container.
        return open_.empty() && !is_space(c) ? Step::kError : Step::kMore;
    }
  }

 private:
  std::string open_;  // the brackets still open
  bool in_string_ = false;
  bool escaped_ = false;
};

// Where the JSON object or array starting at text[start] ends (one past it); npos when malformed or unfinished.
size_t json_container_end(std::string_view text, size_t start) {
  JsonExtent extent;
  for (size_t i = start; i < text.size(); ++i) {
    const JsonExtent::Step step = extent.push(text[i]);
    if (step == JsonExtent::Step::kError) return std::string_view::npos;
    if (step == JsonExtent::Step::kDone) return i + 1;
  }
  return std::string_view::npos;
}

// `text` (surrounding whitespace allowed) as exactly one JSON object or array; nullopt when it is not.
std::optional<Json> parse_json_container(std::string_view text) {
  text = trim(text);
  if (text.empty() || json_container_end(text, 0) != text.size()) return std::nullopt;
  Json j = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

// Arguments as compact JSON: an object, null (none), or a string holding an object (some Hermes fine-tunes).
std::optional<std::string> arguments_text(const Json& args) {
  if (args.is_null()) return "{}";
  if (args.is_object()) return dump(args);
  if (args.is_string()) {
    std::optional<Json> inner = parse_json_container(args.get_ref<const std::string&>());
    if (inner && inner->is_object()) return dump(*inner);
  }
  return std::nullopt;
}

// {"name": "f", "arguments": {...}}; "parameters" is what Llama's templates ask for. llama3_json requires one of
// the two, so that a JSON answer such as {"name": "Ada"} stays content.
std::optional<ToolCall> call_from_json(const Json& j, bool require_arguments) {
  if (!j.is_object()) return std::nullopt;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get_ref<const std::string&>().empty()) return std::nullopt;
  auto args = j.find("arguments");
  if (args == j.end()) args = j.find("parameters");
  if (args == j.end()) {
    if (require_arguments) return std::nullopt;
    return ToolCall{name->get<std::string>(), "{}"};
  }
  std::optional<std::string> text = arguments_text(*args);
  if (!text) return std::nullopt;
  return ToolCall{name->get<std::string>(), std::move(*text)};
}

// The content between calls, for parsers that allow text around calls. Text is written through as soon as it
// is known; a run of text that is only whitespace is held, and dropped when it turns out to only separate a call
// from another call or from an end of the output (the newlines of "</tool_call>\n<tool_call>").
class ContentWriter {
 public:
  void text(std::string_view s, std::string& out) {
    if (s.empty()) return;
    if (!has_text_) {
      const size_t visible = skip_space(s, 0);
      if (visible == s.size()) {
        held_space_.append(s);
        return;
      }
      out += held_space_;
      held_space_.clear();
      has_text_ = true;
    }
    out.append(s);
  }

  void call() {
    held_space_.clear();
    has_text_ = false;
    after_call_ = true;
  }

  void finish(std::string& out) {
    if (!after_call_) out += held_space_;
    held_space_.clear();
  }

 private:
  std::string held_space_;  // whitespace since the last call (or the start), not yet known to be content
  bool has_text_ = false;   // the text since the last call has more than whitespace
  bool after_call_ = false;
};

// ---- hermes ----------------------------------------------------------------------------------------------

std::optional<ToolCall> hermes_call(std::string_view body) {
  std::optional<Json> j = parse_json_container(body);
  if (!j) return std::nullopt;
  return call_from_json(*j, /*require_arguments=*/false);
}

class HermesStream final : public ToolCallStream {
 public:
  ToolParseResult feed(std::string_view delta) override {
    ToolParseResult out;
    buf_.append(delta);
    size_t pos = 0;  // buf_[0, pos) is decided
    while (true) {
      if (!in_call_) {
        const size_t open = buf_.find(kHermesOpen, pos);
        if (open == std::string::npos) {
          const size_t keep = partial_marker_len(std::string_view(buf_).substr(pos), kHermesOpen);
          writer_.text(std::string_view(buf_).substr(pos, buf_.size() - pos - keep), out.content);
          pos = buf_.size() - keep;
          break;
        }
        writer_.text(std::string_view(buf_).substr(pos, open - pos), out.content);
        pos = open + kHermesOpen.size();
        in_call_ = true;
        close_scan_ = pos;
      } else {
        const size_t close = buf_.find(kHermesClose, close_scan_);
        if (close == std::string::npos) {
          // Next time, search only the new text and a possible partial "</tool_call>" before it.
          close_scan_ = std::max(pos, buf_.size() - std::min(buf_.size(), kHermesClose.size() - 1));
          break;
        }
        end_call(std::string_view(buf_).substr(pos, close - pos), /*closed=*/true, out);
        pos = close + kHermesClose.size();
        in_call_ = false;
      }
    }
    if (pos > 0) {
      buf_.erase(0, pos);
      if (in_call_) close_scan_ -= pos;
    }
    return out;
  }

  ToolParseResult finish() override {
    ToolParseResult out;
    if (in_call_)
      end_call(buf_, /*closed=*/false, out);
    else
      writer_.text(buf_, out.content);
    buf_.clear();
    in_call_ = false;
    writer_.finish(out.content);
    return out;
  }

 private:
  void end_call(std::string_view body, bool closed, ToolParseResult& out) {
    if (std::optional<ToolCall> call = hermes_call(body)) {
      writer_.call();
      out.calls.push_back(std::move(*call));
      return;
    }
    std::string raw = std::string(kHermesOpen);
    raw.append(body);
    if (closed) raw.append(kHermesClose);
    writer_.text(raw, out.content);
  }

  std::string buf_;  // outside a call: a possible partial "<tool_call>"; inside: the call's text so far
  bool in_call_ = false;
  size_t close_scan_ = 0;  // inside a call: where the search for "</tool_call>" resumes
  ContentWriter writer_;
};

// ---- mistral -----------------------------------------------------------------------------------------------

class MistralStream final : public ToolCallStream {
 public:
  ToolParseResult feed(std::string_view delta) override {
    ToolParseResult out;
    input_.append(delta);
    size_t pos = 0;  // input_[0, pos) is consumed
    while (pos < input_.size()) {
      if (state_ == State::kText) {
        const size_t open = input_.find(kMistralMarker, pos);
        if (open == std::string::npos) {
          const size_t keep = partial_marker_len(std::string_view(input_).substr(pos), kMistralMarker);
          writer_.text(std::string_view(input_).substr(pos, input_.size() - pos - keep), out.content);
          pos = input_.size() - keep;
          break;
        }
        writer_.text(std::string_view(input_).substr(pos, open - pos), out.content);
        pos = open + kMistralMarker.size();
        begin_block();
      } else {
        pos = scan_block(pos, out);
      }
    }
    input_.erase(0, pos);
    return out;
  }

  ToolParseResult finish() override {
    ToolParseResult out;
    if (state_ == State::kText)
      writer_.text(input_, out.content);
    else
      reject_block(out);  // unfinished
    input_.clear();
    writer_.finish(out.content);
    return out;
  }

 private:
  enum class State {
    kText,       // content, looking for [TOOL_CALLS]
    kStart,      // after [TOOL_CALLS]: a JSON list (or object) of calls, or a function name
    kName,       // name[ARGS]{...} or name{...}
    kArgsTag,    // inside "[ARGS]"
    kAwaitArgs,  // after "[ARGS]", before "{"
    kJsonCalls,  // [{"name": ..., "arguments": ...}, ...]
    kJsonArgs,   // the {...} after a name
  };

  void begin_block() {
    state_ = State::kStart;
    block_.clear();
    name_.clear();
    extent_ = JsonExtent();
  }

  // Consumes input_ from `pos` until the block is decided or the input runs out; returns the new position. A
  // byte the block cannot take is left for the text scan (it may start the next [TOOL_CALLS]).
  size_t scan_block(size_t pos, ToolParseResult& out) {
    for (; pos < input_.size(); ++pos) {
      const char c = input_[pos];
      switch (state_) {
        case State::kText:
          return pos;
        case State::kStart:
          if (is_space(c)) break;
          if (c == '[' || c == '{') {
            json_start_ = block_.size();
            state_ = State::kJsonCalls;
            extent_.push(c);
          } else if (is_mistral_name_char(c)) {
            state_ = State::kName;
            name_ += c;
          } else {
            reject_block(out);
            return pos;
          }
          break;
        case State::kName:
          if (is_mistral_name_char(c)) {
            name_ += c;
          } else if (c == kMistralArgs[0]) {
            state_ = State::kArgsTag;
            args_tag_matched_ = 1;
          } else if (c == '{') {
            json_start_ = block_.size();
            state_ = State::kJsonArgs;
            extent_.push(c);
          } else {
            reject_block(out);
            return pos;
          }
          break;
        case State::kArgsTag:
          if (c != kMistralArgs[args_tag_matched_]) {
            reject_block(out);
            return pos;
          }
          if (++args_tag_matched_ == kMistralArgs.size()) state_ = State::kAwaitArgs;
          break;
        case State::kAwaitArgs:
          if (is_space(c)) break;
          if (c != '{') {
            reject_block(out);
            return pos;
          }
          json_start_ = block_.size();
          state_ = State::kJsonArgs;
          extent_.push(c);
          break;
        case State::kJsonCalls:
        case State::kJsonArgs: {
          const JsonExtent::Step step = extent_.push(c);
          if (step == JsonExtent::Step::kError) {
            reject_block(out);
            return pos;
          }
          if (step == JsonExtent::Step::kDone) {
            block_ += c;
            end_block(out);
            return pos + 1;
          }
          break;
        }
      }
      block_ += c;
    }
    return pos;
  }

  void end_block(ToolParseResult& out) {
    std::vector<ToolCall> calls;
    std::optional<Json> j = parse_json_container(std::string_view(block_).substr(json_start_));
    if (j && state_ == State::kJsonArgs) {
      if (j->is_object()) calls.push_back(ToolCall{name_, dump(*j)});
    } else if (j && j->is_array()) {
      for (const Json& item : *j) {
        std::optional<ToolCall> call = call_from_json(item, /*require_arguments=*/false);
        if (!call) {
          calls.clear();
          break;
        }
        calls.push_back(std::move(*call));
      }
    } else if (j) {  // a lone call object, not in a list
      if (std::optional<ToolCall> call = call_from_json(*j, /*require_arguments=*/false))
        calls.push_back(std::move(*call));
    }
    if (calls.empty()) {
      reject_block(out);
      return;
    }
    writer_.call();
    for (ToolCall& call : calls) out.calls.push_back(std::move(call));
    state_ = State::kText;
  }

  // The block is not a call: it is content, marker included.
  void reject_block(ToolParseResult& out) {
    std::string raw = std::string(kMistralMarker);
    raw += block_;
    writer_.text(raw, out.content);
    state_ = State::kText;
  }

  std::string input_;  // unconsumed text: a possible partial "[TOOL_CALLS]" between feeds
  State state_ = State::kText;
  std::string block_;  // the text after [TOOL_CALLS] so far, returned as content if it proves malformed
  std::string name_;
  size_t args_tag_matched_ = 0;
  size_t json_start_ = 0;  // where the JSON starts in block_
  JsonExtent extent_;
  ContentWriter writer_;
};

// ---- whole-output parsers (llama3_json, pythonic) ----------------------------------------------------------

// The output is either only calls or only content. Its first characters decide whether it may be calls; then
// the whole output is held and parsed once at finish().
class WholeOutputStream : public ToolCallStream {
 public:
  ToolParseResult feed(std::string_view delta) override {
    ToolParseResult out;
    if (verdict_ == Verdict::kContent) {
      out.content.assign(delta);
      return out;
    }
    if (verdict_ == Verdict::kCalls) {
      held_.append(delta);
      return out;
    }
    for (size_t i = 0; i < delta.size(); ++i) {
      held_ += delta[i];
      verdict_ = look(delta[i]);
      if (verdict_ == Verdict::kUndecided) continue;
      held_.append(delta.substr(i + 1));
      if (verdict_ == Verdict::kContent) {
        out.content = std::move(held_);
        held_.clear();
      }
      break;
    }
    return out;
  }

  ToolParseResult finish() override {
    ToolParseResult out;
    if (verdict_ == Verdict::kCalls) {
      if (std::optional<std::vector<ToolCall>> calls = parse_calls(held_))
        out.calls = std::move(*calls);
      else
        out.content = std::move(held_);
    } else {
      out.content = std::move(held_);
    }
    held_.clear();
    return out;
  }

 protected:
  enum class Verdict { kUndecided, kCalls, kContent };
  // Takes the next byte of the output's beginning.
  virtual Verdict look(char c) = 0;
  // The calls the whole output holds; nullopt when it is not exactly a list of calls.
  virtual std::optional<std::vector<ToolCall>> parse_calls(std::string_view text) const = 0;

 private:
  Verdict verdict_ = Verdict::kUndecided;
  std::string held_;  // undecided or call output
};

// Matches an optional special-token prefix (e.g. "<|python_tag|>") byte by byte, with whitespace around it.
class PrefixTag {
 public:
  explicit PrefixTag(std::string_view tag) : tag_(tag) {}
  enum class Step { kMore, kDone, kNo };
  // kDone: `c` is the first byte after the leading whitespace and the tag (if any); kNo: the tag is broken.
  Step push(char c) {
    if (matched_ == 0 || matched_ == tag_.size()) {
      if (is_space(c)) return Step::kMore;
      if (matched_ == 0 && c == tag_[0]) {
        matched_ = 1;
        return Step::kMore;
      }
      return Step::kDone;
    }
    if (c != tag_[matched_]) return Step::kNo;
    ++matched_;
    return Step::kMore;
  }

 private:
  std::string_view tag_;
  size_t matched_ = 0;
};

// Skips leading whitespace and an optional `tag` with whitespace after it.
size_t skip_prefix_tag(std::string_view text, std::string_view tag) {
  size_t i = skip_space(text, 0);
  if (text.substr(i, tag.size()) == tag) i = skip_space(text, i + tag.size());
  return i;
}

class Llama3JsonStream final : public WholeOutputStream {
 protected:
  Verdict look(char c) override {
    switch (prefix_.push(c)) {
      case PrefixTag::Step::kMore:
        return Verdict::kUndecided;
      case PrefixTag::Step::kNo:
        return Verdict::kContent;
      case PrefixTag::Step::kDone:
        break;
    }
    return c == '{' ? Verdict::kCalls : Verdict::kContent;
  }

  std::optional<std::vector<ToolCall>> parse_calls(std::string_view text) const override {
    std::vector<ToolCall> calls;
    size_t i = skip_prefix_tag(text, kPythonTag);
    while (true) {
      if (i >= text.size() || text[i] != '{') return std::nullopt;
      const size_t end = json_container_end(text, i);
      if (end == std::string_view::npos) return std::nullopt;
      std::optional<Json> j = parse_json_container(text.substr(i, end - i));
      if (!j) return std::nullopt;
      std::optional<ToolCall> call = call_from_json(*j, /*require_arguments=*/true);
      if (!call) return std::nullopt;
      calls.push_back(std::move(*call));
      i = skip_space(text, end);
      if (i < text.size() && text[i] == ';') i = skip_space(text, i + 1);
      if (i == text.size()) return calls;
    }
  }

 private:
  PrefixTag prefix_{kPythonTag};
};

// ---- pythonic -----------------------------------------------------------------------------------------------

// A recursive-descent parser for the Python a model writes as a call list: [f(a=1, b='x'), g()]. Values are the
// literals vLLM's ast-based parser accepts (strings, numbers, True/False/None, lists, dicts), converted to JSON
// as json.dumps would. Anything else (positional arguments, names, tuples, sets) fails the whole list.
class PythonCallParser {
 public:
  PythonCallParser(std::string_view text, size_t pos) : s_(text), i_(pos) {}
  size_t pos() const { return i_; }

  bool call_list(std::vector<ToolCall>& calls) {
    if (!eat('[')) return false;
    const bool closed = items(']', [&] {
      ToolCall call;
      if (!function_call(call)) return false;
      calls.push_back(std::move(call));
      return true;
    });
    return closed && !calls.empty();  // "[]" calls nothing: not a call list
  }

 private:
  bool function_call(ToolCall& out) {
    space();
    if (!identifier(out.name)) return false;
    space();
    if (!eat('(')) return false;
    Json args = Json::object();
    const bool closed = items(')', [&] {
      std::string key;
      Json arg;
      if (!identifier(key)) return false;
      space();
      if (!eat('=')) return false;
      space();
      if (!value(arg, 1)) return false;
      if (args.contains(key)) return false;  // Python: "keyword argument repeated"
      args[key] = std::move(arg);
      return true;
    });
    if (!closed) return false;
    out.arguments = dump(args);
    return true;
  }

  bool value(Json& out, size_t depth) {
    if (depth > kMaxNesting || i_ >= s_.size()) return false;
    const char c = s_[i_];
    if (c == '\'' || c == '"') return strings(out);
    if (c == '[') return list(out, depth);
    if (c == '{') return dict(out, depth);
    if (c == '-' || c == '+') {
      ++i_;
      space();
      return number(out, c == '-');
    }
    if (is_digit(c) || c == '.') return number(out, false);
    std::string word;
    if (!identifier(word)) return false;
    if (word == "True") {
      out = true;
    } else if (word == "False") {
      out = false;
    } else if (word == "None") {
      out = nullptr;
    } else {
      return false;
    }
    return true;
  }

  // One string, or adjacent ones ('a' "b"), which Python joins.
  bool strings(Json& out) {
    std::string text;
    do {
      if (!string_literal(text)) return false;
      space();
    } while (i_ < s_.size() && (s_[i_] == '\'' || s_[i_] == '"'));
    out = std::move(text);
    return true;
  }

  // The comma-separated items after an opening bracket, through `close`; a
  // trailing comma is allowed, as in Python.
  template <class ParseItem>
  bool items(char close, ParseItem&& item) {
    space();
    if (eat(close)) return true;
    while (true) {
      if (!item()) return false;
      space();
      if (eat(',')) {
        space();
        if (eat(close)) return true;
        continue;
      }
      return eat(close);
    }
  }

  bool list(Json& out, size_t depth) {
    eat('[');
    out = Json::array();
    return items(']', [&] {
      Json item;
      if (!value(item, depth + 1)) return false;
      out.push_back(std::move(item));
      return true;
    });
  }

  bool dict(Json& out, size_t depth) {
    eat('{');
    out = Json::object();
    return items('}', [&] {
      Json key;
      Json item;
      if (!value(key, depth + 1)) return false;
      if (key.is_structured()) return false;  // unhashable in Python
      space();
      if (!eat(':')) return false;
      space();
      if (!value(item, depth + 1)) return false;
      // json.dumps writes non-string keys as their JSON text: 1 -> "1", True -> "true", None -> "null".
      out[key.is_string() ? key.get<std::string>() : dump(key)] = std::move(item);
      return true;
    });
  }

  bool number(Json& out, bool negative) {
    const size_t start = i_;
    int base = 10;
    if (i_ + 1 < s_.size() && s_[i_] == '0') {
      const char p = s_[i_ + 1] | 0x20;
      base = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 10;
      if (base != 10) i_ += 2;
    }
    std::string digits;  // without Python's digit-group underscores
    bool is_float = false;
    for (; i_ < s_.size(); ++i_) {
      const char c = s_[i_];
      const char lower = c | 0x20;
      if (c == '_' && !digits.empty() && i_ + 1 < s_.size() && is_ident_char(s_[i_ + 1])) continue;
      if (is_digit(c) || (base == 16 && lower >= 'a' && lower <= 'f')) {
        digits += c;
      } else if (base == 10 && c == '.' && !is_float) {
        is_float = true;
        digits += c;
      } else if (base == 10 && lower == 'e' && !digits.empty() && digits != ".") {
        is_float = true;
        digits += 'e';
        if (i_ + 1 < s_.size() && (s_[i_ + 1] == '+' || s_[i_ + 1] == '-')) digits += s_[++i_];
        if (i_ + 1 >= s_.size() || !is_digit(s_[i_ + 1])) return false;
      } else {
        break;
      }
    }
    if (i_ < s_.size() && is_ident_char(s_[i_])) return false;  // 1j, 12abc
    if (digits.empty() || digits == "." || i_ == start) return false;
    if (is_float) {
      // from_chars wants a digit before the exponent and takes "5." and ".5" as Python does.
      double v = 0;
      const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
      if (ec != std::errc() || end != digits.data() + digits.size() || !std::isfinite(v)) return false;
      out = negative ? -v : v;
      return true;
    }
    if (base == 10 && digits.size() > 1 && digits[0] == '0' && digits.find_first_not_of('0') != std::string::npos)
      return false;  // Python refuses leading zeros in decimal integers
    uint64_t v = 0;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v, base);
    if (ec == std::errc::result_out_of_range && base == 10) {
      // Beyond 64 bits: JSON numbers as doubles, as most JSON readers take them anyway.
      double d = 0;
      std::from_chars(digits.data(), digits.data() + digits.size(), d);
      out = negative ? -d : d;
      return true;
    }
    if (ec != std::errc() || end != digits.data() + digits.size()) return false;
    if (!negative) {
      out = v;
    } else if (v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) + 1) {
      out = v == 0 ? int64_t{0} : -static_cast<int64_t>(v - 1) - 1;
    } else {
      out = -static_cast<double>(v);
    }
    return true;
  }

  // A single- or double-quoted string, or a triple-quoted one, with Python's escapes; appends to `out`.
  bool string_literal(std::string& out) {
    const char quote = s_[i_];
    const std::string triple(3, quote);
    const bool is_triple = s_.substr(i_, 3) == triple;
    i_ += is_triple ? 3 : 1;
    while (i_ < s_.size()) {
      const char c = s_[i_];
      if (is_triple ? s_.substr(i_, 3) == triple : c == quote) {
        i_ += is_triple ? 3 : 1;
        return true;
      }
      if (c == '\n' && !is_triple) return false;
      if (c != '\\') {
        out += c;
        ++i_;
        continue;
      }
      if (i_ + 1 >= s_.size()) return false;
      const char e = s_[i_ + 1];
      i_ += 2;
      switch (e) {
        case '\n':  // line continuation
          break;
        case '\\':
        case '\'':
        case '"':
          out += e;
          break;
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'v':
          out += '\v';
          break;
        case 'a':
          out += '\a';
          break;
        case 'x':
          if (!code_point_escape(2, out)) return false;
          break;
        case 'u':
          if (!code_point_escape(4, out)) return false;
          break;
        case 'U':
          if (!code_point_escape(8, out)) return false;
          break;
        case 'N':
          return false;  // \N{NAME} would need the Unicode name table
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = static_cast<uint32_t>(e - '0');
            for (int n = 1; n < 3 && i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '7'; ++n)
              cp = cp * 8 + static_cast<uint32_t>(s_[i_++] - '0');
            append_utf8(out, cp);
          } else {  // Python keeps unknown escapes as written
            out += '\\';
            out += e;
          }
      }
    }
    return false;
  }

  bool code_point_escape(size_t hex_digits, std::string& out) {
    if (i_ + hex_digits > s_.size()) return false;
    uint32_t cp = 0;
    const auto [end, ec] = std::from_chars(s_.data() + i_, s_.data() + i_ + hex_digits, cp, 16);
    if (ec != std::errc() || end != s_.data() + i_ + hex_digits) return false;
    // Lone surrogates are valid Python but cannot be sent as UTF-8.
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i_ += hex_digits;
    append_utf8(out, cp);
    return true;
  }

  bool identifier(std::string& out) {
    if (i_ >= s_.size() || !is_ident_start(s_[i_])) return false;
    const size_t start = i_;
    while (i_ < s_.size() && is_ident_char(s_[i_])) ++i_;
    out.assign(s_.substr(start, i_ - start));
    return true;
  }

  // Inside brackets Python joins lines, so newlines are whitespace too.
  void space() { i_ = skip_space(s_, i_); }

  bool eat(char c) {
    if (i_ >= s_.size() || s_[i_] != c) return false;
    ++i_;
    return true;
  }

  std::string_view s_;
  size_t i_;
};

class PythonicStream final : public WholeOutputStream {
 protected:
  // The output may be calls while it reads: whitespace, <|python_start|>, "[", a name, "(".
  Verdict look(char c) override {
    switch (phase_) {
      case Phase::kPrefix:
        switch (prefix_.push(c)) {
          case PrefixTag::Step::kMore:
            return Verdict::kUndecided;
          case PrefixTag::Step::kNo:
            return Verdict::kContent;
          case PrefixTag::Step::kDone:
            break;
        }
        if (c != '[') return Verdict::kContent;
        phase_ = Phase::kList;
        return Verdict::kUndecided;
      case Phase::kList:
        if (is_space(c)) return Verdict::kUndecided;
        if (!is_ident_start(c)) return Verdict::kContent;
        phase_ = Phase::kName;
        return Verdict::kUndecided;
      case Phase::kName:
        if (is_ident_char(c)) return Verdict::kUndecided;
        if (c == '(') return Verdict::kCalls;
        if (!is_space(c)) return Verdict::kContent;
        phase_ = Phase::kAfterName;
        return Verdict::kUndecided;
      case Phase::kAfterName:
        if (is_space(c)) return Verdict::kUndecided;
        return c == '(' ? Verdict::kCalls : Verdict::kContent;
    }
    return Verdict::kContent;
  }

  std::optional<std::vector<ToolCall>> parse_calls(std::string_view text) const override {
    std::vector<ToolCall> calls;
    PythonCallParser parser(text, skip_prefix_tag(text, kPythonStart));
    if (!parser.call_list(calls)) return std::nullopt;
    const size_t end = skip_prefix_tag(text.substr(parser.pos()), kPythonEnd);
    if (parser.pos() + end != text.size()) return std::nullopt;
    return calls;
  }

 private:
  enum class Phase { kPrefix, kList, kName, kAfterName };
  Phase phase_ = Phase::kPrefix;
  PrefixTag prefix_{kPythonStart};
};

// ---- registry ------------------------------------------------------------------------------------------------

template <class Stream>
class StreamingToolParser final : public ToolParser {
 public:
  explicit StreamingToolParser(std::string name) : name_(std::move(name)) {}
  const std::string& name() const override { return name_; }
  std::unique_ptr<ToolCallStream> stream() const override { return std::make_unique<Stream>(); }

 private:
  std::string name_;
};

struct ToolParserEntry {
  const char* name;
  std::unique_ptr<ToolParser> (*make)(std::string name);
};

template <class Stream>
std::unique_ptr<ToolParser> make_parser(std::string name) {
  return std::make_unique<StreamingToolParser<Stream>>(std::move(name));
}

constexpr ToolParserEntry kToolParsers[] = {
    {"hermes", make_parser<HermesStream>},
    {"llama3_json", make_parser<Llama3JsonStream>},
    {"mistral", make_parser<MistralStream>},
    {"pythonic", make_parser<PythonicStream>},
};

}  // namespace

ToolParseResult ToolParser::parse(std::string_view text) const {
  std::unique_ptr<ToolCallStream> s = stream();
  ToolParseResult result = s->feed(text);
  result.append(s->finish());
  return result;
}

std::unique_ptr<ToolParser> make_tool_parser(const std::string& name) {
  for (const ToolParserEntry& entry : kToolParsers)
    if (name == entry.name) return entry.make(name);
  fail("unknown tool call parser '{}' (known: {})", name, fmt::join(tool_parser_names(), ", "));
}

std::vector<std::string> tool_parser_names() {
  std::vector<std::string> names;
  for (const ToolParserEntry& entry : kToolParsers) names.emplace_back(entry.name);
  return names;
}

}  // namespace pagellm::chat
