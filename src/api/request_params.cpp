#include "api/request_params.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "core/error.h"

namespace pagellm {
namespace {

using nlohmann::json;

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "boolean";
    case json::value_t::string: return "string";
    case json::value_t::array: return "array";
    case json::value_t::object: return "object";
    default: return "number";
  }
}

// Each getter: absent or null -> leave the default.
bool present(const json& body, const char* key) { return body.contains(key) && !body[key].is_null(); }

float get_number(const json& body, const char* key, float fallback) {
  if (!present(body, key)) return fallback;
  const json& v = body[key];
  if (!v.is_number()) throw InvalidRequest(fmt::format("'{}' must be a number, got {}", key, type_name(v)), key);
  const double d = v.get<double>();
  if (!std::isfinite(d)) throw InvalidRequest(fmt::format("'{}' must be finite", key), key);
  return static_cast<float>(d);
}

int64_t get_int(const json& body, const char* key, int64_t fallback) {
  if (!present(body, key)) return fallback;
  const json& v = body[key];
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::floor(d) == d && std::fabs(d) < 9e15) return static_cast<int64_t>(d);
  }
  throw InvalidRequest(fmt::format("'{}' must be an integer, got {}", key, type_name(v)), key);
}

int32_t get_int32(const json& body, const char* key, int32_t fallback) {
  const int64_t v = get_int(body, key, fallback);
  if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max())
    throw InvalidRequest(fmt::format("'{}' is out of range: {}", key, v), key);
  return static_cast<int32_t>(v);
}

bool get_bool(const json& body, const char* key, bool fallback) {
  if (!present(body, key)) return fallback;
  const json& v = body[key];
  if (!v.is_boolean()) throw InvalidRequest(fmt::format("'{}' must be a boolean, got {}", key, type_name(v)), key);
  return v.get<bool>();
}

}  // namespace

ParsedParams parse_request_params(const json& body, bool chat, int32_t vocab_size, int32_t default_max_tokens) {
  if (!body.is_object()) throw InvalidRequest("the request body must be a JSON object");
  ParsedParams out;
  SamplingParams& p = out.sampling;
  p.temperature = get_number(body, "temperature", 1.0f);
  p.top_p = get_number(body, "top_p", 1.0f);
  p.top_k = get_int32(body, "top_k", 0);
  p.min_p = get_number(body, "min_p", 0.0f);
  p.presence_penalty = get_number(body, "presence_penalty", 0.0f);
  p.frequency_penalty = get_number(body, "frequency_penalty", 0.0f);
  p.repetition_penalty = get_number(body, "repetition_penalty", 1.0f);
  p.n = get_int32(body, "n", 1);
  p.min_tokens = get_int32(body, "min_tokens", 0);
  p.ignore_eos = get_bool(body, "ignore_eos", false);
  p.skip_special_tokens = get_bool(body, "skip_special_tokens", true);
  p.include_stop_str_in_output = get_bool(body, "include_stop_str_in_output", false);
  out.priority = get_int32(body, "priority", 0);

  // max_tokens (chat: max_completion_tokens wins when both are given).
  int64_t max_tokens = get_int(body, "max_tokens", -1);
  if (chat && present(body, "max_completion_tokens")) max_tokens = get_int(body, "max_completion_tokens", -1);
  if (max_tokens == -1) max_tokens = default_max_tokens;
  else if (max_tokens < 1)
    throw InvalidRequest(fmt::format("max_tokens must be at least 1, got {}", max_tokens),
                         chat && present(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens");
  p.max_tokens = static_cast<int32_t>(std::min<int64_t>(max_tokens, std::numeric_limits<int32_t>::max()));

  if (present(body, "seed")) {
    const json& v = body["seed"];
    if (!v.is_number_integer()) throw InvalidRequest("'seed' must be an integer", "seed");
    p.seed = v.is_number_unsigned() ? v.get<uint64_t>() : static_cast<uint64_t>(v.get<int64_t>());
  }

  if (present(body, "stop")) {
    const json& v = body["stop"];
    if (v.is_string()) {
      p.stop.push_back(v.get<std::string>());
    } else if (v.is_array()) {
      if (v.size() > 16) throw InvalidRequest("'stop' may hold at most 16 strings", "stop");
      for (const auto& s : v) {
        if (!s.is_string()) throw InvalidRequest("'stop' must be a string or a list of strings", "stop");
        p.stop.push_back(s.get<std::string>());
      }
    } else {
      throw InvalidRequest("'stop' must be a string or a list of strings", "stop");
    }
  }
  if (present(body, "stop_token_ids")) {
    const json& v = body["stop_token_ids"];
    if (!v.is_array()) throw InvalidRequest("'stop_token_ids' must be a list of integers", "stop_token_ids");
    for (const auto& t : v) {
      if (!t.is_number_integer()) throw InvalidRequest("'stop_token_ids' must be a list of integers", "stop_token_ids");
      p.stop_token_ids.push_back(t.get<int32_t>());
    }
  }
  if (present(body, "logit_bias")) {
    const json& v = body["logit_bias"];
    if (!v.is_object()) throw InvalidRequest("'logit_bias' must map token ids to numbers", "logit_bias");
    for (const auto& [k, b] : v.items()) {
      size_t used = 0;
      int64_t id = -1;
      try {
        id = std::stoll(k, &used);
      } catch (const std::exception&) {
      }
      if (used != k.size() || id < 0 || id > std::numeric_limits<int32_t>::max())
        throw InvalidRequest(fmt::format("logit_bias key '{}' is not a token id", k), "logit_bias");
      if (!b.is_number()) throw InvalidRequest(fmt::format("logit_bias value for {} must be a number", k), "logit_bias");
      p.logit_bias.emplace_back(static_cast<int32_t>(id), b.get<float>());
    }
  }

  // Log probabilities: completions: logprobs = k (int); chat: logprobs = bool
  // plus top_logprobs = k.
  if (chat) {
    if (get_bool(body, "logprobs", false)) p.logprobs = get_int32(body, "top_logprobs", 0);
    else if (present(body, "top_logprobs"))
      throw InvalidRequest("'top_logprobs' needs 'logprobs': true", "top_logprobs");
  } else if (present(body, "logprobs")) {
    p.logprobs = get_int32(body, "logprobs", -1);
    if (p.logprobs < 0) throw InvalidRequest(fmt::format("logprobs must be between 0 and 20, got {}", p.logprobs), "logprobs");
  }
  if (present(body, "prompt_logprobs")) throw InvalidRequest("'prompt_logprobs' is not supported", "prompt_logprobs");

  p.validate(vocab_size);
  return out;
}

}  // namespace pagellm
