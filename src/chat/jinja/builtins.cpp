#include "chat/jinja/builtins.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <unordered_map>

#include "chat/jinja/errors.h"
#include "chat/jinja/interpreter.h"
#include "chat/jinja/text.h"

namespace pagellm::jinja {

// ---- argument binding ---------------------------------------------------------------

ArgBinder::ArgBinder(std::string_view fn_name, const CallArgs& args, std::vector<std::string_view> params,
                     size_t required)
    : fn_name_(fn_name), bound_(params.size()) {
  if (args.args.size() > params.size())
    raise("TypeError", fn_name_ + "() takes at most " + std::to_string(params.size()) + " argument(s) (" +
                           std::to_string(args.args.size()) + " given)");
  for (size_t i = 0; i < args.args.size(); ++i) bound_[i] = args.args[i];
  for (const auto& [k, v] : args.kwargs) {
    auto it = std::find(params.begin(), params.end(), k);
    if (it == params.end()) raise("TypeError", fn_name_ + "() got an unexpected keyword argument " + text::py_repr(k));
    const size_t i = static_cast<size_t>(it - params.begin());
    if (bound_[i]) raise("TypeError", fn_name_ + "() got multiple values for argument " + text::py_repr(k));
    bound_[i] = v;
  }
  for (size_t i = 0; i < required; ++i)
    if (!bound_[i])
      raise("TypeError", fn_name_ + "() missing required argument " + text::py_repr(params[i]));
}

int64_t ArgBinder::get_int(size_t i, int64_t fallback) const {
  if (!bound_[i] || bound_[i]->is_none()) return fallback;
  if (!bound_[i]->is_integral())
    raise("TypeError", "'" + type_name(*bound_[i]) + "' object cannot be interpreted as an integer");
  return bound_[i]->as_int();
}

bool ArgBinder::get_bool(size_t i, bool fallback) const { return bound_[i] ? truthy(*bound_[i]) : fallback; }

namespace {

// ---- helpers ------------------------------------------------------------------------

// jinja2's soft_str: strings (and Markup) stay, everything else becomes str(v).
std::string soft_str(const Value& v) { return v.is_string() ? v.str() : to_str(v); }
Value same_safety(const Value& input, std::string s) { return Value::string(std::move(s), input.is_safe()); }

const std::string* opt_str(const Value* v, const char* what) {
  if (!v || v->is_none()) return nullptr;
  if (!v->is_string()) raise("TypeError", std::string(what) + " arg must be None or str");
  return &v->str();
}

const std::string& need_str(const Value& v, const char* fn) {
  if (!v.is_string())
    raise("TypeError", std::string(fn) + "() argument must be str, not " + type_name(v));
  return v.str();
}

// snprintf of one double into a string as long as it needs (a 1e300 with
// 300 decimals has 600 digits).
std::string format_double(const std::string& fmt, double d) {
  const int n = std::snprintf(nullptr, 0, fmt.c_str(), d);
  if (n <= 0) return {};
  std::string out(static_cast<size_t>(n) + 1, '\0');
  std::snprintf(out.data(), out.size(), fmt.c_str(), d);
  out.resize(static_cast<size_t>(n));
  return out;
}

Value generator(std::vector<Value> items) { return Value::list(std::move(items), SeqKind::Generator); }

// str.replace with the result size checked before it is built.
std::string checked_replace(Interpreter& in, const std::string& s, const std::string& old_s, const std::string& new_s,
                            int64_t count) {
  size_t n = 0;
  if (old_s.empty()) {
    n = text::length(s) + 1;
  } else {
    for (size_t p = s.find(old_s); p != std::string::npos; p = s.find(old_s, p + old_s.size())) ++n;
  }
  if (count >= 0) n = std::min(n, static_cast<size_t>(count));
  if (new_s.size() > old_s.size()) in.check_string(s.size() + mul_sat(n, new_s.size() - old_s.size()));
  charge_bytes(s.size());
  return text::replace(s, old_s, new_s, count);
}

// A width / count argument that will size a string or list.
int64_t checked_size_arg(Interpreter& in, int64_t n) {
  if (n > 0) in.check_string(static_cast<size_t>(n));
  return n;
}

// jinja2's make_attrgetter: "a.b.0" looks up each part with sandboxed getitem.
std::vector<Value> attribute_parts(const Value& attribute) {
  std::vector<Value> parts;
  if (attribute.is_none() || attribute.is_undefined()) return parts;
  if (!attribute.is_string()) return {attribute};
  std::string s = attribute.str();
  size_t start = 0;
  while (true) {
    const size_t dot = s.find('.', start);
    std::string part = s.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool digits = !part.empty() && part.size() <= 18 &&
                        std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    parts.push_back(digits ? Value::integer(std::stoll(part)) : Value::string(part));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return parts;
}

Value lookup_parts(Interpreter& in, Value item, const std::vector<Value>& parts, const Value* fallback = nullptr) {
  for (const Value& p : parts) {
    item = in.getitem(item, p);
    if (fallback && item.is_undefined()) item = *fallback;
  }
  return item;
}

Value ignore_case(const Value& v) { return v.is_string() ? Value::string(text::lower(v.str())) : v; }

bool less(const Value& a, const Value& b) { return compare(a, b, "<") < 0; }

// Python's str.islower()/isupper(): some cased character, none of the other case.
bool str_is_case(const std::string& s, bool want_lower) {
  bool cased = false;
  for (size_t i = 0; i < s.size();) {
    const char32_t c = text::next_cp(s, i);
    if (want_lower ? text::is_upper_cp(c) : text::is_lower_cp(c)) return false;
    if (want_lower ? text::is_lower_cp(c) : text::is_upper_cp(c)) cased = true;
  }
  return cased;
}

// Python int(str, base) rules: whitespace, sign, optional prefix, underscores between digits.
std::optional<int64_t> parse_py_int(std::string_view s, int base) {
  std::string t = text::strip(s, nullptr, true, true);
  size_t i = 0;
  bool neg = false;
  if (i < t.size() && (t[i] == '+' || t[i] == '-')) neg = t[i++] == '-';
  auto has_prefix = [&](char p) {
    return i + 1 < t.size() && t[i] == '0' && (t[i + 1] | 0x20) == p;
  };
  if (base == 0) {
    if (has_prefix('x')) base = 16;
    else if (has_prefix('o')) base = 8;
    else if (has_prefix('b')) base = 2;
    else base = 10;
    if (base != 10) i += 2;
  } else if ((base == 16 && has_prefix('x')) || (base == 8 && has_prefix('o')) || (base == 2 && has_prefix('b'))) {
    i += 2;
    if (i < t.size() && t[i] == '_') ++i;
  }
  if (base < 2 || base > 36 || i >= t.size()) return std::nullopt;
  uint64_t v = 0;
  bool prev_digit = false;
  for (; i < t.size(); ++i) {
    const char c = t[i];
    if (c == '_') {
      if (!prev_digit || i + 1 >= t.size()) return std::nullopt;
      prev_digit = false;
      continue;
    }
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') d = (c | 0x20) - 'a' + 10;
    else return std::nullopt;
    if (d >= base) return std::nullopt;
    if (v > (static_cast<uint64_t>(INT64_MAX) + 1 - static_cast<uint64_t>(d)) / static_cast<uint64_t>(base))
      raise("OverflowError", "integer too large");
    v = v * static_cast<uint64_t>(base) + static_cast<uint64_t>(d);
    prev_digit = true;
  }
  if (!prev_digit) return std::nullopt;
  if (!neg && v > static_cast<uint64_t>(INT64_MAX)) raise("OverflowError", "integer too large");
  // -v in uint64 (defined for v == 2**63), converted: INT64_MIN needs no negation in int64.
  return neg ? static_cast<int64_t>(0 - v) : static_cast<int64_t>(v);
}

// Python float(str): decimal literal, inf/infinity/nan, underscores between digits.
std::optional<double> parse_py_float(std::string_view s) {
  std::string t = text::strip(s, nullptr, true, true);
  std::string clean;
  size_t i = 0;
  if (i < t.size() && (t[i] == '+' || t[i] == '-')) clean.push_back(t[i++]);
  std::string rest = text::lower(t.substr(i));
  if (rest == "inf" || rest == "infinity" || rest == "nan") return std::strtod((clean + rest).c_str(), nullptr);
  bool digits = false, dot = false, exp = false;
  for (; i < t.size(); ++i) {
    const char c = t[i];
    if (c >= '0' && c <= '9') {
      digits = true;
      clean.push_back(c);
    } else if (c == '_') {
      if (i == 0 || i + 1 >= t.size() || !(t[i - 1] >= '0' && t[i - 1] <= '9') || !(t[i + 1] >= '0' && t[i + 1] <= '9'))
        return std::nullopt;
    } else if (c == '.' && !dot && !exp) {
      dot = true;
      clean.push_back(c);
    } else if ((c == 'e' || c == 'E') && digits && !exp) {
      exp = true;
      clean.push_back('e');
      if (i + 1 < t.size() && (t[i + 1] == '+' || t[i + 1] == '-')) clean.push_back(t[++i]);
      if (i + 1 >= t.size()) return std::nullopt;
      digits = false;
    } else {
      return std::nullopt;
    }
  }
  if (!digits) return std::nullopt;
  return std::strtod(clean.c_str(), nullptr);
}

// Python's round(x, ndigits) for floats: correctly rounded, ties to even.
double py_round(double x, int64_t ndigits) {
  if (!std::isfinite(x)) return x;
  if (ndigits >= 0 && ndigits <= 300) {
    return std::strtod(format_double("%." + std::to_string(ndigits) + "f", x).c_str(), nullptr);
  }
  if (ndigits > 300) return x;
  if (ndigits < -308) return std::copysign(0.0, x);  // 10**-ndigits is inf; |x| < 1.8e308 rounds to 0
  const double p = std::pow(10.0, -static_cast<double>(ndigits));
  return std::nearbyint(x / p) * p;
}

int64_t py_round_int(int64_t x, int64_t ndigits) {
  if (ndigits >= 0) return x;
  if (ndigits < -18) {
    // 10**-ndigits > |x|: the result is 0, or +-10**19 (beyond int64) when ndigits is -19 and |x| > 5e18.
    const uint64_t magnitude = x < 0 ? 0 - static_cast<uint64_t>(x) : static_cast<uint64_t>(x);
    if (ndigits == -19 && magnitude > 5'000'000'000'000'000'000ull) raise_int_overflow("round");
    return 0;
  }
  int64_t p = 1;
  for (int64_t i = 0; i < -ndigits; ++i) p *= 10;
  int64_t q = x / p, r = x % p;
  if (r < 0) {
    r += p;
    --q;
  }
  if (2 * r > p || (2 * r == p && (q % 2 != 0))) ++q;
  int64_t out = 0;
  if (__builtin_mul_overflow(q, p, &out)) raise_int_overflow("round");
  return out;
}

// ---- objects: namespace, cycler -------------------------------------------------------

class Namespace : public Object {
 public:
  NameTable attrs;

  std::string repr() const override {
    ReprGuard guard(this);
    if (guard.reentered()) return "<Namespace {...}>";
    std::vector<std::pair<Value, Value>> items;
    for (const auto& [k, v] : attrs.items()) items.emplace_back(Value::string(k), v);
    return "<Namespace " + jinja::repr(Value::dict(std::move(items), true)) + ">";
  }
  std::string type_repr() const override { return "jinja2.utils.Namespace object"; }
  bool is_namespace() const override { return true; }
  void clear() override { attrs.clear(); }
  std::optional<Value> get_attr(std::string_view name) const override {
    if (const Value* v = attrs.find(name)) return *v;
    return std::nullopt;
  }
  void set(std::string_view name, Value v) { attrs.set(name, std::move(v)); }
};

class Cycler : public Object {
 public:
  explicit Cycler(std::vector<Value> items) : items_(std::move(items)) {}
  std::string repr() const override { return "<jinja2.utils.Cycler object>"; }
  std::string type_repr() const override { return "jinja2.utils.Cycler object"; }
  std::optional<Value> get_attr(std::string_view name) const override {
    auto self = const_cast<Cycler*>(this);
    if (name == "items") return Value::list(items_);
    if (name == "current") return items_[pos_];
    if (name == "next" || name == "__next__")
      return Value::function("next", [self](Interpreter&, CallArgs&) {
        Value v = self->items_[self->pos_];
        self->pos_ = (self->pos_ + 1) % self->items_.size();
        return v;
      });
    if (name == "reset")
      return Value::function("reset", [self](Interpreter&, CallArgs&) {
        self->pos_ = 0;
        return Value::none();
      });
    return std::nullopt;
  }

 private:
  std::vector<Value> items_;
  size_t pos_ = 0;
};

// dict(*args, **kwargs) as Python builds it.
std::vector<std::pair<Value, Value>> dict_items_from(const CallArgs& args, const char* fn) {
  if (args.args.size() > 1)
    raise("TypeError", std::string(fn) + " expected at most 1 argument, got " + std::to_string(args.args.size()));
  std::vector<std::pair<Value, Value>> items;
  if (!args.args.empty()) {
    const Value& src = args.args[0];
    if (src.is_dict()) {
      items = src.dict().items;
    } else {
      if (src.is_undefined()) raise_undefined(src);
      for (const Value& pair : iterate(src)) {
        const std::vector<Value> kv = iterate(pair);
        if (kv.size() != 2)
          raise("ValueError", "dictionary update sequence element has length " + std::to_string(kv.size()) +
                                  "; 2 is required");
        items.emplace_back(kv[0], kv[1]);
      }
    }
  }
  for (const auto& [k, v] : args.kwargs) items.emplace_back(Value::string(k), v);
  return items;
}

// ---- str / list / dict methods ---------------------------------------------------------

// Python's slice-index adjustment for str.find/count/startswith: negative
// indices count from the end; `end` is clamped to the length, `start` only below.
struct CpRange {
  int64_t begin, end;
};
CpRange resolve_range(size_t len, const Value* start, const Value* end) {
  auto idx = [&](const Value* v, int64_t dflt) {
    if (!v || v->is_none()) return dflt;
    if (!v->is_integral()) raise("TypeError", "slice indices must be integers or None or have an __index__ method");
    int64_t x = v->as_int();
    if (x < 0) x = std::max<int64_t>(0, x + static_cast<int64_t>(len));
    return x;
  };
  return {idx(start, 0), std::min<int64_t>(idx(end, static_cast<int64_t>(len)), static_cast<int64_t>(len))};
}

std::u32string_view range_view(const std::u32string& u, CpRange r) {
  if (r.end <= r.begin) return {};
  return std::u32string_view(u).substr(static_cast<size_t>(r.begin), static_cast<size_t>(r.end - r.begin));
}

int64_t str_find(const std::string& s, const std::string& sub, const Value* start, const Value* end, bool reverse) {
  const std::u32string u = text::to_u32(s), su = text::to_u32(sub);
  const CpRange r = resolve_range(u.size(), start, end);
  if (r.end - r.begin < static_cast<int64_t>(su.size())) return -1;
  const std::u32string_view hay = range_view(u, r);
  const size_t pos = reverse ? hay.rfind(su) : hay.find(su);
  return pos == std::u32string_view::npos ? -1 : r.begin + static_cast<int64_t>(pos);
}

Value str_method(Interpreter& in, const Value& self, std::string_view name, CallArgs& args) {
  const std::string& s = self.str();
  const bool safe = self.is_safe();
  auto out = [&](std::string r) { return Value::string(std::move(r), safe); };
  auto esc = [&](const Value& v) { return safe && !v.is_safe() ? text::html_escape(soft_str(v)) : soft_str(v); };
  auto none_args = [&] { ArgBinder b(name, args, {}); };

  if (name == "lower" || name == "casefold") return none_args(), out(text::lower(s));
  if (name == "upper") return none_args(), out(text::upper(s));
  if (name == "title") return none_args(), out(text::title(s));
  if (name == "capitalize") return none_args(), out(text::capitalize(s));
  if (name == "swapcase") return none_args(), out(text::swapcase(s));
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    ArgBinder b(name, args, {"chars"});
    return out(text::strip(s, opt_str(b.get(0), name.data()), name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    ArgBinder b(name, args, {"sep", "maxsplit"});
    const std::string* sep = opt_str(b.get(0), "sep");
    if (sep && sep->empty()) raise("ValueError", "empty separator");
    // At most max_items splits: more parts than that are refused anyway, and never built.
    int64_t maxsplit = b.get_int(1, -1);
    const int64_t cap = static_cast<int64_t>(std::min<size_t>(in.options().limits.max_items, INT64_MAX));
    if (maxsplit < 0 || maxsplit > cap) maxsplit = cap;
    std::vector<std::string> parts = name == "split" ? text::split(s, sep, maxsplit) : text::rsplit(s, sep, maxsplit);
    in.check_items(parts.size());
    std::vector<Value> items;
    items.reserve(parts.size());
    for (auto& part : parts) items.push_back(out(std::move(part)));
    return Value::list(std::move(items));
  }
  if (name == "splitlines") {
    ArgBinder b(name, args, {"keepends"});
    std::vector<std::string> parts = text::splitlines(s, b.get_bool(0, false), in.options().limits.max_items);
    in.check_items(parts.size());
    std::vector<Value> items;
    items.reserve(parts.size());
    for (auto& part : parts) items.push_back(out(std::move(part)));
    return Value::list(std::move(items));
  }
  if (name == "startswith" || name == "endswith") {
    ArgBinder b(name, args, {"prefix", "start", "end"}, 1);
    const Value& what = *b.get(0);
    std::vector<Value> options = what.is_list() && what.seq_kind() == SeqKind::Tuple ? what.items() : std::vector<Value>{what};
    const std::u32string u = text::to_u32(s);
    const CpRange r = resolve_range(u.size(), b.get(1), b.get(2));
    const std::u32string_view hay = range_view(u, r);
    for (const Value& o : options) {
      if (!o.is_string())
        raise("TypeError", std::string(name) + " first arg must be str or a tuple of str, not " + type_name(o));
      const std::u32string p = text::to_u32(o.str());
      if (r.begin > static_cast<int64_t>(u.size()) || r.end - r.begin < static_cast<int64_t>(p.size())) continue;
      if (name == "startswith" ? hay.starts_with(p) : hay.ends_with(p)) return Value::boolean(true);
    }
    return Value::boolean(false);
  }
  if (name == "replace") {
    ArgBinder b(name, args, {"old", "new", "count"}, 2);
    std::string old_s = need_str(*b.get(0), "replace"), new_s = need_str(*b.get(1), "replace");
    if (safe) old_s = esc(*b.get(0)), new_s = esc(*b.get(1));  // Markup.replace escapes its arguments
    return out(checked_replace(in, s, old_s, new_s, b.get_int(2, -1)));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    ArgBinder b(name, args, {"sub", "start", "end"}, 1);
    const int64_t r = str_find(s, need_str(*b.get(0), name.data()), b.get(1), b.get(2), name[0] == 'r');
    if (r < 0 && (name == "index" || name == "rindex")) raise("ValueError", "substring not found");
    return Value::integer(r);
  }
  if (name == "count") {
    ArgBinder b(name, args, {"sub", "start", "end"}, 1);
    const std::u32string u = text::to_u32(s), su = text::to_u32(need_str(*b.get(0), "count"));
    const CpRange r = resolve_range(u.size(), b.get(1), b.get(2));
    if (r.end - r.begin < static_cast<int64_t>(su.size())) return Value::integer(0);
    if (su.empty()) return Value::integer(r.end - r.begin + 1);
    int64_t n = 0;
    const std::u32string_view hay = range_view(u, r);
    for (size_t p = hay.find(su); p != std::u32string_view::npos; p = hay.find(su, p + su.size())) ++n;
    return Value::integer(n);
  }
  if (name == "join") {
    ArgBinder b(name, args, {"iterable"}, 1);
    std::string r;
    size_t i = 0;
    for (const Value& item : iterate(*b.get(0))) {
      if (!item.is_string())
        raise("TypeError", "sequence item " + std::to_string(i) + ": expected str instance, " + type_name(item) + " found");
      if (i++) r += s;
      r += safe ? esc(item) : item.str();
      in.check_string(r.size());
    }
    return out(std::move(r));
  }
  if (name == "center" || name == "ljust" || name == "rjust") {
    ArgBinder b(name, args, {"width", "fillchar"}, 1);
    const int64_t width = b.get_int(0, 0);
    std::string fill = " ";
    if (b.has(1)) {
      fill = need_str(*b.get(1), name.data());
      if (text::length(fill) != 1) raise("TypeError", "The fill character must be exactly one character long");
    }
    const int64_t len = static_cast<int64_t>(text::length(s));
    if (width <= len) return out(s);
    in.check_string(mul_sat(fill.size(), static_cast<uint64_t>(width)));
    const int64_t marg = width - len;
    int64_t left = name == "ljust" ? 0 : name == "rjust" ? marg : marg / 2 + (marg & width & 1);
    std::string r;
    for (int64_t k = 0; k < left; ++k) r += fill;
    r += s;
    for (int64_t k = 0; k < marg - left; ++k) r += fill;
    return out(std::move(r));
  }
  if (name == "zfill") {
    ArgBinder b(name, args, {"width"}, 1);
    const int64_t width = b.get_int(0, 0), len = static_cast<int64_t>(text::length(s));
    if (width <= len) return out(s);
    in.check_string(static_cast<size_t>(width));
    std::string r = s;
    size_t at = (!r.empty() && (r[0] == '+' || r[0] == '-')) ? 1 : 0;
    r.insert(at, std::string(static_cast<size_t>(width - len), '0'));
    return out(std::move(r));
  }
  if (name == "partition" || name == "rpartition") {
    ArgBinder b(name, args, {"sep"}, 1);
    const std::string& sep = need_str(*b.get(0), name.data());
    if (sep.empty()) raise("ValueError", "empty separator");
    const size_t p = name == "partition" ? s.find(sep) : s.rfind(sep);
    if (p == std::string::npos) {
      return name == "partition" ? Value::list({out(s), out(""), out("")}, SeqKind::Tuple)
                                 : Value::list({out(""), out(""), out(s)}, SeqKind::Tuple);
    }
    return Value::list({out(s.substr(0, p)), out(sep), out(s.substr(p + sep.size()))}, SeqKind::Tuple);
  }
  if (name == "removeprefix" || name == "removesuffix") {
    ArgBinder b(name, args, {"affix"}, 1);
    const std::string& a = need_str(*b.get(0), name.data());
    if (name == "removeprefix") return out(s.starts_with(a) ? s.substr(a.size()) : s);
    return out(s.ends_with(a) && !a.empty() ? s.substr(0, s.size() - a.size()) : s);
  }
  if (name == "format") return out(brace_format(in, s, args, safe));
  if (name.starts_with("is")) {
    none_args();
    const std::u32string u = text::to_u32(s);
    if (name == "islower") return Value::boolean(str_is_case(s, true));
    if (name == "isupper") return Value::boolean(str_is_case(s, false));
    if (name == "istitle") {
      bool prev_cased = false, any = false;
      for (char32_t c : u) {
        if (text::is_upper_cp(c)) {
          if (prev_cased) return Value::boolean(false);
          prev_cased = any = true;
        } else if (text::is_lower_cp(c)) {
          if (!prev_cased) return Value::boolean(false);
          prev_cased = any = true;
        } else {
          prev_cased = false;
        }
      }
      return Value::boolean(any);
    }
    if (name == "isascii") return Value::boolean(text::is_ascii(s));
    if (name == "isprintable")
      return Value::boolean(std::all_of(u.begin(), u.end(), [](char32_t c) { return text::is_printable(c) || c == ' '; }));
    bool (*pred)(char32_t) = nullptr;
    if (name == "isalpha") pred = text::is_alpha;
    if (name == "isalnum") pred = text::is_alnum;
    if (name == "isdigit" || name == "isdecimal" || name == "isnumeric") pred = text::is_digit;
    if (name == "isspace") pred = text::is_space;
    if (name == "isidentifier") {
      if (u.empty() || text::is_digit(u[0])) return Value::boolean(false);
      return Value::boolean(std::all_of(u.begin(), u.end(), [](char32_t c) { return text::is_word(c); }));
    }
    if (pred) return Value::boolean(!u.empty() && std::all_of(u.begin(), u.end(), pred));
  }
  raise("AttributeError", "'str' object has no attribute " + text::py_repr(name));
}

Value list_method(Interpreter& in, const Value& self, std::string_view name, CallArgs& args) {
  const auto& items = self.items();
  if (name == "count") {
    ArgBinder b(name, args, {"value"}, 1);
    int64_t n = 0;
    for (const Value& x : items) n += equal(x, *b.get(0)) ? 1 : 0;
    charge_items(items.size());
    return Value::integer(n);
  }
  if (name == "index") {
    ArgBinder b(name, args, {"value", "start", "stop"}, 1);
    const int64_t len = static_cast<int64_t>(items.size());
    auto idx = [&](size_t i, int64_t d) {
      int64_t x = b.get_int(i, d);
      if (x < 0) x = std::max<int64_t>(0, x + len);
      return std::min(x, len);
    };
    for (int64_t i = idx(1, 0), e = idx(2, len); i < e; ++i)
      if (equal(items[static_cast<size_t>(i)], *b.get(0))) return Value::integer(i);
    raise("ValueError", repr(*b.get(0)) + " is not in " + type_name(self));
  }
  if (name == "copy") {
    ArgBinder b(name, args, {});
    return Value::list(items);
  }
  raise("AttributeError", "'" + type_name(self) + "' object has no attribute " + text::py_repr(name));
}

Value dict_view(const Value& self, SeqKind kind) {
  std::vector<Value> out;
  out.reserve(self.dict().items.size());
  for (const auto& [k, v] : self.dict().items) {
    if (kind == SeqKind::DictItems)
      out.push_back(Value::list({k, v}, SeqKind::Tuple));
    else
      out.push_back(kind == SeqKind::DictKeys ? k : v);
  }
  return Value::list(std::move(out), kind);
}

Value dict_method(Interpreter& in, const Value& self, std::string_view name, CallArgs& args) {
  charge_items(self.dict().items.size());
  if (name == "get") {
    ArgBinder b(name, args, {"key", "default"}, 1);
    const Value& key = *b.get(0);
    if (key.is_list() && key.seq_kind() != SeqKind::Tuple) raise("TypeError", "unhashable type: '" + type_name(key) + "'");
    if (key.is_dict()) raise("TypeError", "unhashable type: 'dict'");
    if (const Value* v = self.dict().find(key)) return *v;
    return b.get_or(1, Value::none());
  }
  ArgBinder b(name, args, {});
  if (name == "items") return dict_view(self, SeqKind::DictItems);
  if (name == "keys") return dict_view(self, SeqKind::DictKeys);
  if (name == "values") return dict_view(self, SeqKind::DictValues);
  if (name == "copy") return Value::dict(self.dict().items, true);
  raise("AttributeError", "'dict' object has no attribute " + text::py_repr(name));
}

bool one_of(std::string_view name, std::initializer_list<std::string_view> names) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

}  // namespace

MethodKind method_kind(const Value& obj, std::string_view name) {
  switch (obj.type()) {
    case Value::Type::String:
      return one_of(name, {"lower", "casefold", "upper", "title", "capitalize", "swapcase", "strip", "lstrip", "rstrip",
                           "split", "rsplit", "splitlines", "startswith", "endswith", "replace", "find", "rfind",
                           "index", "rindex", "count", "join", "center", "ljust", "rjust", "zfill", "partition",
                           "rpartition", "removeprefix", "removesuffix", "format", "islower", "isupper", "istitle",
                           "isascii", "isprintable", "isalpha", "isalnum", "isdigit", "isdecimal", "isnumeric",
                           "isspace", "isidentifier"})
                 ? MethodKind::Safe
                 : MethodKind::None;
    case Value::Type::List: {
      const SeqKind k = obj.seq_kind();
      if (k == SeqKind::List) {
        if (one_of(name, {"count", "index", "copy"})) return MethodKind::Safe;
        if (one_of(name, {"append", "clear", "extend", "insert", "pop", "remove", "reverse", "sort"}))
          return MethodKind::Unsafe;
      } else if (k == SeqKind::Tuple || k == SeqKind::Range) {
        if (one_of(name, {"count", "index"})) return MethodKind::Safe;
      }
      return MethodKind::None;
    }
    case Value::Type::Dict:
      if (one_of(name, {"get", "items", "keys", "values", "copy"})) return MethodKind::Safe;
      if (one_of(name, {"clear", "pop", "popitem", "setdefault", "update"})) return MethodKind::Unsafe;
      return MethodKind::None;
    default: return MethodKind::None;
  }
}

Value call_method(Interpreter& in, const Value& obj, std::string_view name, CallArgs& args) {
  if (method_kind(obj, name) == MethodKind::Unsafe)
    raise("SecurityError", "access to attribute " + text::py_repr(name) + " of " + text::py_repr(type_name(obj)) +
                               " object is unsafe.");
  charge_scan(obj);
  if (obj.is_string()) return str_method(in, obj, name, args);
  if (obj.is_list()) return list_method(in, obj, name, args);
  if (obj.is_dict()) return dict_method(in, obj, name, args);
  raise("AttributeError", "'" + type_name(obj) + "' object has no attribute " + text::py_repr(name));
}

Value bound_method(const Value& obj, std::string_view name) {
  std::string n(name);
  return Value::function(
      n, [obj, n](Interpreter& in, CallArgs& args) { return call_method(in, obj, n, args); },
      "<built-in method " + n + " of " + type_name(obj) + " object>");
}

void set_namespace_attr(Object& ns, std::string_view name, Value v) { static_cast<Namespace&>(ns).set(name, std::move(v)); }

// ---- string formatting -------------------------------------------------------------------

namespace {

// Digits of u in base 2, 8, 10 or 16.
std::string int_digits(uint64_t u, int base, bool upper) {
  const char* digits = upper ? "0123456789ABCDEF" : "0123456789abcdef";
  std::string out;
  do {
    out.insert(out.begin(), digits[u % static_cast<uint64_t>(base)]);
    u /= static_cast<uint64_t>(base);
  } while (u);
  return out;
}

// printf-style number conversion with Python's flags (- + space # 0),
// width and precision; the result is already padded.
std::string format_number(const Value& v, const std::string& flags, int width, int precision, char conv) {
  const bool left = flags.find('-') != std::string::npos, zero = flags.find('0') != std::string::npos;
  const bool plus = flags.find('+') != std::string::npos, space = flags.find(' ') != std::string::npos;
  const bool alt = flags.find('#') != std::string::npos;
  std::string sign, body;
  if (conv == 'f' || conv == 'F' || conv == 'e' || conv == 'E' || conv == 'g' || conv == 'G') {
    const double d = v.as_float();
    const int prec = precision < 0 ? 6 : std::min(precision, 300);
    body = format_double(std::string("%") + (alt ? "#" : "") + "." + std::to_string(prec) + conv, std::fabs(d));
    if (std::signbit(d) && !std::isnan(d)) sign = "-";
  } else {
    const int base = (conv == 'x' || conv == 'X') ? 16 : conv == 'o' ? 8 : 10;
    bool negative = false;
    if (v.is_float()) {
      // Python converts with int(): exact however large; int64 holds |d| < 2**63.
      const double d = std::trunc(v.as_float());
      if (std::isnan(d)) raise("ValueError", "cannot convert float NaN to integer");
      if (std::isinf(d)) raise("OverflowError", "cannot convert float infinity to integer");
      negative = d < 0;
      if (std::fabs(d) < 9223372036854775808.0) {
        const int64_t n = static_cast<int64_t>(d);
        body = int_digits(n < 0 ? 0 - static_cast<uint64_t>(n) : static_cast<uint64_t>(n), base, conv == 'X');
      } else if (base == 10) {
        body = format_double("%.0f", std::fabs(d));  // glibc prints a double's exact integer value
      } else {
        raise_int_overflow(std::string("%") + conv + " of a float");
      }
    } else {
      const int64_t n = v.as_int();
      negative = n < 0;
      body = int_digits(n < 0 ? 0 - static_cast<uint64_t>(n) : static_cast<uint64_t>(n), base, conv == 'X');
    }
    if (precision > static_cast<int>(body.size())) body.insert(0, static_cast<size_t>(precision) - body.size(), '0');
    if (alt && base != 10) body.insert(0, conv == 'o' ? "0o" : conv == 'x' ? "0x" : "0X");
    if (negative) sign = "-";
  }
  if (sign.empty()) sign = plus ? "+" : space ? " " : "";
  const int len = static_cast<int>(sign.size() + body.size());
  if (width > len) {
    const size_t pad = static_cast<size_t>(width - len);
    if (left) return sign + body + std::string(pad, ' ');
    if (zero) return sign + std::string(pad, '0') + body;
    return std::string(pad, ' ') + sign + body;
  }
  return sign + body;
}

}  // namespace

std::string percent_format(Interpreter& in, std::string_view fmt, const Value& args, bool escape_args) {
  std::vector<Value> positional;
  const Value* mapping = nullptr;
  if (args.is_list() && args.seq_kind() == SeqKind::Tuple) {
    positional = args.items();
  } else if (args.is_dict()) {
    mapping = &args;
    positional = {args};
  } else {
    positional = {args};
  }
  size_t next = 0;
  bool used_mapping = false;
  auto take = [&]() -> Value {
    if (next >= positional.size()) raise("TypeError", "not enough arguments for format string");
    return positional[next++];
  };
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out.push_back(fmt[i]);
      continue;
    }
    if (++i >= fmt.size()) raise("ValueError", "incomplete format");
    std::optional<Value> arg;
    if (fmt[i] == '(') {
      const size_t close = fmt.find(')', i);
      if (close == std::string_view::npos) raise("ValueError", "incomplete format key");
      if (!mapping) raise("TypeError", "format requires a mapping");
      const Value* v = mapping->dict().find(fmt.substr(i + 1, close - i - 1));
      if (!v) raise("KeyError", text::py_repr(fmt.substr(i + 1, close - i - 1)));
      arg = *v;
      used_mapping = true;
      i = close + 1;
    }
    std::string flags;
    while (i < fmt.size() && std::string_view("-+ #0").find(fmt[i]) != std::string_view::npos) flags.push_back(fmt[i++]);
    auto number = [&]() -> int {
      if (i < fmt.size() && fmt[i] == '*') {
        ++i;
        const Value w = take();
        if (!w.is_integral()) raise("TypeError", "* wants int");
        return static_cast<int>(std::clamp<int64_t>(checked_size_arg(in, w.as_int()), INT32_MIN + 1, INT32_MAX));
      }
      int64_t n = 0;
      while (i < fmt.size() && fmt[i] >= '0' && fmt[i] <= '9') n = std::min<int64_t>(n * 10 + (fmt[i++] - '0'), INT32_MAX);
      checked_size_arg(in, n);
      return static_cast<int>(n);
    };
    const int width = number();
    int precision = -1;
    if (i < fmt.size() && fmt[i] == '.') {
      ++i;
      precision = number();
    }
    while (i < fmt.size() && (fmt[i] == 'l' || fmt[i] == 'h' || fmt[i] == 'L')) ++i;
    if (i >= fmt.size()) raise("ValueError", "incomplete format");
    const char conv = fmt[i];
    if (conv == '%') {
      out.push_back('%');
      continue;
    }
    const Value v = arg ? *arg : take();
    std::string piece;
    const bool left = flags.find('-') != std::string::npos;
    switch (conv) {
      case 's':
      case 'r':
      case 'a': {
        piece = conv == 's' ? to_str(v) : repr(v);
        if (escape_args && !v.is_safe()) piece = text::html_escape(piece);
        if (precision >= 0) piece = text::substr_cp(piece, 0, static_cast<size_t>(precision));
        break;
      }
      case 'd':
      case 'i':
      case 'u':
      case 'x':
      case 'X':
      case 'o':
      case 'f':
      case 'F':
      case 'e':
      case 'E':
      case 'g':
      case 'G': {
        if (!v.is_number())
          raise("TypeError", std::string("%") + conv + " format: a real number is required, not " + type_name(v));
        piece = format_number(v, flags, width, precision, conv);
        break;
      }
      case 'c': {
        if (v.is_integral()) {
          if (v.as_int() < 0 || v.as_int() > 0x10FFFF) raise("OverflowError", "%c arg not in range(0x110000)");
          text::append_utf8(piece, static_cast<char32_t>(v.as_int()));
        } else if (v.is_string() && text::length(v.str()) == 1) {
          piece = v.str();
        } else {
          raise("TypeError", "%c requires int or char");
        }
        break;
      }
      default: raise("ValueError", std::string("unsupported format character '") + conv + "'");
    }
    const int64_t len = static_cast<int64_t>(text::length(piece));
    if (width > len) {
      const std::string pad(static_cast<size_t>(width - len), ' ');
      piece = left ? piece + pad : pad + piece;
    }
    out += piece;
    in.check_string(out.size());
  }
  if (!used_mapping && !mapping && next < positional.size())
    raise("TypeError", "not all arguments converted during string formatting");
  return out;
}

namespace {

// One replacement field's format spec: [[fill]align][sign][#][0][width][,][.precision][type].
std::string apply_format_spec(const Value& v, std::string_view spec) {
  char fill = ' ', align = 0, sign = '-';
  size_t i = 0;
  auto is_align = [](char c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  if (spec.size() >= 2 && is_align(spec[1])) {
    fill = spec[0];
    align = spec[1];
    i = 2;
  } else if (!spec.empty() && is_align(spec[0])) {
    align = spec[0];
    i = 1;
  }
  if (i < spec.size() && (spec[i] == '+' || spec[i] == '-' || spec[i] == ' ')) sign = spec[i++];
  bool alt = false;
  if (i < spec.size() && spec[i] == '#') alt = true, ++i;
  if (i < spec.size() && spec[i] == '0') {
    if (!align) fill = '0', align = '=';
    ++i;
  }
  int64_t width = 0;
  while (i < spec.size() && spec[i] >= '0' && spec[i] <= '9') width = std::min<int64_t>(width * 10 + (spec[i++] - '0'), INT32_MAX);
  if (static_cast<size_t>(width) > active_limits().max_bytes)
    raise_size_limit("formatted field", "bytes", static_cast<size_t>(width), active_limits().max_bytes);
  bool comma = false;
  if (i < spec.size() && (spec[i] == ',' || spec[i] == '_')) comma = true, ++i;
  int precision = -1;
  if (i < spec.size() && spec[i] == '.') {
    ++i;
    precision = 0;
    while (i < spec.size() && spec[i] >= '0' && spec[i] <= '9') precision = std::min(precision * 10 + (spec[i++] - '0'), 1000);
  }
  char type = i < spec.size() ? spec[i++] : 0;
  if (i != spec.size() || comma || alt) raise("ValueError", "unsupported format specifier '" + std::string(spec) + "'");
  std::string body;
  bool numeric = false;
  if (v.is_string() || (!v.is_number())) {
    if (type && type != 's') raise("ValueError", std::string("Unknown format code '") + type + "' for object of type '" + type_name(v) + "'");
    body = to_str(v);
    if (precision >= 0) body = text::substr_cp(body, 0, static_cast<size_t>(precision));
    if (!align) align = '<';
  } else {
    numeric = true;
    if (type == 'd' || (!type && v.is_integral() && precision < 0)) {
      if (!v.is_integral()) raise("ValueError", "Unknown format code 'd' for object of type 'float'");
      body = std::to_string(v.as_int());
    } else if (type == 'f' || type == 'F' || type == 'e' || type == 'E' || type == 'g' || type == 'G' || type == '%') {
      double d = v.as_float();
      if (type == '%') d *= 100;
      body = format_double("%." + std::to_string(precision < 0 ? 6 : precision) + (type == '%' ? 'f' : type), d);
      if (type == '%') body += "%";
    } else if (!type) {
      if (precision >= 0) {
        body = format_double("%." + std::to_string(precision) + "g", v.as_float());
      } else {
        body = to_str(v.is_bool() ? Value::integer(v.as_int()) : v);
      }
    } else if (type == 'x' || type == 'X' || type == 'o' || type == 'b') {
      if (!v.is_integral()) raise("ValueError", std::string("Unknown format code '") + type + "' for object of type 'float'");
      const int64_t n = v.as_int();
      const uint64_t magnitude = n < 0 ? 0 - static_cast<uint64_t>(n) : static_cast<uint64_t>(n);
      body = int_digits(magnitude, type == 'o' ? 8 : type == 'b' ? 2 : 16, type == 'X');
      if (n < 0) body.insert(body.begin(), '-');
    } else {
      raise("ValueError", std::string("Unknown format code '") + type + "'");
    }
    if (sign != '-' && body[0] != '-') body.insert(body.begin(), sign == '+' ? '+' : ' ');
    if (!align) align = '>';
  }
  const int64_t len = static_cast<int64_t>(text::length(body));
  if (width <= len) return body;
  const size_t pad = static_cast<size_t>(width - len);
  switch (align) {
    case '<': return body + std::string(pad, fill);
    case '>': return std::string(pad, fill) + body;
    case '^': return std::string(pad / 2, fill) + body + std::string(pad - pad / 2, fill);
    default:
      if (numeric && !body.empty() && (body[0] == '-' || body[0] == '+' || body[0] == ' '))
        return body.substr(0, 1) + std::string(pad, fill) + body.substr(1);
      return std::string(pad, fill) + body;
  }
}

}  // namespace

std::string brace_format(Interpreter& in, std::string_view fmt, const CallArgs& args, bool escape_args) {
  std::string out;
  size_t auto_index = 0;
  bool used_auto = false, used_manual = false;
  for (size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') {
        out.push_back('}');
        ++i;
        continue;
      }
      raise("ValueError", "Single '}' encountered in format string");
    }
    if (c != '{') {
      out.push_back(c);
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out.push_back('{');
      ++i;
      continue;
    }
    const size_t close = fmt.find('}', i);
    if (close == std::string_view::npos) raise("ValueError", "expected '}' before end of string");
    std::string_view field = fmt.substr(i + 1, close - i - 1);
    i = close;
    std::string_view spec, conversion;
    if (size_t colon = field.find(':'); colon != std::string_view::npos) {
      spec = field.substr(colon + 1);
      field = field.substr(0, colon);
    }
    if (size_t bang = field.find('!'); bang != std::string_view::npos) {
      conversion = field.substr(bang + 1);
      field = field.substr(0, bang);
    }
    // field name: [index|name] followed by .attr / [key] parts
    size_t end = 0;
    while (end < field.size() && field[end] != '.' && field[end] != '[') ++end;
    std::string_view head = field.substr(0, end);
    Value v;
    if (head.empty()) {
      if (used_manual) raise("ValueError", "cannot switch from manual field specification to automatic field numbering");
      used_auto = true;
      if (auto_index >= args.args.size())
        raise("IndexError", "Replacement index " + std::to_string(auto_index) + " out of range for positional args tuple");
      v = args.args[auto_index++];
    } else if (head.size() <= 9 && std::all_of(head.begin(), head.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
      if (used_auto) raise("ValueError", "cannot switch from automatic field numbering to manual field specification");
      used_manual = true;
      const size_t idx = std::stoul(std::string(head));
      if (idx >= args.args.size())
        raise("IndexError", "Replacement index " + std::to_string(idx) + " out of range for positional args tuple");
      v = args.args[idx];
    } else {
      bool found = false;
      for (const auto& [k, val] : args.kwargs)
        if (k == head) v = val, found = true;
      if (!found) raise("KeyError", text::py_repr(head));
    }
    while (end < field.size()) {
      if (field[end] == '.') {
        size_t e = end + 1;
        while (e < field.size() && field[e] != '.' && field[e] != '[') ++e;
        v = in.getattr(v, field.substr(end + 1, e - end - 1));
        end = e;
      } else {
        const size_t e = field.find(']', end);
        if (e == std::string_view::npos) raise("ValueError", "Missing ']' in format string");
        std::string_view key = field.substr(end + 1, e - end - 1);
        const bool digits = !key.empty() && key.size() <= 18 &&
                            std::all_of(key.begin(), key.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
        v = in.getitem(v, digits ? Value::integer(std::stoll(std::string(key))) : Value::string(std::string(key)));
        end = e + 1;
      }
    }
    std::string piece;
    if (conversion == "r" || conversion == "a") {
      piece = repr(v);
      v = Value::string(piece);
    } else if (conversion == "s") {
      v = Value::string(to_str(v));
    } else if (!conversion.empty()) {
      raise("ValueError", "Unknown conversion specifier " + std::string(conversion));
    }
    if (v.is_undefined()) v = Value::string("");
    piece = spec.empty() ? to_str(v) : apply_format_spec(v, spec);
    if (escape_args && !v.is_safe()) piece = text::html_escape(piece);
    out += piece;
    in.check_string(out.size());
  }
  return out;
}

namespace {

// ---- filters ---------------------------------------------------------------------------

using FilterFn = Value (*)(Interpreter&, const Value&, CallArgs&);

std::vector<Value> iter_for_filter(const Value& v) {
  if (v.is_undefined() && v.undefined_data() && v.undefined_data()->security) raise_undefined(v);
  return iterate(v);
}

Value f_abs(Interpreter&, const Value& v, CallArgs& a) {
  ArgBinder("abs", a, {});
  if (v.is_integral()) {
    if (v.as_int() == INT64_MIN) raise_int_overflow("abs");
    return Value::integer(std::abs(v.as_int()));
  }
  if (v.is_float()) return Value::number(std::fabs(v.as_float()));
  raise("TypeError", "bad operand type for abs(): '" + type_name(v) + "'");
}

Value f_attr(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("attr", a, {"name"}, 1);
  const Value& name = *b.get(0);
  if (!name.is_string()) raise("TypeError", "attribute name must be string");
  if (v.is_undefined()) raise_undefined(v);
  if (v.is_dict() || v.is_string() || v.is_list()) {
    if (method_kind(v, name.str()) != MethodKind::None) return in.getattr(v, name.str());
    return Value::undefined(text::py_repr(object_type_repr(v)) + " has no attribute " + text::py_repr(name.str()));
  }
  return in.getattr(v, name.str());
}

Value f_batch(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("batch", a, {"linecount", "fill_with"}, 1);
  const int64_t n = b.get_int(0, 1);
  if (n <= 0) raise("ValueError", "batch size must be positive");
  if (b.has(1) && !b.get(1)->is_none()) in.check_items(static_cast<size_t>(n));
  std::vector<Value> out, cur;
  for (const Value& item : iter_for_filter(v)) {
    if (static_cast<int64_t>(cur.size()) == n) {
      out.push_back(Value::list(std::move(cur)));
      cur.clear();
    }
    cur.push_back(item);
  }
  if (!cur.empty()) {
    if (b.has(1) && !b.get(1)->is_none())
      while (static_cast<int64_t>(cur.size()) < n) cur.push_back(*b.get(1));
    out.push_back(Value::list(std::move(cur)));
  }
  in.step(out.size());
  return generator(std::move(out));
}

Value f_capitalize(Interpreter&, const Value& v, CallArgs& a) {
  ArgBinder("capitalize", a, {});
  return same_safety(v, text::capitalize(soft_str(v)));
}

Value f_center(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("center", a, {"width"});
  CallArgs m;
  m.args.push_back(Value::integer(b.get_int(0, 80)));
  return call_method(in, Value::string(soft_str(v), v.is_safe()), "center", m);
}

Value f_length(Interpreter&, const Value& v, CallArgs& a) {
  ArgBinder("length", a, {});
  return Value::integer(length(v));
}

Value f_default(Interpreter&, const Value& v, CallArgs& a) {
  ArgBinder b("default", a, {"default_value", "boolean"});
  if (v.is_undefined() || (b.get_bool(1, false) && !truthy(v))) return b.get_or(0, Value::string(""));
  return v;
}

Value f_dictsort(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("dictsort", a, {"case_sensitive", "by", "reverse"});
  if (v.is_undefined()) raise_undefined(v);
  if (!v.is_dict()) raise("AttributeError", "'" + type_name(v) + "' object has no attribute 'items'");
  const bool cs = b.get_bool(0, false);
  const Value by = b.get_or(1, Value::string("key"));
  size_t pos;
  if (by.is_string() && by.str() == "key") pos = 0;
  else if (by.is_string() && by.str() == "value") pos = 1;
  else raise("FilterArgumentError", "You can only sort by either \"key\" or \"value\"");
  const bool rev = b.get_bool(2, false);
  std::vector<std::pair<Value, Value>> items = v.dict().items;
  auto key = [&](const std::pair<Value, Value>& kv) { return cs ? (pos ? kv.second : kv.first) : ignore_case(pos ? kv.second : kv.first); };
  std::stable_sort(items.begin(), items.end(), [&](const auto& x, const auto& y) {
    return rev ? less(key(y), key(x)) : less(key(x), key(y));
  });
  in.step(items.size());
  std::vector<Value> out;
  for (auto& [k, val] : items) out.push_back(Value::list({k, val}, SeqKind::Tuple));
  return Value::list(std::move(out));
}

Value f_escape(Interpreter&, const Value& v, CallArgs& a) {
  ArgBinder("escape", a, {});
  if (v.is_safe()) return v;
  return Value::string(text::html_escape(to_str(v)), true);
}

Value f_forceescape(Interpreter&, const Value& v, CallArgs& a) {
  ArgBinder("forceescape", a, {});
  return Value::string(text::html_escape(to_str(v)), true);
}

Value f_first(Interpreter&, const Value& v, CallArgs& a) {
  ArgBinder("first", a, {});
  std::vector<Value> items = iter_for_filter(v);
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}

Value f_last(Interpreter&, const Value& v, CallArgs& a) {
  ArgBinder("last", a, {});
  if (v.is_list() && (v.seq_kind() == SeqKind::Generator || v.seq_kind() == SeqKind::Iterator))
    raise("TypeError", "'" + type_name(v) + "' object is not reversible");
  std::vector<Value> items = iter_for_filter(v);
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

Value f_float(Interpreter&, const Value& v, CallArgs& a) {
  ArgBinder b("float", a, {"default"});
  if (v.is_undefined()) raise_undefined(v);
  if (v.is_number()) return Value::number(v.as_float());
  if (v.is_string())
    if (auto d = parse_py_float(v.str())) return Value::number(*d);
  return b.get_or(0, Value::number(0.0));
}

Value f_format(Interpreter& in, const Value& v, CallArgs& a) {
  if (!a.args.empty() && !a.kwargs.empty())
    raise("FilterArgumentError", "can't handle positional and keyword arguments at the same time");
  Value args;
  if (!a.kwargs.empty()) {
    std::vector<std::pair<Value, Value>> items;
    for (auto& [k, x] : a.kwargs) items.emplace_back(Value::string(k), x);
    args = Value::dict(std::move(items));
  } else {
    args = Value::list(a.args, SeqKind::Tuple);
  }
  return same_safety(v, percent_format(in, soft_str(v), args, v.is_safe()));
}

Value f_indent(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("indent", a, {"width", "first", "blank"});
  if (v.is_undefined()) raise_undefined(v);
  std::string indention;
  const Value width = b.get_or(0, Value::integer(4));
  if (width.is_string()) {
    indention = width.str();
  } else {
    if (!width.is_integral()) raise("TypeError", "can't multiply sequence by non-int of type '" + type_name(width) + "'");
    indention.assign(static_cast<size_t>(std::max<int64_t>(0, checked_size_arg(in, width.as_int()))), ' ');
  }
  const std::string s = soft_str(v) + "\n";
  const std::vector<std::string> lines = text::splitlines(s, false, in.options().limits.max_items);
  in.check_items(lines.size());
  // Every line may get the indention: check that bound before building.
  in.check_string(s.size() + mul_sat(indention.size(), lines.size() + 1));
  std::string rv;
  if (b.get_bool(2, false)) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) rv += "\n" + indention;
      rv += lines[i];
    }
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      rv += "\n";
      if (!lines[i].empty()) rv += indention;
      rv += lines[i];
    }
  }
  if (b.get_bool(1, false)) rv = indention + rv;
  in.check_string(rv.size());
  return same_safety(v, std::move(rv));
}

