// Values of the template language, modelled on the Python objects jinja2
// sees: None, bool, int, float, str (optionally Markup), list/tuple and the
// lazy sequences filters return, dict (insertion-ordered), jinja2's Undefined,
// objects (namespace, loop) and callables. Containers are immutable once
// built (ImmutableSandboxedEnvironment forbids list.append, dict.update, ...),
// so values share them freely; only namespaces are mutable.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/error.h"

namespace pagellm::jinja {

class Value;
class Interpreter;
struct CallArgs;

// How a sequence behaves in Python: what repr() prints, whether len() and
// indexing work and how truthiness is decided.
enum class SeqKind : uint8_t {
  List,
  Tuple,
  Generator,   // map/select/...: no len(), always truthy
  Iterator,    // reversed(list)
  DictItems,   // dict.items(): len() works, not indexable
  DictKeys,
  DictValues,
  Range,
};

struct ListData {
  std::vector<Value> items;
  SeqKind kind = SeqKind::List;
  uint32_t depth = 1;                       // nesting depth, bounded (see kMaxDepth)
  int64_t range_start = 0, range_stop = 0, range_step = 1;  // for repr of range()
};

struct DictData {
  std::vector<std::pair<Value, Value>> items;  // insertion order
  uint32_t depth = 1;
  std::unordered_map<std::string_view, uint32_t> str_index;  // built for large dicts

  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
};

// Namespace, loop context, cycler, joiner: attribute access by name.
class Object {
 public:
  virtual ~Object() = default;
  virtual std::string repr() const = 0;
  virtual std::string type_repr() const = 0;  // jinja2's object_type_repr, e.g. "jinja2.utils.Namespace object"
  virtual std::optional<Value> get_attr(std::string_view name) const = 0;
  virtual bool is_namespace() const { return false; }
  virtual bool is_callable() const { return false; }
  // Breaks reference cycles at the end of a render (objects can hold themselves).
  virtual void clear() {}
};

using NativeFn = std::function<Value(Interpreter&, CallArgs&)>;

struct FunctionData {
  std::string name;
  std::string repr;  // what printing it shows
  NativeFn fn;
};

struct UndefinedData {
  std::string message;    // the UndefinedError text when used
  bool security = false;  // an unsafe attribute: using it raises SecurityError
};

class Value {
 public:
  enum class Type : uint8_t { Undefined, None, Bool, Int, Float, String, List, Dict, Object, Function };

  Value() = default;  // plain Undefined
  static Value none() { return Value(Type::None); }
  static Value boolean(bool b) {
    Value v(Type::Bool);
    v.b_ = b;
    return v;
  }
  static Value integer(int64_t i) {
    Value v(Type::Int);
    v.i_ = i;
    return v;
  }
  static Value number(double f) {
    Value v(Type::Float);
    v.f_ = f;
    return v;
  }
  static Value string(std::string s, bool safe = false);
  static Value list(std::vector<Value> items, SeqKind kind = SeqKind::List);
  static Value list(std::shared_ptr<const ListData> data);
  // unique_keys: the caller guarantees no key repeats (e.g. parsed JSON).
  static Value dict(std::vector<std::pair<Value, Value>> items, bool unique_keys = false);
  static Value object(std::shared_ptr<Object> obj);
  static Value function(std::string name, NativeFn fn, std::string repr = {});
  static Value undefined(std::string message, bool security = false);

  Type type() const { return type_; }
  bool is_undefined() const { return type_ == Type::Undefined; }
  bool is_none() const { return type_ == Type::None; }
  bool is_bool() const { return type_ == Type::Bool; }
  bool is_int() const { return type_ == Type::Int; }
  bool is_float() const { return type_ == Type::Float; }
  bool is_number() const { return type_ == Type::Int || type_ == Type::Float || type_ == Type::Bool; }
  bool is_integral() const { return type_ == Type::Int || type_ == Type::Bool; }
  bool is_string() const { return type_ == Type::String; }
  bool is_list() const { return type_ == Type::List; }
  bool is_dict() const { return type_ == Type::Dict; }
  bool is_object() const { return type_ == Type::Object; }
  bool is_function() const { return type_ == Type::Function; }
  bool is_safe() const { return type_ == Type::String && safe_; }  // markupsafe.Markup

  bool as_bool() const { return b_; }
  int64_t as_int() const { return type_ == Type::Bool ? (b_ ? 1 : 0) : i_; }
  double as_float() const { return type_ == Type::Float ? f_ : static_cast<double>(as_int()); }
  const std::string& str() const { return *static_cast<const std::string*>(p_.get()); }
  const ListData& list() const { return *static_cast<const ListData*>(p_.get()); }
  SeqKind seq_kind() const { return list().kind; }
  const std::vector<Value>& items() const { return list().items; }
  const DictData& dict() const { return *static_cast<const DictData*>(p_.get()); }
  Object& object() const { return *static_cast<Object*>(p_.get()); }
  std::shared_ptr<Object> object_ptr() const { return std::static_pointer_cast<Object>(p_); }
  const FunctionData& function() const { return *static_cast<const FunctionData*>(p_.get()); }
  const UndefinedData* undefined_data() const { return static_cast<const UndefinedData*>(p_.get()); }
  const void* identity() const { return p_.get(); }  // for the `sameas` test
  uint32_t depth() const;

