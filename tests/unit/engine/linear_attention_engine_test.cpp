// An engine over a model with linear-attention (Gated DeltaNet) layers:
// what it cannot do yet is refused by name (speculative decoding works:
// tests/unit/engine/spec_engine_test.cpp), prefix caching is turned off, and
// a request's greedy tokens do not depend on what else is in the batch.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "engine/engine.h"
#include "engine_test_util.h"

namespace pagellm {
namespace {

EngineConfig qwen35_config() {
  EngineConfig c = test::tiny_engine_config(256);
  c.dummy_shape = "tiny-qwen35";
  c.backend_options["threads"] = "2";
  c.deterministic = true;  // rows' bits do not depend on the batch: greedy ties cannot flip
  return c;
}

void expect_refused(const EngineConfig& c, const std::string& words) {
  try {
    Engine e(c);
    ADD_FAILURE() << "not refused: " << words;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

TEST(LinearAttentionEngine, RefusesWhatItsStatesCannotFollow) {
  EngineConfig swap = qwen35_config();
  swap.scheduler.preemption_mode = PreemptionMode::Swap;
  expect_refused(swap, "--preemption-mode swap is not supported for qwen35");
  EngineConfig evict = qwen35_config();
  evict.scheduler.kv_eviction = KvEviction::Sliding;
  expect_refused(evict, "--kv-eviction sliding is not supported for qwen35");
}

// Prefix caching is asked for (the default) and turned off; the same prompts
// alone and together, with a repeated prefix, give the same greedy tokens.
TEST(LinearAttentionEngine, GreedyTokensDoNotDependOnTheBatch) {
  EngineConfig c = qwen35_config();
  c.enable_prefix_caching = true;
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> prompt;
    for (int t = 0; t < 20 + 9 * i; ++t) prompt.push_back(3 + (t * 31 + (t < 16 ? 0 : i * 7)) % 500);
    reqs.push_back(test::make_request("r" + std::to_string(i), prompt, 8));
  }
  test::Results alone;
  {
    Engine engine(c);
    for (const EngineRequest& r : reqs) {
      engine.add_request(r);
      for (auto& [id, samples] : test::run_all(engine)) alone[id] = samples;
    }
  }
  EngineConfig batched = c;
  batched.scheduler.max_num_batched_tokens = 40;  // chunked prefill, mixed with decodes
  Engine engine(batched);
  for (const EngineRequest& r : reqs) engine.add_request(r);
  const test::Results together = test::run_all(engine);
  for (const auto& [id, samples] : alone) {
    ASSERT_EQ(samples[0].tokens.size(), 8u) << id;
    EXPECT_EQ(samples[0].tokens, together.at(id)[0].tokens) << id;
  }
}

// The states are a kind of KV-cache memory of their own: the start-up line
// and the metrics count them beside the blocks.
TEST(LinearAttentionEngine, StateSlotsAreCountedBesideTheBlocks) {
  EngineConfig c = qwen35_config();
  c.scheduler.max_num_seqs = 8;
  Engine engine(c);
  EXPECT_NE(engine.describe().find("linear-attention states: 8 slots x "), std::string::npos) << engine.describe();
  for (int i = 0; i < 3; ++i)
    engine.add_request(test::make_request("r" + std::to_string(i), {5, 9, 31, int32_t(40 + i)}, 6));
  (void)engine.step();
  EngineMetrics m = engine.stats().metrics;
  EXPECT_EQ(m.kv_state_slots_total, 8);
  EXPECT_EQ(m.kv_state_slots_used, 3);
  (void)test::run_all(engine);
  m = engine.stats().metrics;
  EXPECT_EQ(m.kv_state_slots_used, 0);
}

}  // namespace
}  // namespace pagellm