Value f_int(Interpreter&, const Value& v, CallArgs& a) {
  ArgBinder b("int", a, {"default", "base"});
  if (v.is_undefined()) raise_undefined(v);
  if (v.is_integral()) return Value::integer(v.as_int());
  if (v.is_float()) {
    const double d = v.as_float();
    if (std::isnan(d)) return b.get_or(0, Value::integer(0));
    if (std::isinf(d) || std::fabs(d) >= 9.2e18) raise("OverflowError", "cannot convert float to integer");
    return Value::integer(static_cast<int64_t>(std::trunc(d)));
  }
  if (v.is_string()) {
    const int64_t base = b.get_int(1, 10);  // outside 0..36 parse_py_int refuses it (-1), as Python does
    if (auto i = parse_py_int(v.str(), base >= 0 && base <= 36 ? static_cast<int>(base) : -1)) return Value::integer(*i);
    if (auto d = parse_py_float(v.str())) {
      if (std::isfinite(*d) && std::fabs(*d) < 9.2e18) return Value::integer(static_cast<int64_t>(std::trunc(*d)));
    }
  }
  return b.get_or(0, Value::integer(0));
}

Value f_items(Interpreter&, const Value& v, CallArgs& a) {
  ArgBinder("items", a, {});
  if (v.is_undefined()) return generator({});
  if (!v.is_dict()) raise("TypeError", "Can only get item pairs from a mapping.");
  std::vector<Value> out;
  for (const auto& [k, x] : v.dict().items) out.push_back(Value::list({k, x}, SeqKind::Tuple));
  return generator(std::move(out));
}

