// jinja2's builtin filters, tests and globals, transformers' additions
// (tojson with ensure_ascii=False and indent, raise_exception, strftime_now)
// and the methods of str / list / dict that ImmutableSandboxedEnvironment lets
// templates call.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chat/jinja/value.h"

namespace pagellm::jinja {

class Interpreter;

struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
};

// Binds CallArgs to a Python-style parameter list and reports misuse as
// TypeError the way CPython words it.
class ArgBinder {
 public:
  ArgBinder(std::string_view fn_name, const CallArgs& args, std::vector<std::string_view> params,
            size_t required = 0);
  const Value* get(size_t i) const { return bound_[i] ? &*bound_[i] : nullptr; }
  bool has(size_t i) const { return bound_[i].has_value(); }
  Value get_or(size_t i, Value fallback) const { return bound_[i] ? *bound_[i] : std::move(fallback); }
  int64_t get_int(size_t i, int64_t fallback) const;
  bool get_bool(size_t i, bool fallback) const;

 private:
  std::string fn_name_;
  std::vector<std::optional<Value>> bound_;
};

bool is_filter_name(std::string_view name);
bool is_test_name(std::string_view name);
Value apply_filter(Interpreter& in, std::string_view name, const Value& input, CallArgs& args);
bool apply_test(Interpreter& in, std::string_view name, const Value& input, CallArgs& args);

// Methods on builtin types. `kind` tells whether `name` is a method the
// sandbox allows, one it forbids (list.append, dict.update, ...) or neither.
enum class MethodKind { None, Safe, Unsafe };
MethodKind method_kind(const Value& obj, std::string_view name);
Value call_method(Interpreter& in, const Value& obj, std::string_view name, CallArgs& args);
Value bound_method(const Value& obj, std::string_view name);  // obj.name as a value

// `{% set ns.attr = v %}` on a namespace() object.
void set_namespace_attr(Object& ns, std::string_view name, Value v);

// Global functions: range, dict, namespace, cycler, joiner, raise_exception, strftime_now.
std::vector<std::pair<std::string, Value>> make_globals();

// printf-style `fmt % args` and str.format(), as Python does them.
std::string percent_format(Interpreter& in, std::string_view fmt, const Value& args, bool escape_args);
std::string brace_format(Interpreter& in, std::string_view fmt, const CallArgs& args, bool escape_args);

}  // namespace pagellm::jinja
