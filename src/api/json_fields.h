// Exact reads of request fields. nlohmann keeps a JSON number as unsigned,
// signed or float; each getter accepts a value only when the target type and
// range hold it exactly, so 2^64-1 never wraps to -1 and 4294967298 never
// becomes token 2. Integer fields also take floats with an integral value
// (5.0, as pydantic does in vLLM) but not 5.5. Every failure is an
// InvalidRequest naming the field and what it must be.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace pagellm {

// "string", "boolean", ... for messages.
const char* json_type_name(const nlohmann::json& v);
// The key is there and not null (null means "use the default", as in OpenAI's SDKs).
bool has_field(const nlohmann::json& body, const char* key);
// `s` cut to at most `max_bytes` (then "...") on a UTF-8 character boundary, for messages.
std::string cut_for_message(const std::string& s, size_t max_bytes = 40);

// `v` as an integer in [lo, hi]. `label` is what the message calls the value
// (e.g. "stop_token_ids[3]"), `param` the field the error names.
int64_t json_to_int(const nlohmann::json& v, const std::string& label, const char* param, int64_t lo, int64_t hi);
// A token id of a vocabulary of `vocab_size` tokens: [0, vocab_size).
int32_t json_to_token_id(const nlohmann::json& v, const std::string& label, const char* param, int32_t vocab_size);
// A list of token ids (prompts, stop_token_ids); entry i is called "<label>[i]".
std::vector<int32_t> json_to_token_ids(const nlohmann::json& list, const std::string& label, const char* param,
                                       int32_t vocab_size);

// body[key] as above; `fallback` when absent or null.
int64_t get_int_field(const nlohmann::json& body, const char* key, int64_t fallback, int64_t lo, int64_t hi);

// A float range: [lo, hi], or (lo, hi] with lo_open; hi = infinity for none
// (the value must still be finite and fit a float).
struct FloatRange {
  double lo;
  double hi;
  bool lo_open = false;
};
float json_to_float(const nlohmann::json& v, const std::string& label, const char* param, FloatRange range);
float get_float_field(const nlohmann::json& body, const char* key, float fallback, FloatRange range);

bool get_bool_field(const nlohmann::json& body, const char* key, bool fallback);

}  // namespace pagellm
