#include "chat/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "chat/jinja/text.h"

namespace pagellm::jinja {

// ---- limits -----------------------------------------------------------------

namespace {
thread_local ActiveLimits g_limits;
}

const ActiveLimits& active_limits() { return g_limits; }

LimitScope::LimitScope(size_t max_bytes, size_t max_items, uint64_t max_steps) : saved_(g_limits) {
  g_limits = ActiveLimits{max_bytes, max_items, max_steps, 0};
}

LimitScope::~LimitScope() { g_limits = saved_; }

void charge(uint64_t n) {
  g_limits.steps += n;
  if (g_limits.steps > g_limits.max_steps) {
    raise("ResourceLimitError", "template exceeded its work limit of " + std::to_string(g_limits.max_steps) +
                                    " steps (infinite or huge loop?)");
  }
}

void charge_scan(const Value& v) {
  if (v.is_string()) {
    charge_bytes(v.str().size());
  } else if (v.is_list()) {
    charge_items(v.items().size());
  } else if (v.is_dict()) {
    charge_items(v.dict().items.size());
  }
}

void raise_size_limit(const char* what, const char* unit, size_t size, size_t limit) {
  raise("ResourceLimitError", std::string("template ") + what + " of " + std::to_string(size) + " " + unit +
                                  " exceeds the limit of " + std::to_string(limit) + " " + unit);
}

// ---- construction -----------------------------------------------------------

namespace {

[[noreturn]] void raise_depth_limit() {
  raise("RecursionError", "template values nest deeper than the limit of " + std::to_string(kMaxDepth) + " levels");
}

}  // namespace

Value Value::string(std::string s, bool safe) {
  charge_bytes(s.size());
  Value v(Type::String);
  v.safe_ = safe;
  v.p_ = std::make_shared<std::string>(std::move(s));
  return v;
}

uint32_t Value::depth() const {
  if (type_ == Type::List) return list().depth;
  if (type_ == Type::Dict) return dict().depth;
  return 0;
}

Value Value::list(std::vector<Value> items, SeqKind kind) {
  auto data = std::make_shared<ListData>();
  data->items = std::move(items);
  data->kind = kind;
  return list(std::move(data));
}

Value Value::list(std::shared_ptr<const ListData> data) {
  if (data->items.size() > g_limits.max_items)
    raise_size_limit("list", "items", data->items.size(), g_limits.max_items);
  charge(data->items.size());
  uint32_t depth = 1;
  for (const Value& item : data->items) depth = std::max(depth, item.depth() + 1);
  if (depth > kMaxDepth) raise_depth_limit();
  if (depth != data->depth) {
    auto copy = std::make_shared<ListData>(*data);
    copy->depth = depth;
    data = std::move(copy);
  }
  Value v(Type::List);
  v.p_ = std::const_pointer_cast<ListData>(data);
  return v;
}

Value Value::dict(std::vector<std::pair<Value, Value>> items, bool unique_keys) {
  if (items.size() > g_limits.max_items) raise_size_limit("dict", "items", items.size(), g_limits.max_items);
  charge(items.size());
  auto data = std::make_shared<DictData>();
  data->items.reserve(items.size());
  uint32_t depth = 1;
  for (auto& [k, val] : items) {
    depth = std::max({depth, k.depth() + 1, val.depth() + 1});
    bool replaced = false;
    if (unique_keys) {
      data->items.emplace_back(std::move(k), std::move(val));
      continue;
    }
    // Literal dicts may repeat a key: the later value wins, the first position stays.
    if (items.size() <= 64 || !k.is_string()) {
      charge_items(data->items.size());  // a linear search: only small dicts and non-string keys
      for (auto& existing : data->items) {
        if (equal(existing.first, k)) {
          existing.second = std::move(val);
          replaced = true;
          break;
        }
      }
    } else if (const Value* found = data->find(k.str())) {
      const_cast<Value&>(*found) = std::move(val);
      replaced = true;
    }
    if (!replaced) {
      data->items.emplace_back(std::move(k), std::move(val));
      if (items.size() > 64 && data->items.back().first.is_string())
        data->str_index.emplace(data->items.back().first.str(), static_cast<uint32_t>(data->items.size() - 1));
    }
  }
  if (depth > kMaxDepth) raise_depth_limit();
  data->depth = depth;
  if (data->items.size() > 8 && data->str_index.empty()) {
    for (uint32_t i = 0; i < data->items.size(); ++i)
      if (data->items[i].first.is_string()) data->str_index.emplace(data->items[i].first.str(), i);
  }
  Value v(Type::Dict);
  v.p_ = std::move(data);
  return v;
}

Value Value::object(std::shared_ptr<Object> obj) {
  Value v(Type::Object);
  v.p_ = std::move(obj);
  return v;
}

Value Value::function(std::string name, NativeFn fn, std::string repr) {
  Value v(Type::Function);
  auto data = std::make_shared<FunctionData>();
  if (repr.empty()) repr = "<built-in function " + name + ">";
  data->name = std::move(name);
  data->repr = std::move(repr);
  data->fn = std::move(fn);
  v.p_ = std::move(data);
  return v;
}

Value Value::undefined(std::string message, bool security) {
  Value v(Type::Undefined);
  auto data = std::make_shared<UndefinedData>();
  data->message = std::move(message);
  data->security = security;
  v.p_ = std::move(data);
  return v;
}

const Value* DictData::find(std::string_view key) const {
  if (!str_index.empty()) {
    auto it = str_index.find(key);
    return it == str_index.end() ? nullptr : &items[it->second].second;
  }
  charge_items(items.size());
  for (const auto& [k, v] : items)
    if (k.is_string() && k.str() == key) return &v;
  return nullptr;
}

const Value* DictData::find(const Value& key) const {
  if (key.is_string()) return find(std::string_view(key.str()));
  charge_items(items.size());
  for (const auto& [k, v] : items)
    if (equal(k, key)) return &v;
  return nullptr;
}

size_t NameTable::position(std::string_view name) const {
  if (!index_.empty()) {
    auto it = index_.find(std::string(name));
    return it == index_.end() ? std::string::npos : it->second;
  }
  for (size_t i = 0; i < items_.size(); ++i)
    if (items_[i].first == name) return i;
  return std::string::npos;
}

const Value* NameTable::find(std::string_view name) const {
  const size_t i = position(name);
  return i == std::string::npos ? nullptr : &items_[i].second;
}

void NameTable::set(std::string_view name, Value v) {
  if (const size_t i = position(name); i != std::string::npos) {
    items_[i].second = std::move(v);
    return;
  }
  items_.emplace_back(std::string(name), std::move(v));
  if (!index_.empty()) {
    index_.emplace(items_.back().first, items_.size() - 1);
  } else if (items_.size() >= kIndexFrom) {
    for (size_t i = 0; i < items_.size(); ++i) index_.emplace(items_[i].first, i);
  }
}

// ---- errors -----------------------------------------------------------------

RenderError::RenderError(std::string py_type, std::string detail, int line)
    : Error(py_type + ": " + detail + (line > 0 ? " (template line " + std::to_string(line) + ")" : "")),
      py_type_(std::move(py_type)),
      detail_(std::move(detail)),
      line_(line) {}

void raise(std::string py_type, std::string detail) { throw RenderError(std::move(py_type), std::move(detail)); }

void raise_int_overflow(std::string_view op) {
  raise("OverflowError", "integer overflow in " + std::string(op) + " (template integers are 64-bit)");
}

void raise_undefined(const Value& undefined) {
  const UndefinedData* d = undefined.undefined_data();
  if (!d) raise("UndefinedError", "undefined value");
  raise(d->security ? "SecurityError" : "UndefinedError", d->message);
}

// ---- Python semantics ---------------------------------------------------------

std::string type_name(const Value& v) {
  switch (v.type()) {
    case Value::Type::Undefined: return "Undefined";
    case Value::Type::None: return "NoneType";
    case Value::Type::Bool: return "bool";
    case Value::Type::Int: return "int";
    case Value::Type::Float: return "float";
    case Value::Type::String: return v.is_safe() ? "Markup" : "str";
    case Value::Type::List:
      switch (v.seq_kind()) {
        case SeqKind::List: return "list";
        case SeqKind::Tuple: return "tuple";
        case SeqKind::Generator: return "generator";
        case SeqKind::Iterator: return "list_reverseiterator";
        case SeqKind::DictItems: return "dict_items";
        case SeqKind::DictKeys: return "dict_keys";
        case SeqKind::DictValues: return "dict_values";
        case SeqKind::Range: return "range";
      }
      return "list";
    case Value::Type::Dict: return "dict";
    case Value::Type::Object: {
      std::string t = v.object().type_repr();  // "module.Name object"
      t = t.substr(0, t.rfind(" object"));
      return t.substr(t.rfind('.') + 1);
    }
    case Value::Type::Function: return "function";
  }
  return "object";
}

std::string object_type_repr(const Value& v) {
  switch (v.type()) {
    case Value::Type::None: return "None";
    case Value::Type::Undefined: return "jinja2.runtime.Undefined object";
    case Value::Type::Object: return v.object().type_repr();
    case Value::Type::String:
      if (v.is_safe()) return "markupsafe.Markup object";
      return "str object";
    default: return type_name(v) + " object";
  }
}

bool truthy(const Value& v) {
  switch (v.type()) {
    case Value::Type::Undefined:
    case Value::Type::None: return false;
    case Value::Type::Bool: return v.as_bool();
    case Value::Type::Int: return v.as_int() != 0;
    case Value::Type::Float: return v.as_float() != 0.0;
    case Value::Type::String: return !v.str().empty();
    case Value::Type::List:
      if (v.seq_kind() == SeqKind::Generator || v.seq_kind() == SeqKind::Iterator) return true;
      return !v.items().empty();
    case Value::Type::Dict: return !v.dict().items.empty();
    case Value::Type::Object:
    case Value::Type::Function: return true;
  }
  return false;
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then CPython's layout rule: scientific when
  // the decimal exponent is < -4 or >= 16, fixed otherwise (always with a '.').
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string out;
  if (sci[0] == '-') {
    out.push_back('-');
    sci.erase(0, 1);
  }
  const size_t epos = sci.find('e');
  const int exp10 = std::atoi(sci.c_str() + epos + 1);
  std::string digits;
  for (size_t i = 0; i < epos; ++i)
    if (sci[i] != '.') digits.push_back(sci[i]);
  if (exp10 < -4 || exp10 >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char ebuf[16];
    std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    return out + ebuf;
  }
  if (exp10 < 0) {
    out += "0." + std::string(static_cast<size_t>(-exp10 - 1), '0') + digits;
  } else if (static_cast<size_t>(exp10) + 1 >= digits.size()) {
    out += digits + std::string(exp10 + 1 - digits.size(), '0') + ".0";
  } else {
    out += digits.substr(0, exp10 + 1) + "." + digits.substr(exp10 + 1);
  }
  return out;
}

// ---- printing ---------------------------------------------------------------

namespace {

// Containers and objects being printed on this thread, innermost last.
thread_local std::vector<const void*> g_printing;

}  // namespace

ReprGuard::ReprGuard(const void* identity) {
  reentered_ = std::find(g_printing.begin(), g_printing.end(), identity) != g_printing.end();
  if (reentered_) return;
  if (g_printing.size() >= kMaxReprDepth)
    raise("RecursionError", "template values print deeper than the limit of " + std::to_string(kMaxReprDepth) +
                                " levels");
  g_printing.push_back(identity);
}

ReprGuard::~ReprGuard() {
  if (!reentered_) g_printing.pop_back();
}

namespace {

void repr_into(std::string& out, const Value& v);

void check_text(const std::string& out) {
  if (out.size() > g_limits.max_bytes) raise_size_limit("string", "bytes", out.size(), g_limits.max_bytes);
}

void repr_seq(std::string& out, const std::vector<Value>& items, const char* open, const char* close,
              bool tuple) {
  out += open;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += ", ";
    repr_into(out, items[i]);
    check_text(out);
  }
  if (tuple && items.size() == 1) out += ",";
  out += close;
}

void repr_into(std::string& out, const Value& v) {
  switch (v.type()) {
    case Value::Type::Undefined: out += "Undefined"; return;
    case Value::Type::String:
      if (v.is_safe()) {
        out += "Markup(" + text::py_repr(v.str()) + ")";
      } else {
        out += text::py_repr(v.str());
      }
      return;
    case Value::Type::List: {
      const ListData& l = v.list();
      ReprGuard guard(&l);
      if (guard.reentered()) {
        out += l.kind == SeqKind::Tuple ? "(...)" : "[...]";
        return;
      }
      switch (l.kind) {
        case SeqKind::List: repr_seq(out, l.items, "[", "]", false); return;
        case SeqKind::Tuple: repr_seq(out, l.items, "(", ")", true); return;
        case SeqKind::Generator: out += "<generator object>"; return;
        case SeqKind::Iterator: out += "<list_reverseiterator object>"; return;
        case SeqKind::DictItems: repr_seq(out, l.items, "dict_items([", "])", false); return;
        case SeqKind::DictKeys: repr_seq(out, l.items, "dict_keys([", "])", false); return;
        case SeqKind::DictValues: repr_seq(out, l.items, "dict_values([", "])", false); return;
        case SeqKind::Range:
          out += "range(" + std::to_string(l.range_start) + ", " + std::to_string(l.range_stop);
          if (l.range_step != 1) out += ", " + std::to_string(l.range_step);
          out += ")";
          return;
      }
      return;
    }
    case Value::Type::Dict: {
      ReprGuard guard(&v.dict());
      if (guard.reentered()) {
        out += "{...}";
        return;
      }
      out += "{";
      bool first = true;
      for (const auto& [k, val] : v.dict().items) {
        if (!first) out += ", ";
        first = false;
        repr_into(out, k);
        out += ": ";
        repr_into(out, val);
        check_text(out);
      }
      out += "}";
      return;
    }
    case Value::Type::Object: out += v.object().repr(); return;
    case Value::Type::Function: out += v.function().repr; return;
    default: out += to_str(v); return;
  }
}

}  // namespace

