// What the engine tests share: running an engine to the end while checking
// its invariants, collecting each sample's output, and a greedy request.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace pagellm::test {

// The tiny random-weight Llama (F32, one thread): fast and exact enough for
// engine-level tests.
inline EngineConfig tiny_engine_config(int32_t max_model_len = 512) {
  EngineConfig c;
  c.load_format = "dummy";
  c.dummy_shape = "tiny-llama";
  c.dummy_type = DType::F32;
  c.backend_options["threads"] = "1";
  c.scheduler.max_model_len = max_model_len;
  return c;
}

struct Result {
  std::vector<int32_t> tokens;
  std::string text;
  std::vector<float> logprobs;  // one per token when the request asked for them
  FinishReason reason = FinishReason::None;
  std::string stop_string;
};
using Results = std::map<std::string, std::vector<Result>>;  // request id -> one per sample

// Steps until every request is done, checking the KV invariants each step.
// flush_kv_tier: each step's KV offload stores are written before the next
// step, so that what the tier holds does not depend on how fast its I/O
// thread runs beside the test.
inline Results run_all(Engine& engine, int64_t* peak_running = nullptr, bool flush_kv_tier = false) {
  Results results;
  while (engine.has_unfinished()) {
    for (RequestOutput& out : engine.step()) {
      EXPECT_TRUE(out.error.empty()) << out.error;
      auto& samples = results[out.request_id];
      for (const CompletionDelta& d : out.completions) {
        if (samples.size() <= static_cast<size_t>(d.index)) samples.resize(d.index + 1);
        Result& r = samples[d.index];
        r.tokens.insert(r.tokens.end(), d.token_ids.begin(), d.token_ids.end());
        r.text += d.text;
        for (const TokenLogprob& lp : d.logprobs) r.logprobs.push_back(lp.logprob);
        if (d.finish_reason != FinishReason::None) {
          r.reason = d.finish_reason;
          r.stop_string = d.stop_string;
        }
      }
    }
    engine.check_invariants();
    if (flush_kv_tier) engine.flush_kv_offload();
    if (peak_running) *peak_running = std::max(*peak_running, engine.metrics().num_requests_running);
  }
  return results;
}

// Greedy, ignore_eos: exactly max_tokens tokens.
inline EngineRequest make_request(const std::string& id, std::vector<int32_t> prompt, int max_tokens) {
  EngineRequest r;
  r.id = id;
  r.prompt_ids = std::move(prompt);
  r.params.temperature = 0;
  r.params.max_tokens = max_tokens;
  r.params.ignore_eos = true;
  return r;
}

}  // namespace pagellm::test