Value f_join(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("join", a, {"d", "attribute"});
  const std::string sep = b.has(0) ? to_str(*b.get(0)) : "";
  const std::vector<Value> parts = b.has(1) ? attribute_parts(*b.get(1)) : std::vector<Value>{};
  std::string out;
  size_t i = 0;
  for (const Value& item : iter_for_filter(v)) {
    if (i++) out += sep;
    const Value x = b.has(1) ? lookup_parts(in, item, parts) : item;
    out += x.is_string() ? x.str() : to_str(x);
    in.check_string(out.size());
  }
  charge_bytes(out.size());
  charge_items(i);
  return Value::string(std::move(out));
}

Value f_list(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder("list", a, {});
  std::vector<Value> items = iter_for_filter(v);
  charge_items(items.size());
  return Value::list(std::move(items));
}

Value f_lower(Interpreter&, const Value& v, CallArgs& a) {
  ArgBinder("lower", a, {});
  return same_safety(v, text::lower(soft_str(v)));
}

Value f_upper(Interpreter&, const Value& v, CallArgs& a) {
  ArgBinder("upper", a, {});
  return same_safety(v, text::upper(soft_str(v)));
}

Value f_map(Interpreter& in, const Value& v, CallArgs& a) {
  if (!truthy(v)) return generator({});
  std::vector<Value> out;
  const std::vector<Value> items = iter_for_filter(v);
  bool by_attribute = false;
  for (const auto& kv : a.kwargs) by_attribute |= kv.first == "attribute";
  if (a.args.empty() && by_attribute) {
    Value attribute, fallback = Value::none();
    for (const auto& [k, x] : a.kwargs) {
      if (k == "attribute") attribute = x;
      else if (k == "default") fallback = x;
      else raise("FilterArgumentError", "Unexpected keyword argument " + text::py_repr(k));
    }
    const auto parts = attribute_parts(attribute);
    for (const Value& item : items) {
      in.step();
      out.push_back(lookup_parts(in, item, parts, fallback.is_none() ? nullptr : &fallback));
    }
    return generator(std::move(out));
  }
  if (a.args.empty()) raise("FilterArgumentError", "map requires a filter argument");
  const Value name = a.args[0];
  if (!name.is_string()) raise("TypeError", "filter name must be a string");
  if (!is_filter_name(name.str())) raise("TemplateRuntimeError", "No filter named " + text::py_repr(name.str()) + ".");
  CallArgs rest;
  rest.args.assign(a.args.begin() + 1, a.args.end());
  rest.kwargs = a.kwargs;
  for (const Value& item : items) {
    in.step();
    CallArgs copy = rest;
    out.push_back(apply_filter(in, name.str(), item, copy));
  }
  return generator(std::move(out));
}

