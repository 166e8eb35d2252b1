// Prompt logprobs (vLLM's prompt_logprobs, OpenAI's echo with logprobs): how
// likely the model found each prompt token given the ones before it, from
// the logits of the position before it. Evaluation harnesses sum these over
// a continuation to score it (log-likelihood tasks).
#pragma once

#include <cstdint>

#include "engine/engine.h"

namespace pagellm {

// log_softmax(row)[token] with the token's rank (1: the most likely; tokens
// with an equal logit count as ahead of it, as vLLM counts) and the k most
// likely tokens (logprob descending, ties: lower id first). Non-finite
// logits count as -inf. Throws Error for a token outside [0, vocab).
TokenLogprob token_logprob(const float* row, int32_t vocab, int32_t token, int32_t k);

}  // namespace pagellm
