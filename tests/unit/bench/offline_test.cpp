// Smoke tests of bench latency / throughput on a tiny random-weight model,
// in-process, a couple of iterations each.
#include "bench/offline.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "engine/engine.h"

namespace pagellm::bench {
namespace {

Engine& tiny_engine() {
  static Engine engine = [] {
    EngineConfig c;
    c.load_format = "dummy";
    c.dummy_shape = "tiny-llama";
    c.dummy_type = DType::F32;
    c.backend_options["threads"] = "1";
    c.kv_cache_memory = int64_t{16} << 20;
    c.scheduler.max_num_batched_tokens = 512;
    c.scheduler.max_model_len = 256;
    return Engine(c);
  }();
  return engine;
}

TEST(BenchOffline, RunBatchCountsTokens) {
  const BatchTiming t = run_batch(tiny_engine(), 3, 20, 5, 1);
  EXPECT_EQ(t.prompt_tokens, 60);
  EXPECT_EQ(t.output_tokens, 15);  // ignore_eos: exactly output_len each
  EXPECT_EQ(t.cached_tokens, 0);
  EXPECT_EQ(t.steps_to_first, 1);  // the whole batch prefilled in one step
  EXPECT_EQ(t.steps, 5);
  EXPECT_GT(t.first_token_s, 0);
  EXPECT_GE(t.end_s, t.first_token_s);
  EXPECT_FALSE(tiny_engine().has_unfinished());
}

TEST(BenchOffline, RunBatchRejectsBadSizesCleanly) {
  EXPECT_THROW(run_batch(tiny_engine(), 1, 300, 5, 1), InvalidRequest);  // longer than max_model_len
  EXPECT_THROW(run_batch(tiny_engine(), 0, 8, 5, 1), Error);
  EXPECT_FALSE(tiny_engine().has_unfinished());
}

TEST(BenchOffline, LatencySmoke) {
  LatencyOptions o;
  o.input_lens = {16, 48};
  o.output_len = 4;
  o.batch_size = 2;
  o.num_iters = 2;
  o.num_iters_warmup = 1;
  std::vector<std::string> logs;
  const auto cases = run_latency(tiny_engine(), o, [&](const std::string& s) { logs.push_back(s); });
  ASSERT_EQ(cases.size(), 2u);
  EXPECT_EQ(logs.size(), 6u);  // (1 warmup + 2) per length
  for (const LatencyCase& c : cases) {
    EXPECT_EQ(c.iterations.size(), 2u);
    EXPECT_EQ(c.prefill_tokens_per_s().size(), 2u);
    EXPECT_EQ(c.decode_tokens_per_s().size(), 2u);
    for (double v : c.prefill_tokens_per_s()) EXPECT_GT(v, 0);
    for (const BatchTiming& t : c.iterations) EXPECT_EQ(t.cached_tokens, 0);  // fresh prompts each time
  }
  const nlohmann::json j = latency_json(cases);
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[1]["input_len"], 48);
  EXPECT_EQ(j[1]["batch_size"], 2);
  for (const char* key : {"prefill_tokens_per_s", "decode_tokens_per_s", "prefill_s", "decode_s", "iterations"})
    EXPECT_TRUE(j[0].contains(key)) << key;
  EXPECT_EQ(j[0]["prefill_tokens_per_s"]["count"], 2);
  EXPECT_EQ(j[0]["iterations"].size(), 2u);
  EXPECT_EQ(j[0]["iterations"][0]["output_tokens"], 8);
  EXPECT_NE(latency_summary(cases).find("prefill tokens/s"), std::string::npos);
}

TEST(BenchOffline, DecodeRateDefinition) {
  LatencyCase c{100, 11, 2, {}};
  BatchTiming t;
  t.first_token_s = 0.5;
  t.end_s = 2.5;
  c.iterations = {t};
  EXPECT_DOUBLE_EQ(c.prefill_tokens_per_s()[0], 400.0);  // 2 x 100 / 0.5
  EXPECT_DOUBLE_EQ(c.decode_tokens_per_s()[0], 10.0);    // 2 x (11 - 1) / 2
  c.output_len = 1;
  EXPECT_TRUE(c.decode_tokens_per_s().empty());
}

TEST(BenchOffline, ThroughputSmoke) {
  ThroughputOptions o;
  o.num_prompts = 5;
  o.input_len = 12;
  o.output_len = 6;
  o.num_iters = 2;
  const auto runs = run_throughput(tiny_engine(), o);
  ASSERT_EQ(runs.size(), 2u);
  for (const ThroughputRun& r : runs) {
    EXPECT_EQ(r.timing.output_tokens, 30);
    EXPECT_EQ(r.timing.prompt_tokens, 60);
    EXPECT_GT(r.output_tokens_per_s(), 0);
    EXPECT_NEAR(r.total_tokens_per_s(), r.output_tokens_per_s() * 90 / 30, 1e-6 * r.total_tokens_per_s());
  }
  const nlohmann::json j = throughput_json(runs, o);
  for (const char* key : {"num_prompts", "input_len", "output_len", "elapsed_s", "requests_per_s", "total_tokens_per_s",
                          "output_tokens_per_s", "iterations"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_EQ(j["elapsed_s"]["count"], 2);
  EXPECT_NE(throughput_summary(runs, o).find("output tokens/s"), std::string::npos);
}

TEST(BenchOffline, OptionChecks) {
  LatencyOptions l;
  l.input_lens = {};
  EXPECT_THROW(l.validate(), Error);
  l.input_lens = {0};
  EXPECT_THROW(l.validate(), Error);
  ThroughputOptions t;
  t.num_prompts = 0;
  EXPECT_THROW(t.validate(), Error);
}

TEST(BenchOffline, MachineInfo) {
  const nlohmann::json j = machine_info();
  for (const char* key : {"cpu", "features", "hardware_threads", "loadavg", "time_utc"}) EXPECT_TRUE(j.contains(key)) << key;
}

}  // namespace
}  // namespace pagellm::bench
