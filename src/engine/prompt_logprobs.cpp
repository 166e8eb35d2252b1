#include "engine/prompt_logprobs.h"

#include <cmath>
#include <limits>

#include "core/error.h"
#include "sampling/sampler.h"

namespace pagellm {

TokenLogprob token_logprob(const float* row, int32_t vocab, int32_t token, int32_t k) {
  PAGELLM_CHECK(token >= 0 && token < vocab, "prompt logprobs: token id {} is outside the vocabulary [0, {})", token,
                vocab);
  TokenLogprob lp;
  lp.token = token;
  // The same normalizer (and float arithmetic) as the top tokens' logprobs,
  // so a token that is the most likely has exactly the top entry's value.
  const float log_norm = log_softmax_topk(row, vocab, k, lp.top);
  const auto value = [](float x) { return std::isfinite(x) ? x : -std::numeric_limits<float>::infinity(); };
  const float v = value(row[token]);
  lp.logprob = std::isfinite(v) ? v - log_norm : -std::numeric_limits<float>::infinity();
  int32_t at_least = 0;
  for (int32_t i = 0; i < vocab; ++i) at_least += value(row[i]) >= v ? 1 : 0;
  lp.rank = at_least;
  return lp;
}

}  // namespace pagellm
