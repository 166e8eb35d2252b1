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

#include "tokenizer/jinja/ast.h"

namespace pagellm::jinja {

// Bounds that stop a hostile template with a clear error instead of hanging
// or exhausting memory.
struct Limits {
  uint64_t max_steps = 5'000'000;        // statements, expressions, loop iterations, bytes/256 produced
  size_t max_string_bytes = 64u << 20;   // any string, including the output
  size_t max_items = 1'000'000;          // any list the template builds
  int max_call_depth = 100;              // nested macro calls (a few KB of stack each)
};

struct RenderOptions {
  Limits limits;
  // strftime_now() formats this time instead of the local clock (tests).
  std::optional<std::tm> now;
};

class Template {
 public:
  // Parses once; throws SyntaxError (a pagellm::Error naming line and column).
  explicit Template(std::string_view source);
  Template(Template&&) noexcept = default;
  Template& operator=(Template&&) noexcept = default;

  // context: a dict value of variables. Throws pagellm::TemplateError for
  // raise_exception() and RenderError for other failures.
  std::string render(const Value& context, const RenderOptions& options = {}) const;

 private:
  Body body_;
};

}  // namespace pagellm::jinja