std::string to_str(const Value& v) {
  switch (v.type()) {
    case Value::Type::Undefined: return {};
    case Value::Type::None: return "None";
    case Value::Type::Bool: return v.as_bool() ? "True" : "False";
    case Value::Type::Int: return std::to_string(v.as_int());
    case Value::Type::Float: return float_repr(v.as_float());
    case Value::Type::String: return v.str();
    default: {
      std::string out;
      repr_into(out, v);
      charge_bytes(out.size());
      return out;
    }
  }
}

std::string repr(const Value& v) {
  std::string out;
  repr_into(out, v);
  charge_bytes(out.size());
  return out;
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return a.as_int() == b.as_int();
    return a.as_float() == b.as_float();
  }
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case Value::Type::Undefined:
    case Value::Type::None: return true;
    case Value::Type::String:
      if (a.str().size() != b.str().size()) return false;
      charge_bytes(a.str().size());
      return a.str() == b.str();
    case Value::Type::List: {
      const ListData& x = a.list();
      const ListData& y = b.list();
      const bool seq_x = x.kind == SeqKind::List || x.kind == SeqKind::Tuple || x.kind == SeqKind::Range;
      if (!seq_x || x.kind != y.kind) return a.identity() == b.identity();
      if (x.items.size() != y.items.size()) return false;
      charge_items(x.items.size());
      for (size_t i = 0; i < x.items.size(); ++i)
        if (!equal(x.items[i], y.items[i])) return false;
      return true;
    }
    case Value::Type::Dict: {
      const DictData& x = a.dict();
      const DictData& y = b.dict();
      if (x.items.size() != y.items.size()) return false;
      charge_items(x.items.size());
      for (const auto& [k, v] : x.items) {
        const Value* other = y.find(k);
        if (!other || !equal(v, *other)) return false;
      }
      return true;
    }
    default: return a.identity() == b.identity();
  }
}

