// Every bound on what one request may ask for and on how much may wait, with
// its default, in one place. `pagellm serve` exposes the ones an operator
// would tune as flags; the others are fixed by the API (logprobs <= 20) or are
// far above any real request and only stop a hostile body from costing
// seconds of CPU.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pagellm {

struct RequestLimits {
  // One request (HTTP 400 when exceeded).
  size_t max_prompts = 1024;                // prompts in one completions batch
  int32_t max_n = 128;                      // samples per prompt
  // prompts x n (--max-sequences-per-request). 256: the default --max-num-seqs,
  // so one request can still fill an idle server's seats (and n = 128 fits
  // twice), while it can take at most 1/32 of the waiting room.
  size_t max_sequences_per_request = 256;
  int32_t max_logprobs = 20;                // logprobs / top_logprobs, as OpenAI
  size_t max_stop_strings = 16;
  size_t max_stop_string_bytes = 1024;
  size_t max_stop_token_ids = 1024;
  size_t max_logit_bias = 1024;             // entries in logit_bias
  size_t max_messages = 10000;              // chat messages
  size_t max_chat_template_kwargs = 1024;   // top-level keys

  // Admission: what may wait for the engine (HTTP 503 + Retry-After when full).
  // "Waiting" means admitted but without its first output yet (queued or in prefill).
  size_t max_waiting_requests = 1024;   // API requests   (--max-waiting-requests)
  size_t max_waiting_sequences = 8192;  // their prompts x n (--max-waiting-sequences)
};

}  // namespace pagellm
