#include "api/json_fields.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "core/error.h"

namespace pagellm {
namespace {

using nlohmann::json;

// The value as the client wrote it, cut short: the message must stay small.
std::string shown(const json& v) { return cut_for_message(v.dump(-1, ' ', false, json::error_handler_t::replace)); }

std::string range_text(const FloatRange& r) {
  if (std::isinf(r.hi)) return fmt::format("a finite number {} {}", r.lo_open ? ">" : ">=", r.lo);
  return fmt::format("a number in {}{}, {}]", r.lo_open ? "(" : "[", r.lo, r.hi);
}

}  // namespace

const char* json_type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "a list";
    case json::value_t::object: return "an object";
    case json::value_t::number_float: return "a fractional number";
    default: return "a number";
  }
}

std::string cut_for_message(const std::string& s, size_t max_bytes) {
  if (s.size() <= max_bytes) return s;
  size_t n = max_bytes > 3 ? max_bytes - 3 : 0;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;  // not inside a character
  return s.substr(0, n) + "...";
}

bool has_field(const json& body, const char* key) {
  if (!body.is_object()) return false;
  const auto it = body.find(key);
  return it != body.end() && !it->is_null();
}

int64_t json_to_int(const json& v, const std::string& label, const char* param, int64_t lo, int64_t hi) {
  auto out_of_range = [&]() {
    throw InvalidRequest(fmt::format("'{}' must be an integer in [{}, {}], got {}", label, lo, hi, shown(v)), param);
  };
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (hi < 0 || u > static_cast<uint64_t>(hi)) out_of_range();
    const auto i = static_cast<int64_t>(u);
    if (i < lo) out_of_range();
    return i;
  }
  if (v.is_number_integer()) {
    const auto i = v.get<int64_t>();
    if (i < lo || i > hi) out_of_range();
    return i;
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d) || std::trunc(d) != d)
      throw InvalidRequest(fmt::format("'{}' must be an integer, got {}", label, shown(v)), param);
    // [-2^63, 2^63) is exactly what int64_t holds; compare before converting.
    if (d < -0x1p63 || d >= 0x1p63) out_of_range();
    const auto i = static_cast<int64_t>(d);
    if (i < lo || i > hi) out_of_range();
    return i;
  }
  throw InvalidRequest(fmt::format("'{}' must be an integer, got {}", label, json_type_name(v)), param);
}

int32_t json_to_token_id(const json& v, const std::string& label, const char* param, int32_t vocab_size) {
  constexpr int64_t kMaxId = std::numeric_limits<int32_t>::max();
  if (vocab_size <= 0) return static_cast<int32_t>(json_to_int(v, label, param, 0, kMaxId));  // no vocabulary known
  if (!v.is_number())
    throw InvalidRequest(fmt::format("'{}' must be a token id, got {}", label, json_type_name(v)), param);
  try {
    return static_cast<int32_t>(json_to_int(v, label, param, 0, vocab_size - 1));
  } catch (const InvalidRequest&) {
    throw InvalidRequest(fmt::format("'{}' must be a token id of this model's vocabulary, in [0, {}], got {}", label,
                                     vocab_size - 1, shown(v)),
                         param);
  }
}

std::vector<int32_t> json_to_token_ids(const json& list, const std::string& label, const char* param,
                                       int32_t vocab_size) {
  if (!list.is_array())
    throw InvalidRequest(fmt::format("'{}' must be a list of token ids, got {}", label, json_type_name(list)), param);
  std::vector<int32_t> ids;
  ids.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i)
    ids.push_back(json_to_token_id(list[i], fmt::format("{}[{}]", label, i), param, vocab_size));
  return ids;
}

int64_t get_int_field(const json& body, const char* key, int64_t fallback, int64_t lo, int64_t hi) {
  if (!has_field(body, key)) return fallback;
  return json_to_int(body[key], key, key, lo, hi);
}

float json_to_float(const json& v, const std::string& label, const char* param, FloatRange range) {
  if (!v.is_number())
    throw InvalidRequest(fmt::format("'{}' must be {}, got {}", label, range_text(range), json_type_name(v)), param);
  const double d = v.get<double>();
  // Written so that NaN fails: every comparison with NaN is false.
  const bool above_lo = range.lo_open ? d > range.lo : d >= range.lo;
  const bool fits = std::isfinite(d) && std::fabs(d) <= std::numeric_limits<float>::max();
  if (!fits || !above_lo || !(d <= range.hi))
    throw InvalidRequest(fmt::format("'{}' must be {}, got {}", label, range_text(range), shown(v)), param);
  return static_cast<float>(d);
}

float get_float_field(const json& body, const char* key, float fallback, FloatRange range) {
  if (!has_field(body, key)) return fallback;
  return json_to_float(body[key], key, key, range);
}

bool get_bool_field(const json& body, const char* key, bool fallback) {
  if (!has_field(body, key)) return fallback;
  const json& v = body[key];
  if (!v.is_boolean()) throw InvalidRequest(fmt::format("'{}' must be a boolean, got {}", key, json_type_name(v)), key);
  return v.get<bool>();
}

}  // namespace pagellm