Value min_max(Interpreter& in, const Value& v, CallArgs& a, bool want_max) {
  ArgBinder b(want_max ? "max" : "min", a, {"case_sensitive", "attribute"});
  const std::vector<Value> items = iter_for_filter(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  const bool cs = b.get_bool(0, false);
  const auto parts = b.has(1) ? attribute_parts(*b.get(1)) : std::vector<Value>{};
  auto key = [&](const Value& x) {
    Value k = parts.empty() ? x : lookup_parts(in, x, parts);
    return cs ? k : ignore_case(k);
  };
  size_t best = 0;
  Value best_key = key(items[0]);
  for (size_t i = 1; i < items.size(); ++i) {
    Value k = key(items[i]);
    if (want_max ? less(best_key, k) : less(k, best_key)) {
      best = i;
      best_key = std::move(k);
    }
  }
  in.step(items.size() / 4);
  return items[best];
}
Value f_max(Interpreter& in, const Value& v, CallArgs& a) { return min_max(in, v, a, true); }
Value f_min(Interpreter& in, const Value& v, CallArgs& a) { return min_max(in, v, a, false); }

Value select_or_reject(Interpreter& in, const Value& v, CallArgs& a, bool select, bool by_attr) {
  if (!truthy(v)) return generator({});
  size_t off = 0;
  std::vector<Value> parts;
  if (by_attr) {
    if (a.args.empty()) raise("FilterArgumentError", "Missing parameter for attribute name");
    parts = attribute_parts(a.args[0]);
    off = 1;
  }
  std::optional<std::string> test;
  CallArgs rest;
  if (a.args.size() > off) {
    if (!a.args[off].is_string()) raise("TypeError", "test name must be a string");
    test = a.args[off].str();
    if (!is_test_name(*test)) raise("TemplateRuntimeError", "No test named " + text::py_repr(*test) + ".");
    rest.args.assign(a.args.begin() + static_cast<std::ptrdiff_t>(off + 1), a.args.end());
  }
  rest.kwargs = a.kwargs;
  std::vector<Value> out;
  for (const Value& item : iter_for_filter(v)) {
    in.step();
    const Value x = by_attr ? lookup_parts(in, item, parts) : item;
    bool ok;
    if (test) {
      CallArgs copy = rest;
      ok = apply_test(in, *test, x, copy);
    } else {
      ok = truthy(x);
    }
    if (ok == select) out.push_back(item);
  }
  return generator(std::move(out));
}
Value f_select(Interpreter& in, const Value& v, CallArgs& a) { return select_or_reject(in, v, a, true, false); }
Value f_reject(Interpreter& in, const Value& v, CallArgs& a) { return select_or_reject(in, v, a, false, false); }
Value f_selectattr(Interpreter& in, const Value& v, CallArgs& a) { return select_or_reject(in, v, a, true, true); }
Value f_rejectattr(Interpreter& in, const Value& v, CallArgs& a) { return select_or_reject(in, v, a, false, true); }

Value f_replace(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("replace", a, {"old", "new", "count"}, 2);
  return Value::string(checked_replace(in, to_str(v), to_str(*b.get(0)), to_str(*b.get(1)), b.get_int(2, -1)));
}

Value f_reverse(Interpreter&, const Value& v, CallArgs& a) {
  ArgBinder("reverse", a, {});
  if (v.is_string()) {
    std::u32string u = text::to_u32(v.str());
    std::reverse(u.begin(), u.end());
    return same_safety(v, text::to_utf8(u));
  }
  std::vector<Value> items = iter_for_filter(v);
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items), SeqKind::Iterator);
}

