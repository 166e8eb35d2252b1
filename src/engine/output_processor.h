// What happens to a token once the sampler picked it (vLLM V1's
// OutputProcessor): it is appended to its sample, with its logprobs; the stop
// checks run (grammar, stop token ids, end of generation, stop strings on the
// incrementally detokenized text, max_tokens, the context's end); a finished
// sample releases the text held back for a possible stop string; and the news
// of a request's n samples is collected into one RequestOutput. Keeps the
// token and latency metrics. Knows nothing of schedulers' queues or logits.
#pragma once

#include <cstdint>

#include "engine/engine.h"
#include "engine/request_state.h"

namespace pagellm {

class OutputProcessor {
 public:
  OutputProcessor(const Tokenizer& tokenizer, EngineMetrics& metrics) : tokenizer_(tokenizer), metrics_(metrics) {}

  // A new request: each sample's detokenizer, stop checker and output index.
  void add(RequestState& r);
  // Appends the sampled `token` to sample s and decides whether s stops
  // (pending_finish: it takes effect in finish(), once the step is done).
  // The scheduler says where the context ends.
  void append(RequestState& r, SampleState& s, int32_t token, const SampleResult& res, const Scheduler& scheduler);
  // Ends sample s for `reason`; text held back is final now, unless a stop
  // string ended it. No-op for a finished sample.
  void finish(RequestState& r, SampleState& s, FinishReason reason);
  // Ends every unfinished sample of an aborted request (held text is dropped).
  void abort(RequestState& r);
  // The news since the last call: a delta per sample that has some. Finished
  // once every sample is; a finished request's latency and finish reason
  // count in the metrics (the caller forgets the request).
  RequestOutput collect(RequestState& r);

 private:
  const Tokenizer& tokenizer_;
  EngineMetrics& metrics_;
};

}  // namespace pagellm
