#include "sampling/sampling_params.h"

#include <fmt/format.h>

#include <cmath>

#include "core/request_limits.h"
#include "core/error.h"

namespace pagellm {

namespace {

// The engine's own bounds are the API's defaults (core/request_limits.h).
constexpr int32_t kMaxN = RequestLimits{}.max_n;
constexpr int32_t kMaxLogprobs = RequestLimits{}.max_logprobs;
constexpr float kMaxPenalty = 2.0f;
constexpr float kMaxLogitBias = 100.0f;

// Comparisons are written so that NaN fails them: `!(x >= lo)` is true for NaN.
[[noreturn]] void reject(const char* param, const std::string& msg) {
  throw InvalidRequest(fmt::format("{} {}", param, msg), param);
}

void check_token_id(const char* param, int32_t id, int32_t vocab_size) {
  if (id < 0) reject(param, fmt::format("token ids must be >= 0, got {}", id));
  if (vocab_size > 0 && id >= vocab_size)
    reject(param, fmt::format("token ids must be < vocabulary size {}, got {}", vocab_size, id));
}

}  // namespace

void SamplingParams::validate(int32_t vocab_size) const {
  if (!std::isfinite(temperature) || !(temperature >= 0.0f))
    reject("temperature", fmt::format("must be a finite number >= 0, got {}", temperature));
  if (!(top_p > 0.0f && top_p <= 1.0f))
    reject("top_p", fmt::format("must be in (0, 1], got {}", top_p));
  if (top_k < -1)
    reject("top_k", fmt::format("must be -1 or 0 (disable) or at least 1, got {}", top_k));
  if (!(min_p >= 0.0f && min_p <= 1.0f))
    reject("min_p", fmt::format("must be in [0, 1], got {}", min_p));
  if (!std::isfinite(repetition_penalty) || !(repetition_penalty > 0.0f))
    reject("repetition_penalty", fmt::format("must be a finite number > 0, got {}", repetition_penalty));
  if (!(presence_penalty >= -kMaxPenalty && presence_penalty <= kMaxPenalty))
    reject("presence_penalty", fmt::format("must be in [-2, 2], got {}", presence_penalty));
  if (!(frequency_penalty >= -kMaxPenalty && frequency_penalty <= kMaxPenalty))
    reject("frequency_penalty", fmt::format("must be in [-2, 2], got {}", frequency_penalty));
  for (const auto& [id, bias] : logit_bias) {
    check_token_id("logit_bias", id, vocab_size);
    if (!(bias >= -kMaxLogitBias && bias <= kMaxLogitBias))
      reject("logit_bias", fmt::format("values must be in [-100, 100], got {} for token {}", bias, id));
  }
  if (logprobs < -1 || logprobs > kMaxLogprobs)
    reject("logprobs", fmt::format("must be in [0, {}] (or -1 for none), got {}", kMaxLogprobs, logprobs));
  if (prompt_logprobs < -1 || prompt_logprobs > kMaxLogprobs)
    reject("prompt_logprobs",
           fmt::format("must be in [0, {}] (or -1 for none), got {}", kMaxLogprobs, prompt_logprobs));
  if (max_tokens < 1) reject("max_tokens", fmt::format("must be >= 1, got {}", max_tokens));
  if (min_tokens < 0) reject("min_tokens", fmt::format("must be >= 0, got {}", min_tokens));
  if (min_tokens > max_tokens)
    reject("min_tokens",
           fmt::format("must be <= max_tokens ({}), got {}", max_tokens, min_tokens));
  for (size_t i = 0; i < stop.size(); ++i)
    if (stop[i].empty()) reject("stop", fmt::format("strings must not be empty (entry {})", i));
  for (int32_t id : stop_token_ids) check_token_id("stop_token_ids", id, vocab_size);
  if (n < 1 || n > kMaxN) reject("n", fmt::format("must be in [1, {}], got {}", kMaxN, n));
}

}  // namespace pagellm