Value f_round(Interpreter&, const Value& v, CallArgs& a) {
  ArgBinder b("round", a, {"precision", "method"});
  const int64_t precision = b.get_int(0, 0);
  const Value method = b.get_or(1, Value::string("common"));
  if (!method.is_string() || (method.str() != "common" && method.str() != "ceil" && method.str() != "floor"))
    raise("FilterArgumentError", "method must be common, ceil or floor");
  if (!v.is_number()) raise("TypeError", "type " + type_name(v) + " doesn't define __round__ method");
  if (method.str() == "common") {
    if (v.is_integral()) return Value::integer(py_round_int(v.as_int(), precision));
    return Value::number(py_round(v.as_float(), precision));
  }
  const double p = std::pow(10.0, static_cast<double>(precision));
  const double scaled = v.as_float() * p;
  return Value::number((method.str() == "ceil" ? std::ceil(scaled) : std::floor(scaled)) / p);
}

Value f_safe(Interpreter&, const Value& v, CallArgs& a) {
  ArgBinder("safe", a, {});
  return Value::string(soft_str(v), true);
}

Value f_slice(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("slice", a, {"slices", "fill_with"}, 1);
  const int64_t slices = b.get_int(0, 1);
  if (slices <= 0) raise("ZeroDivisionError", "integer division or modulo by zero");
  in.check_items(static_cast<size_t>(slices));
  const std::vector<Value> seq = iter_for_filter(v);
  const int64_t len = static_cast<int64_t>(seq.size());
  const int64_t per = len / slices, extra = len % slices;
  int64_t offset = 0;
  std::vector<Value> out;
  for (int64_t n = 0; n < slices; ++n) {
    const int64_t start = offset + n * per;
    if (n < extra) ++offset;
    const int64_t end = offset + (n + 1) * per;
    std::vector<Value> tmp(seq.begin() + start, seq.begin() + end);
    if (b.has(1) && !b.get(1)->is_none() && n >= extra) tmp.push_back(*b.get(1));
    out.push_back(Value::list(std::move(tmp)));
  }
  return generator(std::move(out));
}

