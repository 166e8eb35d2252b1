// An engine over a DeepSeek-shaped model (multi-head latent attention and
// routed experts): the cache holds one latent vector per token, its blocks
// are counted as the MLA kind, and a request's greedy tokens do not depend on
// what else is in the batch, on prefix-cache hits or on preemption.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "core/error.h"
#include "core/trace.h"
#include "engine/engine.h"
#include "engine_test_util.h"
#include "test_paths.h"

namespace pagellm {
namespace {

EngineConfig deepseek_config() {
  EngineConfig c = test::tiny_engine_config(256);
  c.dummy_shape = "tiny-deepseek3";
  c.backend_options["threads"] = "2";
  c.deterministic = true;  // rows' bits do not depend on the batch: greedy ties cannot flip
  return c;
}

std::vector<EngineRequest> prompts_with_a_shared_prefix() {
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> prompt;
    for (int t = 0; t < 20 + 9 * i; ++t) prompt.push_back(3 + (t * 31 + (t < 16 ? 0 : i * 7)) % 500);
    reqs.push_back(test::make_request("r" + std::to_string(i), prompt, 8));
  }
  return reqs;
}

test::Results run_alone(const EngineConfig& c, const std::vector<EngineRequest>& reqs) {
  test::Results alone;
  Engine engine(c);
  for (const EngineRequest& r : reqs) {
    engine.add_request(r);
    for (auto& [id, samples] : test::run_all(engine)) alone[id] = samples;
  }
  return alone;
}

TEST(MlaEngine, CacheHoldsOneLatentVectorPerTokenOfTheMlaKind) {
  EngineConfig c = deepseek_config();
  Engine engine(c);
  const KVCacheSpec& spec = engine.backend().kv_cache_spec();
  EXPECT_EQ(spec.n_kv_heads, 1);
  EXPECT_EQ(spec.head_dim, 32 + 256);  // qk_rope_head_dim + kv_lora_rank, not n_head * head dims
  EXPECT_TRUE(spec.v_is_k);            // stored once: the latent is its own value
  EXPECT_EQ(spec.bytes_per_block(), static_cast<size_t>(3 * 16 * 288 * 2));  // 3 layers, 16 tokens, F16
  engine.add_request(test::make_request("a", {5, 6, 7, 8, 9, 10, 11, 12}, 4));
  engine.step();
  EXPECT_GT(engine.metrics().kv_blocks_used_mla_latent, 0);
  EXPECT_EQ(engine.metrics().kv_blocks_used_full, 0);
  test::run_all(engine);
}

// Prefix caching on (a repeated prefix hits), chunked prefill mixed with
// decodes, and preemption (recompute) in a small pool: the same greedy tokens
// as each prompt alone.
TEST(MlaEngine, GreedyTokensDoNotDependOnTheBatch) {
  const EngineConfig c = deepseek_config();
  const std::vector<EngineRequest> reqs = prompts_with_a_shared_prefix();
  const test::Results alone = run_alone(c, reqs);

  EngineConfig batched = c;
  batched.enable_prefix_caching = true;
  batched.scheduler.max_num_batched_tokens = 40;
  EngineConfig preempted = batched;
  {
    Engine probe(c);
    // 10 blocks (160 tokens) for six requests of 28 to 73 tokens.
    preempted.scheduler.max_model_len = 128;
    preempted.kv_cache_memory = static_cast<int64_t>(probe.backend().kv_cache_spec().bytes_per_block()) * 10;
  }
  for (const EngineConfig* cfg : {&batched, &preempted}) {
    Engine engine(*cfg);
    for (const EngineRequest& r : reqs) engine.add_request(r);
    const test::Results together = test::run_all(engine);
    for (const auto& [id, samples] : alone) {
      ASSERT_EQ(samples[0].tokens.size(), 8u) << id;
      EXPECT_EQ(samples[0].tokens, together.at(id)[0].tokens) << id;
    }
    if (cfg == &preempted) EXPECT_GT(engine.metrics().num_preemptions, 0);
  }
}

// The ops a run recorded (--trace's events) with tracing on.
std::set<std::string> traced_ops(const EngineConfig& c, const std::string& name) {
  trace::enable(true);
  {
    Engine engine(c);
    std::vector<int32_t> prompt;
    for (int t = 0; t < 40; ++t) prompt.push_back(3 + t * 17 % 400);
    engine.add_request(test::make_request("a", prompt, 4));
    test::run_all(engine);
  }
  trace::enable(false);
  const std::string path = test::temp_dir() + "/" + name + ".json";
  trace::write(path);
  std::ifstream in(path);
  const nlohmann::json j = nlohmann::json::parse(in);
  std::set<std::string> names;
  for (const auto& e : j["traceEvents"]) names.insert(e["name"].get<std::string>());
  return names;
}

// A step of whole prompts takes the expanded form (each head's keys and
// values made from the latent, attention_kv); decode steps the absorbed one
// (attention over the latent cache); deterministic mode only the absorbed
// one, as the two round differently. (Both forms are checked against
// transformers by the HF fixtures: the whole prompt, then 7-token chunks.)
TEST(MlaEngine, WholePromptsTakeTheExpandedForm) {
  EngineConfig c = deepseek_config();
  const std::set<std::string> deterministic = traced_ops(c, "mla-deterministic");
  EXPECT_TRUE(deterministic.count("attention"));
  EXPECT_FALSE(deterministic.count("attention_kv"));
  c.deterministic = false;
  const std::set<std::string> fast = traced_ops(c, "mla-fast");
  EXPECT_TRUE(fast.count("attention_kv"));
  EXPECT_TRUE(fast.count("attention"));
}

}  // namespace
}  // namespace pagellm