int compare(const Value& a, const Value& b, std::string_view op) {
  if (a.is_undefined()) raise_undefined(a);
  if (b.is_undefined()) raise_undefined(b);
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int() ? 1 : 0;
    const double x = a.as_float(), y = b.as_float();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    charge_bytes(std::min(a.str().size(), b.str().size()));
    const int c = a.str().compare(b.str());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_list() && b.is_list() && a.seq_kind() == b.seq_kind() &&
      (a.seq_kind() == SeqKind::List || a.seq_kind() == SeqKind::Tuple)) {
    const auto& x = a.items();
    const auto& y = b.items();
    charge_items(std::min(x.size(), y.size()));
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!equal(x[i], y[i])) return compare(x[i], y[i], op);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  std::string msg(1, '\'');
  msg += op;
  raise("TypeError", msg + "' not supported between instances of '" + type_name(a) + "' and '" +
                         type_name(b) + "'");
}

bool has_length(const Value& v) {
  switch (v.type()) {
    case Value::Type::Undefined:
    case Value::Type::String:
    case Value::Type::Dict: return true;
    case Value::Type::List: return v.seq_kind() != SeqKind::Generator && v.seq_kind() != SeqKind::Iterator;
    default: return false;
  }
}

int64_t length(const Value& v) {
  if (!has_length(v)) raise("TypeError", "object of type '" + type_name(v) + "' has no len()");
  switch (v.type()) {
    case Value::Type::String: return static_cast<int64_t>(text::length(v.str()));
    case Value::Type::List: return static_cast<int64_t>(v.items().size());
    case Value::Type::Dict: return static_cast<int64_t>(v.dict().items.size());
    default: return 0;
  }
}