Value f_sort(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("sort", a, {"reverse", "case_sensitive", "attribute"});
  const bool rev = b.get_bool(0, false), cs = b.get_bool(1, false);
  std::vector<std::vector<Value>> attrs;
  if (b.has(2) && !b.get(2)->is_none()) {
    if (b.get(2)->is_string()) {
      const std::string& s = b.get(2)->str();
      size_t start = 0;
      while (true) {
        const size_t comma = s.find(',', start);
        attrs.push_back(attribute_parts(Value::string(s.substr(start, comma == std::string::npos ? std::string::npos : comma - start))));
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    } else {
      attrs.push_back({*b.get(2)});
    }
  }
  std::vector<Value> items = iter_for_filter(v);
  std::vector<std::pair<Value, size_t>> keyed;
  keyed.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    Value key;
    if (attrs.empty()) {
      key = cs ? items[i] : ignore_case(items[i]);
    } else {
      std::vector<Value> ks;
      for (const auto& parts : attrs) {
        Value k = lookup_parts(in, items[i], parts);
        ks.push_back(cs ? k : ignore_case(k));
      }
      key = Value::list(std::move(ks));
    }
    keyed.emplace_back(std::move(key), i);
  }
  in.step(items.size() * 2);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return rev ? less(y.first, x.first) : less(x.first, y.first);
  });
  std::vector<Value> out;
  out.reserve(items.size());
  for (const auto& [k, i] : keyed) out.push_back(items[i]);
  return Value::list(std::move(out));
}

