// --deterministic: every row of logits a request samples from has the same
// bytes whether the request runs alone, in a batch of 64 that preempts and
// recomputes, or on one thread instead of two.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <tuple>

#include "engine/engine.h"
#include "engine_test_util.h"

namespace pagellm {
namespace {

// (request, sample, tokens output before the row) -> the row's bytes.
using LogitRows = std::map<std::tuple<std::string, int32_t, int32_t>, std::vector<float>>;

std::vector<EngineRequest> mixed_requests(int count) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> tok(3, 511);
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < count; ++i) {
    // Short and long prompts; long ones pass the attention's 256-key split.
    const int len = (i % 4 == 0) ? 300 + (i * 7) % 150 : 5 + (i * 13) % 90;
    std::vector<int32_t> prompt(static_cast<size_t>(len));
    for (auto& t : prompt) t = tok(rng);
    EngineRequest r = test::make_request("r" + std::to_string(i), std::move(prompt), 6);
    if (i % 3 == 1) {  // sampled, without a seed of its own
      r.params.temperature = 0.9f;
      r.params.top_p = 0.95f;
    }
    reqs.push_back(std::move(r));
  }
  return reqs;
}

struct RunResult {
  LogitRows rows;
  test::Results outputs;
  int64_t preemptions = 0;
};

RunResult run(EngineConfig c, const std::vector<EngineRequest>& reqs, bool alone) {
  RunResult res;
  c.logits_observer = [&](const std::string& id, int32_t sample, int32_t done, std::span<const float> row) {
    auto [it, fresh] = res.rows.try_emplace({id, sample, done}, row.begin(), row.end());
    EXPECT_TRUE(fresh) << id << " sampled twice after " << done << " tokens";
  };
  Engine engine(c);
  if (alone) {
    for (const EngineRequest& r : reqs) {
      engine.add_request(r);
      for (auto& [id, samples] : test::run_all(engine)) res.outputs[id] = samples;
    }
  } else {
    for (const EngineRequest& r : reqs) engine.add_request(r);
    res.outputs = test::run_all(engine);
  }
  res.preemptions = engine.metrics().num_preemptions;
  return res;
}

void expect_same(const RunResult& a, const RunResult& b, const char* what) {
  ASSERT_EQ(a.rows.size(), b.rows.size()) << what;
  for (const auto& [key, row] : a.rows) {
    const auto it = b.rows.find(key);
    ASSERT_NE(it, b.rows.end()) << what;
    ASSERT_EQ(row.size(), it->second.size());
    ASSERT_EQ(0, std::memcmp(row.data(), it->second.data(), row.size() * sizeof(float)))
        << what << ": request " << std::get<0>(key) << " after " << std::get<2>(key) << " tokens";
  }
  for (const auto& [id, samples] : a.outputs) EXPECT_EQ(samples[0].tokens, b.outputs.at(id)[0].tokens) << what << " " << id;
}

class Deterministic : public ::testing::TestWithParam<std::tuple<const char*, DType, DType>> {};

TEST_P(Deterministic, AloneBatchedPreemptedAndOneThreadGiveTheSameLogits) {
  const auto [shape, wtype, kv] = GetParam();
  EngineConfig c = test::tiny_engine_config(512);
  c.dummy_shape = shape;
  c.dummy_type = wtype;
  c.kv_cache_dtype = kv;
  c.deterministic = true;
  c.backend_options["threads"] = "2";
  const std::vector<EngineRequest> reqs = mixed_requests(64);

  const RunResult alone = run(c, reqs, true);
  EXPECT_EQ(alone.rows.size(), reqs.size() * 6);

  // All 64 at once in a pool too small for them: sequences are preempted,
  // and their prompts and outputs recomputed in prefill chunks.
  EngineConfig batched = c;
  batched.scheduler.max_num_batched_tokens = 384;
  batched.block_size = 16;
  {
    // The memory of 80 blocks of every layer (KV-cache groups make more,
    // smaller blocks of it where the model has sliding-window layers).
    EngineConfig ungrouped = c;
    ungrouped.kv_cache_groups = false;
    Engine probe(ungrouped);
    const KVCacheSpec& spec = probe.backend().kv_cache_spec();
    const int64_t block = static_cast<int64_t>(spec.bytes_per_block());
    // 1280 tokens for ~10k of requests, besides linear-attention states (Qwen3.5).
    batched.kv_cache_memory = block * 80 + static_cast<int64_t>(spec.state.bytes_per_slot()) * spec.state.num_slots;
  }
  const RunResult in_batch = run(batched, reqs, false);
  EXPECT_GT(in_batch.preemptions, 0);
  expect_same(alone, in_batch, "batch of 64 with preemption");

  EngineConfig one_thread = c;
  one_thread.backend_options["threads"] = "1";
  one_thread.scheduler.max_num_batched_tokens = 1000;
  expect_same(alone, run(one_thread, reqs, false), "one thread, batched");
}

INSTANTIATE_TEST_SUITE_P(Shapes, Deterministic,
                         ::testing::Values(std::make_tuple("tiny-llama", DType::Q4_K, DType::F16),
                                           std::make_tuple("tiny-gemma3", DType::F16, DType::I8),
                                           std::make_tuple("tiny-qwen3moe", DType::Q8_0, DType::F16),
                                           std::make_tuple("tiny-qwen35", DType::F16, DType::F16),
                                           std::make_tuple("tiny-qwen35moe", DType::Q8_0, DType::F16),
                                           std::make_tuple("tiny-deepseek3", DType::Q8_0, DType::F16),
                                           std::make_tuple("tiny-glm4moe", DType::Q8_0, DType::F16),
                                           std::make_tuple("tiny-qwen3next", DType::Q8_0, DType::F16),
                                           std::make_tuple("tiny-gemma4", DType::Q8_0, DType::I8),
                                           std::make_tuple("tiny-gemma4moe", DType::Q4_K, DType::F16),
                                           std::make_tuple("tiny-gemma4g", DType::Q4_K, DType::F16)));

TEST(Deterministic, SameSeedlessSampledOutputAcrossEngines) {
  EngineConfig c = test::tiny_engine_config(256);
  c.deterministic = true;
  EngineRequest r = test::make_request("a", {5, 6, 7, 8, 9}, 12);
  r.params.temperature = 1.0f;
  std::vector<int32_t> first;
  for (int run = 0; run < 2; ++run) {
    Engine engine(c);
    engine.add_request(r);
    const auto out = test::run_all(engine);
    if (run == 0) first = out.at("a")[0].tokens;
    else EXPECT_EQ(first, out.at("a")[0].tokens);
  }
}

}  // namespace
}  // namespace pagellm