bool is_iterable(const Value& v) {
  return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
}

std::vector<Value> iterate(const Value& v) {
  switch (v.type()) {
    case Value::Type::Undefined: return {};
    case Value::Type::String: {
      std::vector<Value> out;
      const std::string& s = v.str();
      if (s.size() > g_limits.max_items) {
        const size_t n = text::length(s);
        if (n > g_limits.max_items) raise_size_limit("string iteration", "characters", n, g_limits.max_items);
      }
      charge_items(s.size());
      for (size_t i = 0; i < s.size();) {
        const size_t b = i;
        text::next_cp(s, i);
        out.push_back(Value::string(s.substr(b, i - b)));
      }
      return out;
    }
    case Value::Type::List: charge_items(v.items().size()); return v.items();
    case Value::Type::Dict: {
      charge_items(v.dict().items.size());
      std::vector<Value> out;
      out.reserve(v.dict().items.size());
      for (const auto& kv : v.dict().items) out.push_back(kv.first);
      return out;
    }
    default: raise("TypeError", std::string(1, '\'') + type_name(v) + "' object is not iterable");
  }
}

bool contains(const Value& container, const Value& item) {
  switch (container.type()) {
    case Value::Type::Undefined: return false;
    case Value::Type::String:
      if (!item.is_string())
        raise("TypeError", "'in <string>' requires string as left operand, not " + type_name(item));
      charge_bytes(container.str().size());
      return container.str().find(item.str()) != std::string::npos;
    case Value::Type::List:
      charge_items(container.items().size());
      for (const Value& x : container.items())
        if (equal(x, item)) return true;
      return false;
    case Value::Type::Dict:
      if (item.is_list() || item.is_dict()) raise("TypeError", "unhashable type: '" + type_name(item) + "'");
      return container.dict().find(item) != nullptr;
    default: raise("TypeError", "argument of type '" + type_name(container) + "' is not iterable");
  }
}

