// Every bound on what one request may ask for and on how much may wait, with
// its default, in one place. `pagellm serve` exposes the ones an operator
// would tune as flags; the others are fixed by the API (logprobs <= 20) or are
// far above any real request and only stop a hostile body from costing
// seconds of CPU.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pagellm {

// A structured output's schema, regex, EBNF grammar, choice list or
// structural tag, however it arrives (an object or JSON text), before any
// grammar is built from it (HTTP 400 naming the field and the flag). Grammar
// construction and compilation grow with all three; within them a compile
// takes well under a second (docs/reliability.md has the measurements).
struct GrammarLimits {
  size_t max_bytes = size_t{64} << 10;  // its text                                  (--grammar-max-bytes)
  int32_t max_depth = 32;              // JSON nesting; regex groups; EBNF parentheses (--grammar-max-depth)
  int64_t max_nodes = 4096;            // JSON values; regex / EBNF atoms with repetition counts multiplied;
                                       // choices                                    (--grammar-max-nodes)
};
// The ceiling of --grammar-max-depth: xgrammar builds a grammar from a schema
// in time that grows faster than linearly with its depth, on the request's
// thread (a 900-level schema took over a minute; 128 levels, compile and
// answer included, about 2.5 s).
inline constexpr int32_t kMaxGrammarDepth = 128;

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
  GrammarLimits grammar;                    // structured outputs and tool schemas (engine flags)

  // Admission: what may wait for the engine (HTTP 503 + Retry-After when full).
  // "Waiting" means admitted but without its first output yet (queued or in prefill).
  size_t max_waiting_requests = 1024;   // API requests   (--max-waiting-requests)
  size_t max_waiting_sequences = 8192;  // their prompts x n (--max-waiting-sequences)
};

}  // namespace pagellm