Value f_string(Interpreter&, const Value& v, CallArgs& a) {
  ArgBinder("string", a, {});
  if (v.is_string()) return v;
  return Value::string(to_str(v));
}

Value f_sum(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("sum", a, {"attribute", "start"});
  Value total = b.get_or(1, Value::integer(0));
  const auto parts = b.has(0) ? attribute_parts(*b.get(0)) : std::vector<Value>{};
  for (const Value& item : iter_for_filter(v)) {
    in.step();
    total = binary_op(in, BinOp::Add, total, parts.empty() ? item : lookup_parts(in, item, parts));
  }
  return total;
}

Value f_title(Interpreter&, const Value& v, CallArgs& a) {
  ArgBinder("title", a, {});
  // jinja2 splits on runs of `-`, whitespace and opening brackets, then
  // upper-cases each piece's first character and lower-cases the rest.
  const std::u32string u = text::to_u32(soft_str(v));
  auto sep = [](char32_t c) { return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || text::is_space(c); };
  std::string out;
  size_t i = 0;
  while (i < u.size()) {
    size_t j = i;
    const bool s = sep(u[i]);
    while (j < u.size() && sep(u[j]) == s) ++j;
    std::u32string first;
    text::append_upper(first, u[i]);
    out += text::to_utf8(first) + text::lower(text::to_utf8(std::u32string_view(u).substr(i + 1, j - i - 1)));
    i = j;
  }
  return Value::string(std::move(out));
}

Value f_tojson(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("tojson", a, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonOptions opts;
  opts.ensure_ascii = b.get_bool(0, false);
  if (b.has(1) && !b.get(1)->is_none()) {
    const Value& ind = *b.get(1);
    if (ind.is_string()) opts.indent = ind.str();
    else if (ind.is_integral())
      opts.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, checked_size_arg(in, ind.as_int()))), ' ');
    else raise("TypeError", "can't multiply sequence by non-int of type '" + type_name(ind) + "'");
    opts.item_separator = ",";
  }
  if (b.has(2) && !b.get(2)->is_none()) {
    const std::vector<Value> seps = iterate(*b.get(2));
    if (seps.size() != 2 || !seps[0].is_string() || !seps[1].is_string())
      raise("ValueError", "separators must be a (item_separator, key_separator) pair of strings");
    opts.item_separator = seps[0].str();
    opts.key_separator = seps[1].str();
  }
  opts.sort_keys = b.get_bool(3, false);
  std::string s = to_json(v, opts);
  in.check_string(s.size());
  in.step(s.size() / 64);
  return Value::string(std::move(s));
}

Value f_trim(Interpreter&, const Value& v, CallArgs& a) {
  ArgBinder b("trim", a, {"chars"});
  return same_safety(v, text::strip(soft_str(v), opt_str(b.get(0), "strip"), true, true));
}

Value f_truncate(Interpreter&, const Value& v, CallArgs& a) {
  ArgBinder b("truncate", a, {"length", "killwords", "end", "leeway"});
  const int64_t len = b.get_int(0, 255), leeway = b.get_int(3, 5);
  const std::string end = b.has(2) ? to_str(*b.get(2)) : "...";
  const int64_t end_len = static_cast<int64_t>(text::length(end));
  if (len < end_len) raise("AssertionError", "expected length >= " + std::to_string(end_len) + ", got " + std::to_string(len));
  if (leeway < 0) raise("AssertionError", "expected leeway >= 0, got " + std::to_string(leeway));
  const std::string s = soft_str(v);
  int64_t room = 0;  // len + leeway; both are >= 0, so only INT64_MAX can be exceeded
  if (__builtin_add_overflow(len, leeway, &room)) room = INT64_MAX;
  if (static_cast<int64_t>(text::length(s)) <= room) return v.is_string() ? v : Value::string(s);
  const std::string head = text::substr_cp(s, 0, static_cast<size_t>(len - end_len));
  if (b.get_bool(1, false)) return Value::string(head + end);
  const size_t sp = head.rfind(' ');
  return Value::string((sp == std::string::npos ? head : head.substr(0, sp)) + end);
}

Value f_unique(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("unique", a, {"case_sensitive", "attribute"});
  const bool cs = b.get_bool(0, false);
  const auto parts = b.has(1) ? attribute_parts(*b.get(1)) : std::vector<Value>{};
  std::vector<Value> out, seen;
  for (const Value& item : iter_for_filter(v)) {
    Value key = parts.empty() ? item : lookup_parts(in, item, parts);
    if (!cs) key = ignore_case(key);
    if ((key.is_list() && key.seq_kind() != SeqKind::Tuple) || key.is_dict())
      raise("TypeError", "unhashable type: '" + type_name(key) + "'");
    in.step();
    charge_items(seen.size());  // a linear search of what was kept
    if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equal(s, key); })) {
      seen.push_back(std::move(key));
      out.push_back(item);
    }
  }
  return generator(std::move(out));
}