// ---- JSON -------------------------------------------------------------------

namespace {

void json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out.push_back('"');
  char buf[16];
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        default:
          if (c < 0x20 || (ensure_ascii && c == 0x7F)) {
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            out += buf;
          } else {
            out.push_back(static_cast<char>(c));
          }
      }
      continue;
    }
    const size_t b = i;
    const char32_t cp = text::next_cp(s, i);
    if (!ensure_ascii) {
      out.append(s.substr(b, i - b));
    } else if (cp < 0x10000) {
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(cp));
      out += buf;
    } else {
      const char32_t v = cp - 0x10000;
      std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", static_cast<unsigned>(0xD800 + (v >> 10)),
                    static_cast<unsigned>(0xDC00 + (v & 0x3FF)));
      out += buf;
    }
  }
  out.push_back('"');
}

std::string json_float(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d < 0 ? "-Infinity" : "Infinity";
  return float_repr(d);
}

struct JsonWriter {
  const JsonOptions& opts;
  std::string out;

  void newline(int level) {
    out.push_back('\n');
    for (int i = 0; i < level; ++i) out += *opts.indent;
    check_text(out);
  }

  void write(const Value& v, int level) {
    switch (v.type()) {
      case Value::Type::None: out += "null"; return;
      case Value::Type::Bool: out += v.as_bool() ? "true" : "false"; return;
      case Value::Type::Int: out += std::to_string(v.as_int()); return;
      case Value::Type::Float: out += json_float(v.as_float()); return;
      case Value::Type::String:
        json_string(out, v.str(), opts.ensure_ascii);
        check_text(out);
        return;
      case Value::Type::List:
        if (v.seq_kind() == SeqKind::List || v.seq_kind() == SeqKind::Tuple) {
          write_list(v.items(), level);
          return;
        }
        break;
      case Value::Type::Dict: write_dict(v.dict(), level); return;
      default: break;
    }
    raise("TypeError", "Object of type " + type_name(v) + " is not JSON serializable");
  }