 private:
  explicit Value(Type t) : type_(t) {}
  Type type_ = Type::Undefined;
  bool safe_ = false;
  union {
    bool b_;
    int64_t i_ = 0;
    double f_;
  };
  std::shared_ptr<void> p_;
};

// Names -> values in insertion order (frames, namespaces): a vector for the
// usual handful of names, plus a hash index once there are many, so that a
// context or namespace(**kwargs) with 100k names still costs O(1) a lookup.
class NameTable {
 public:
  const Value* find(std::string_view name) const;
  void set(std::string_view name, Value v);
  const std::vector<std::pair<std::string, Value>>& items() const { return items_; }
  void clear() {
    items_.clear();
    index_.clear();
  }

 private:
  static constexpr size_t kIndexFrom = 16;
  size_t position(std::string_view name) const;  // npos when absent
  std::vector<std::pair<std::string, Value>> items_;
  std::unordered_map<std::string, size_t> index_;  // built once items_ reaches kIndexFrom
};

// Containers nested deeper than this are refused, so that printing,
// comparing and destroying them cannot exhaust the stack.
inline constexpr uint32_t kMaxDepth = 500;

// The bounds of the render running on this thread: the size of any one
// string or list, and the work budget that the interpreter and value-level
// code (containers, comparisons, repr, JSON) both draw on, so that no single
// operation can do unbounded work for one step. A render installs its Limits
// with LimitScope; outside one everything is unbounded.
struct ActiveLimits {
  size_t max_bytes = SIZE_MAX;
  size_t max_items = SIZE_MAX;
  uint64_t max_steps = UINT64_MAX;
  uint64_t steps = 0;
};
const ActiveLimits& active_limits();
class LimitScope {
 public:
  LimitScope(size_t max_bytes, size_t max_items, uint64_t max_steps);
  ~LimitScope();
  LimitScope(const LimitScope&) = delete;
  LimitScope& operator=(const LimitScope&) = delete;

 private:
  ActiveLimits saved_;
};
// Counts n steps of work; raises ResourceLimitError past max_steps. A step is
// an expression or statement, 64 bytes produced, copied or scanned (string
// functions decode to code points at ~4 ns a byte), 16 items scanned, or one
// item of a new list or dict: what a render can allocate is bounded too
// (5M steps: at most ~320 MB of strings and 5M list items).
void charge(uint64_t n);
inline void charge_bytes(size_t n) { charge(n / 64); }
inline void charge_items(size_t n) { charge(n / 16); }
// Charges one pass over v (a string's bytes, a list's or dict's items): what a
// builtin may do with its input or arguments, however cheap it looks.
void charge_scan(const Value& v);
// a * b, or SIZE_MAX when that overflows: sizes checked against a limit.
inline size_t mul_sat(size_t a, uint64_t b) {
  size_t r = 0;
  return __builtin_mul_overflow(a, b, &r) ? SIZE_MAX : r;
}
// ResourceLimitError "template <what> of <size> <unit> exceeds the limit of <limit> <unit>".
[[noreturn]] void raise_size_limit(const char* what, const char* unit, size_t size, size_t limit);

// Printing (str, repr) of a container or object: values can reach themselves
// through namespaces, so one already being printed on this thread prints as
// Python's "[...]" / "{...}" (reentered()), and printing nested deeper than
// kMaxReprDepth (possible through objects) raises RecursionError.
inline constexpr size_t kMaxReprDepth = 2 * kMaxDepth;
class ReprGuard {
 public:
  explicit ReprGuard(const void* identity);
  ~ReprGuard();
  ReprGuard(const ReprGuard&) = delete;
  ReprGuard& operator=(const ReprGuard&) = delete;
  bool reentered() const { return reentered_; }

 private:
  bool reentered_ = false;
};

// A Python exception raised while rendering (TypeError, UndefinedError, ...).
class RenderError : public Error {
 public:
  RenderError(std::string py_type, std::string detail, int line = 0);
  const std::string& py_type() const { return py_type_; }
  const std::string& detail() const { return detail_; }
  int line() const { return line_; }

 private:
  std::string py_type_, detail_;
  int line_;
};

[[noreturn]] void raise(std::string py_type, std::string detail);
// OverflowError "integer overflow in <op>": template integers are 64-bit,
// where Python's would grow.
[[noreturn]] void raise_int_overflow(std::string_view op);
[[noreturn]] void raise_undefined(const Value& undefined);  // UndefinedError / SecurityError

// ---- Python semantics -------------------------------------------------------

std::string type_name(const Value& v);         // type(v).__name__
std::string object_type_repr(const Value& v);  // "dict object", "None", ...
bool truthy(const Value& v);
std::string to_str(const Value& v);  // str(v); Undefined prints as ""
std::string repr(const Value& v);
std::string float_repr(double d);    // repr(float)
bool equal(const Value& a, const Value& b);
// Three-way comparison for <, <=, >, >=; raises TypeError for unorderable types.
int compare(const Value& a, const Value& b, std::string_view op);
// len(v); raises TypeError when v has no len().
int64_t length(const Value& v);
bool has_length(const Value& v);
// Elements iter(v) yields (dict: keys, str: characters); raises TypeError
// "'x' object is not iterable". Undefined iterates as empty.
std::vector<Value> iterate(const Value& v);
bool is_iterable(const Value& v);
bool contains(const Value& container, const Value& item);  // `item in container`

// ---- JSON -------------------------------------------------------------------

struct JsonOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;  // json.dumps(indent=...): spaces or the given string
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
};
// json.dumps(v, ...) as Python's json module writes it.
std::string to_json(const Value& v, const JsonOptions& opts);

}  // namespace pagellm::jinja
