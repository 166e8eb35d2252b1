#include "api/request_params.h"

#include <fmt/format.h>

#include <limits>

#include "api/json_fields.h"
#include "core/error.h"

namespace pagellm {
namespace {

using nlohmann::json;

constexpr int64_t kInt32Min = std::numeric_limits<int32_t>::min();
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr double kInf = std::numeric_limits<double>::infinity();

int32_t get_int32(const json& body, const char* key, int32_t fallback, int64_t lo, int64_t hi = kInt32Max) {
  return static_cast<int32_t>(get_int_field(body, key, fallback, lo, hi));
}

void read_stop(const json& body, const RequestLimits& limits, SamplingParams& p) {
  if (!has_field(body, "stop")) return;
  const json& v = body["stop"];
  const char* shape = "'stop' must be a string or a list of strings";
  if (v.is_string()) {
    p.stop.push_back(v.get<std::string>());
  } else if (v.is_array()) {
    if (v.size() > limits.max_stop_strings)
      throw InvalidRequest(
          fmt::format("'stop' holds {} strings; at most {} are allowed", v.size(), limits.max_stop_strings), "stop");
    for (const auto& s : v) {
      if (!s.is_string()) throw InvalidRequest(shape, "stop");
      p.stop.push_back(s.get<std::string>());
    }
  } else {
    throw InvalidRequest(shape, "stop");
  }
  for (size_t i = 0; i < p.stop.size(); ++i) {
    if (p.stop[i].empty()) throw InvalidRequest(fmt::format("'stop' strings must not be empty (entry {})", i), "stop");
    if (p.stop[i].size() > limits.max_stop_string_bytes)
      throw InvalidRequest(fmt::format("'stop' entry {} is {} bytes long; at most {} bytes are allowed", i,
                                       p.stop[i].size(), limits.max_stop_string_bytes),
                           "stop");
  }
}

void read_stop_token_ids(const json& body, int32_t vocab_size, const RequestLimits& limits, SamplingParams& p) {
  if (!has_field(body, "stop_token_ids")) return;
  const json& v = body["stop_token_ids"];
  if (v.is_array() && v.size() > limits.max_stop_token_ids)
    throw InvalidRequest(fmt::format("'stop_token_ids' holds {} ids; at most {} are allowed", v.size(),
                                     limits.max_stop_token_ids),
                         "stop_token_ids");
  p.stop_token_ids = json_to_token_ids(v, "stop_token_ids", "stop_token_ids", vocab_size);
}

void read_logit_bias(const json& body, int32_t vocab_size, const RequestLimits& limits, SamplingParams& p) {
  if (!has_field(body, "logit_bias")) return;
  const json& v = body["logit_bias"];
  if (!v.is_object()) throw InvalidRequest("'logit_bias' must map token ids to numbers", "logit_bias");
  if (v.size() > limits.max_logit_bias)
    throw InvalidRequest(
        fmt::format("'logit_bias' holds {} entries; at most {} are allowed", v.size(), limits.max_logit_bias),
        "logit_bias");
  const int64_t max_id = vocab_size > 0 ? vocab_size - 1 : kInt32Max;
  for (const auto& [k, b] : v.items()) {
    const int64_t id = parse_token_id_key(k);
    if (id < 0 || id > max_id)
      throw InvalidRequest(fmt::format("'logit_bias' key '{}' is not a token id: keys must be decimal integers in "
                                       "[0, {}] with no sign, spaces or leading zeros",
                                       cut_for_message(k, 24), max_id),
                           "logit_bias");
    const float bias = json_to_float(b, fmt::format("logit_bias[\"{}\"]", id), "logit_bias", {-100.0, 100.0});
    p.logit_bias.emplace_back(static_cast<int32_t>(id), bias);
  }
}

// max_tokens (chat: max_completion_tokens wins when both are given); 0 with
// echo (completions) asks for the prompt alone.
void read_max_tokens(const json& body, bool chat, int32_t default_max_tokens, ParsedParams& out) {
  SamplingParams& p = out.sampling;
  p.max_tokens = default_max_tokens;
  const bool echo = !chat && get_bool_field(body, "echo", false);
  if (has_field(body, "max_tokens")) p.max_tokens = get_int32(body, "max_tokens", 0, echo ? 0 : 1);
  if (p.max_tokens == 0) {
    out.prompt_only = true;
    p.max_tokens = 1;
  }
  if (chat && has_field(body, "max_completion_tokens"))
    p.max_tokens = get_int32(body, "max_completion_tokens", 0, 1);
}

// Completions: logprobs = k. Chat: logprobs = true plus top_logprobs = k.
void read_logprobs(const json& body, bool chat, const RequestLimits& limits, SamplingParams& p) {
  if (!chat) {
    p.logprobs = get_int32(body, "logprobs", -1, 0, limits.max_logprobs);
  } else {
    const int32_t top = get_int32(body, "top_logprobs", 0, 0, limits.max_logprobs);
    if (get_bool_field(body, "logprobs", false))
      p.logprobs = top;
    else if (has_field(body, "top_logprobs"))
      throw InvalidRequest("'top_logprobs' needs 'logprobs': true", "top_logprobs");
  }
  // vLLM's: the logprob of each prompt token (after the first) and its top k.
  p.prompt_logprobs = get_int32(body, "prompt_logprobs", -1, 0, limits.max_logprobs);
}

}  // namespace

int64_t parse_token_id_key(const std::string& key) {
  // 10 digits hold every int32_t; longer is never a token id.
  if (key.empty() || key.size() > 10 || (key[0] == '0' && key.size() > 1)) return -1;
  int64_t id = 0;
  for (char c : key) {
    if (c < '0' || c > '9') return -1;
    id = id * 10 + (c - '0');
  }
  return id;
}

ParsedParams parse_request_params(const json& body, bool chat, int32_t vocab_size, int32_t default_max_tokens,
                                  const RequestLimits& limits) {
  if (!body.is_object()) throw InvalidRequest("the request body must be a JSON object");
  ParsedParams out;
  SamplingParams& p = out.sampling;
  p.temperature = get_float_field(body, "temperature", 1.0f, {0.0, kInf});
  p.top_p = get_float_field(body, "top_p", 1.0f, {0.0, 1.0, true});
  p.top_k = get_int32(body, "top_k", 0, -1);  // as vLLM: -1 or 0 for all tokens
  p.min_p = get_float_field(body, "min_p", 0.0f, {0.0, 1.0});
  p.presence_penalty = get_float_field(body, "presence_penalty", 0.0f, {-2.0, 2.0});
  p.frequency_penalty = get_float_field(body, "frequency_penalty", 0.0f, {-2.0, 2.0});
  p.repetition_penalty = get_float_field(body, "repetition_penalty", 1.0f, {0.0, kInf, true});
  p.n = get_int32(body, "n", 1, 1, limits.max_n);
  p.min_tokens = get_int32(body, "min_tokens", 0, 0);
  p.ignore_eos = get_bool_field(body, "ignore_eos", false);
  p.skip_special_tokens = get_bool_field(body, "skip_special_tokens", true);
  p.include_stop_str_in_output = get_bool_field(body, "include_stop_str_in_output", false);
  out.priority = get_int32(body, "priority", 0, kInt32Min);
  read_max_tokens(body, chat, default_max_tokens, out);
  if (has_field(body, "seed")) {
    // vLLM's range (a signed 64-bit integer); negative seeds keep their bits.
    const int64_t seed = json_to_int(body["seed"], "seed", "seed", std::numeric_limits<int64_t>::min(),
                                     std::numeric_limits<int64_t>::max());
    p.seed = static_cast<uint64_t>(seed);
  }
  read_stop(body, limits, p);
  read_stop_token_ids(body, vocab_size, limits, p);
  read_logit_bias(body, vocab_size, limits, p);
  read_logprobs(body, chat, limits, p);
  p.validate(vocab_size);
  return out;
}

}  // namespace pagellm