  void write_list(const std::vector<Value>& items, int level) {
    if (items.empty()) {
      out += "[]";
      return;
    }
    out.push_back('[');
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += opts.item_separator;
      if (opts.indent) newline(level + 1);
      write(items[i], level + 1);
    }
    if (opts.indent) newline(level);
    out.push_back(']');
  }

  static std::string key_text(const Value& k) {
    switch (k.type()) {
      case Value::Type::String: return k.str();
      case Value::Type::Bool: return k.as_bool() ? "true" : "false";
      case Value::Type::None: return "null";
      case Value::Type::Int: return std::to_string(k.as_int());
      case Value::Type::Float: return json_float(k.as_float());
      default:
        raise("TypeError", "keys must be str, int, float, bool or None, not " + type_name(k));
    }
  }

  void write_dict(const DictData& d, int level) {
    if (d.items.empty()) {
      out += "{}";
      return;
    }
    std::vector<const std::pair<Value, Value>*> order;
    for (const auto& kv : d.items) order.push_back(&kv);
    if (opts.sort_keys) {
      std::stable_sort(order.begin(), order.end(), [](auto* a, auto* b) { return compare(a->first, b->first, "<") < 0; });
    }
    out.push_back('{');
    for (size_t i = 0; i < order.size(); ++i) {
      if (i) out += opts.item_separator;
      if (opts.indent) newline(level + 1);
      json_string(out, key_text(order[i]->first), opts.ensure_ascii);
      out += opts.key_separator;
      write(order[i]->second, level + 1);
    }
    if (opts.indent) newline(level);
    out.push_back('}');
  }
};

}  // namespace

std::string to_json(const Value& v, const JsonOptions& opts) {
  JsonWriter w{opts, {}};
  w.write(v, 0);
  charge_bytes(w.out.size());
  return std::move(w.out);
}

}  // namespace pagellm::jinja