Value f_wordcount(Interpreter&, const Value& v, CallArgs& a) {
  ArgBinder("wordcount", a, {});
  const std::string s = soft_str(v);
  int64_t n = 0;
  bool in_word = false;
  for (size_t i = 0; i < s.size();) {
    const bool w = text::is_word(text::next_cp(s, i));
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value::integer(n);
}

const std::unordered_map<std::string_view, FilterFn>& filters() {
  static const std::unordered_map<std::string_view, FilterFn> table = {
      {"abs", f_abs},           {"attr", f_attr},         {"batch", f_batch},
      {"capitalize", f_capitalize}, {"center", f_center}, {"count", f_length},
      {"d", f_default},         {"default", f_default},   {"dictsort", f_dictsort},
      {"e", f_escape},          {"escape", f_escape},     {"first", f_first},
      {"float", f_float},       {"forceescape", f_forceescape}, {"format", f_format},
      {"indent", f_indent},     {"int", f_int},           {"items", f_items},
      {"join", f_join},         {"last", f_last},         {"length", f_length},
      {"list", f_list},         {"lower", f_lower},       {"map", f_map},
      {"max", f_max},           {"min", f_min},           {"reject", f_reject},
      {"rejectattr", f_rejectattr}, {"replace", f_replace}, {"reverse", f_reverse},
      {"round", f_round},       {"safe", f_safe},         {"select", f_select},
      {"selectattr", f_selectattr}, {"slice", f_slice},   {"sort", f_sort},
      {"string", f_string},     {"sum", f_sum},           {"title", f_title},
      {"tojson", f_tojson},     {"trim", f_trim},         {"truncate", f_truncate},
      {"unique", f_unique},     {"upper", f_upper},       {"wordcount", f_wordcount},
  };
  return table;
}

// ---- tests -----------------------------------------------------------------------------

using TestFn = bool (*)(Interpreter&, const Value&, CallArgs&);

const Value& one_arg(const CallArgs& a, const char* name) {
  ArgBinder b(name, a, {"other"}, 1);
  return a.args.empty() ? a.kwargs[0].second : a.args[0];
}

bool t_defined(Interpreter&, const Value& v, CallArgs&) { return !v.is_undefined(); }
bool t_undefined(Interpreter&, const Value& v, CallArgs&) { return v.is_undefined(); }
bool t_none(Interpreter&, const Value& v, CallArgs&) { return v.is_none(); }
bool t_boolean(Interpreter&, const Value& v, CallArgs&) { return v.is_bool(); }
bool t_true(Interpreter&, const Value& v, CallArgs&) { return v.is_bool() && v.as_bool(); }
bool t_false(Interpreter&, const Value& v, CallArgs&) { return v.is_bool() && !v.as_bool(); }
bool t_integer(Interpreter&, const Value& v, CallArgs&) { return v.is_int(); }
bool t_float(Interpreter&, const Value& v, CallArgs&) { return v.is_float(); }
bool t_number(Interpreter&, const Value& v, CallArgs&) { return v.is_number(); }
bool t_string(Interpreter&, const Value& v, CallArgs&) { return v.is_string(); }
bool t_mapping(Interpreter&, const Value& v, CallArgs&) { return v.is_dict(); }
bool t_iterable(Interpreter&, const Value& v, CallArgs&) { return is_iterable(v) || (v.is_object() && v.object().is_callable()); }
bool t_sequence(Interpreter&, const Value& v, CallArgs&) {
  return v.is_undefined() || v.is_string() || v.is_dict() || (v.is_list() && has_length(v) && v.seq_kind() != SeqKind::DictItems &&
                                                               v.seq_kind() != SeqKind::DictKeys && v.seq_kind() != SeqKind::DictValues);
}
bool t_callable(Interpreter&, const Value& v, CallArgs&) {
  return v.is_function() || v.is_undefined() || (v.is_object() && v.object().is_callable());
}
bool t_escaped(Interpreter&, const Value& v, CallArgs&) { return v.is_safe(); }
bool t_lower(Interpreter&, const Value& v, CallArgs&) { return str_is_case(to_str(v), true); }
bool t_upper(Interpreter&, const Value& v, CallArgs&) { return str_is_case(to_str(v), false); }
bool t_odd(Interpreter& in, const Value& v, CallArgs&) {
  return equal(binary_op(in, BinOp::Mod, v, Value::integer(2)), Value::integer(1));
}
bool t_even(Interpreter& in, const Value& v, CallArgs&) {
  return equal(binary_op(in, BinOp::Mod, v, Value::integer(2)), Value::integer(0));
}
bool t_divisibleby(Interpreter& in, const Value& v, CallArgs& a) {
  ArgBinder b("divisibleby", a, {"num"}, 1);
  return equal(binary_op(in, BinOp::Mod, v, *b.get(0)), Value::integer(0));
}
bool t_eq(Interpreter&, const Value& v, CallArgs& a) { return equal(v, one_arg(a, "eq")); }
bool t_ne(Interpreter&, const Value& v, CallArgs& a) { return !equal(v, one_arg(a, "ne")); }
bool t_lt(Interpreter&, const Value& v, CallArgs& a) { return compare(v, one_arg(a, "lt"), "<") < 0; }
bool t_le(Interpreter&, const Value& v, CallArgs& a) { return compare(v, one_arg(a, "le"), "<=") <= 0; }
bool t_gt(Interpreter&, const Value& v, CallArgs& a) { return compare(v, one_arg(a, "gt"), ">") > 0; }
bool t_ge(Interpreter&, const Value& v, CallArgs& a) { return compare(v, one_arg(a, "ge"), ">=") >= 0; }
bool t_in(Interpreter&, const Value& v, CallArgs& a) {
  ArgBinder b("in", a, {"seq"}, 1);
  return contains(*b.get(0), v);
}
bool t_sameas(Interpreter&, const Value& v, CallArgs& a) {
  ArgBinder b("sameas", a, {"other"}, 1);
  const Value& o = *b.get(0);
  if (v.type() != o.type()) return false;
  switch (v.type()) {
    case Value::Type::None: return true;
    case Value::Type::Bool: return v.as_bool() == o.as_bool();
    case Value::Type::Int: return v.as_int() == o.as_int() && v.as_int() >= -5 && v.as_int() <= 256;  // CPython's small ints
    default: return v.identity() != nullptr && v.identity() == o.identity();
  }
}
bool t_filter(Interpreter&, const Value& v, CallArgs&) { return v.is_string() && is_filter_name(v.str()); }
bool t_test(Interpreter&, const Value& v, CallArgs&) { return v.is_string() && is_test_name(v.str()); }

const std::unordered_map<std::string_view, TestFn>& tests() {
  static const std::unordered_map<std::string_view, TestFn> table = {
      {"defined", t_defined},   {"undefined", t_undefined}, {"none", t_none},
      {"boolean", t_boolean},   {"true", t_true},           {"false", t_false},
      {"integer", t_integer},   {"float", t_float},         {"number", t_number},
      {"string", t_string},     {"mapping", t_mapping},     {"iterable", t_iterable},
      {"sequence", t_sequence}, {"callable", t_callable},   {"escaped", t_escaped},
      {"lower", t_lower},       {"upper", t_upper},         {"odd", t_odd},
      {"even", t_even},         {"divisibleby", t_divisibleby}, {"eq", t_eq},
      {"equalto", t_eq},        {"==", t_eq},               {"ne", t_ne},
      {"!=", t_ne},             {"lt", t_lt},               {"lessthan", t_lt},
      {"<", t_lt},              {"le", t_le},               {"<=", t_le},
      {"gt", t_gt},             {"greaterthan", t_gt},      {">", t_gt},
      {"ge", t_ge},             {">=", t_ge},               {"in", t_in},
      {"sameas", t_sameas},     {"filter", t_filter},       {"test", t_test},
  };
  return table;
}

// ---- globals ----------------------------------------------------------------------------

constexpr int64_t kMaxRange = 100000;  // jinja2.sandbox.MAX_RANGE

Value g_range(Interpreter&, CallArgs& a) {
  if (!a.kwargs.empty()) raise("TypeError", "range() takes no keyword arguments");
  if (a.args.empty() || a.args.size() > 3)
    raise("TypeError", "range expected at least 1 argument, got " + std::to_string(a.args.size()));
  int64_t p[3] = {0, 0, 0};
  for (size_t i = 0; i < a.args.size(); ++i) {
    if (a.args[i].is_undefined()) raise_undefined(a.args[i]);
    if (!a.args[i].is_integral())
      raise("TypeError", "'" + type_name(a.args[i]) + "' object cannot be interpreted as an integer");
    p[i] = a.args[i].as_int();
  }
  int64_t start = 0, stop, stp = 1;
  if (a.args.size() == 1) {
    stop = p[0];
  } else {
    start = p[0];
    stop = p[1];
    if (a.args.size() == 3) stp = p[2];
  }
  if (stp == 0) raise("ValueError", "range() arg 3 must not be zero");
  // In uint64, where the distance between any two int64 fits and wraps are defined.
  uint64_t count = 0;
  const uint64_t magnitude = stp > 0 ? static_cast<uint64_t>(stp) : 0 - static_cast<uint64_t>(stp);
  if (stp > 0 && start < stop) count = (static_cast<uint64_t>(stop) - static_cast<uint64_t>(start) - 1) / magnitude + 1;
  if (stp < 0 && start > stop) count = (static_cast<uint64_t>(start) - static_cast<uint64_t>(stop) - 1) / magnitude + 1;
  if (count > kMaxRange)
    raise("OverflowError", "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  auto data = std::make_shared<ListData>();
  data->kind = SeqKind::Range;
  data->range_start = start;
  data->range_stop = stop;
  data->range_step = stp;
  data->items.reserve(count);
  // Every element lies between start and stop; only the step past the last one could overflow.
  uint64_t x = static_cast<uint64_t>(start);
  for (uint64_t i = 0; i < count; ++i, x += static_cast<uint64_t>(stp))
    data->items.push_back(Value::integer(static_cast<int64_t>(x)));
  return Value::list(std::move(data));
}

Value g_dict(Interpreter&, CallArgs& a) { return Value::dict(dict_items_from(a, "dict")); }

Value g_namespace(Interpreter& in, CallArgs& a) {
  auto ns = std::make_shared<Namespace>();
  for (auto& [k, v] : dict_items_from(a, "namespace")) {
    if (!k.is_string()) raise("TypeError", "keywords must be strings");
    ns->set(k.str(), std::move(v));
  }
  in.track(ns);
  return Value::object(std::move(ns));
}

Value g_cycler(Interpreter& in, CallArgs& a) {
  if (a.args.empty()) raise("RuntimeError", "at least one item has to be provided");
  auto c = std::make_shared<Cycler>(a.args);
  in.track(c);
  return Value::object(std::move(c));
}

Value g_joiner(Interpreter&, CallArgs& a) {
  ArgBinder b("joiner", a, {"sep"});
  const std::string sep = b.has(0) ? to_str(*b.get(0)) : ", ";
  auto used = std::make_shared<bool>(false);
  return Value::function("joiner", [sep, used](Interpreter&, CallArgs&) {
    if (!*used) {
      *used = true;
      return Value::string("");
    }
    return Value::string(sep);
  }, "<jinja2.utils.Joiner object>");
}

Value g_raise_exception(Interpreter&, CallArgs& a) {
  ArgBinder b("raise_exception", a, {"message"}, 1);
  throw TemplateError(to_str(*b.get(0)));
}

Value g_strftime_now(Interpreter& in, CallArgs& a) {
  ArgBinder b("strftime_now", a, {"format"}, 1);
  const std::string& fmt = need_str(*b.get(0), "strftime_now");
  std::tm tm{};
  if (in.options().now) {
    tm = *in.options().now;
  } else {
    const std::time_t t = std::time(nullptr);
    localtime_r(&t, &tm);
  }
  if (fmt.empty()) return Value::string("");
  // A marker keeps an empty expansion distinguishable from a too-small buffer.
  const std::string f = fmt + "\x01";
  std::string buf(64 + fmt.size() * 4, '\0');
  for (int attempt = 0; attempt < 8; ++attempt) {
    const size_t n = std::strftime(buf.data(), buf.size(), f.c_str(), &tm);
    if (n > 0) return Value::string(buf.substr(0, n - 1));
    buf.resize(buf.size() * 4);
  }
  raise("ValueError", "strftime format too long");
}

}  // namespace

bool is_filter_name(std::string_view name) { return filters().count(name) > 0; }
bool is_test_name(std::string_view name) { return tests().count(name) > 0; }

Value apply_filter(Interpreter& in, std::string_view name, const Value& input, CallArgs& args) {
  auto it = filters().find(name);
  if (it == filters().end()) raise("TemplateRuntimeError", "No filter named " + text::py_repr(name) + ".");
  in.step();
  charge_scan(input);
  return it->second(in, input, args);
}

bool apply_test(Interpreter& in, std::string_view name, const Value& input, CallArgs& args) {
  auto it = tests().find(name);
  if (it == tests().end()) raise("TemplateRuntimeError", "No test named " + text::py_repr(name) + ".");
  in.step();
  charge_scan(input);
  return it->second(in, input, args);
}

std::vector<std::pair<std::string, Value>> make_globals() {
  return {
      {"range", Value::function("range", g_range, "<class 'range'>")},
      {"dict", Value::function("dict", g_dict, "<class 'dict'>")},
      {"namespace", Value::function("namespace", g_namespace, "<class 'jinja2.utils.Namespace'>")},
      {"cycler", Value::function("cycler", g_cycler, "<class 'jinja2.utils.Cycler'>")},
      {"joiner", Value::function("joiner", g_joiner, "<class 'jinja2.utils.Joiner'>")},
      {"raise_exception", Value::function("raise_exception", g_raise_exception)},
      {"strftime_now", Value::function("strftime_now", g_strftime_now)},
  };
}

}  // namespace pagellm::jinja
