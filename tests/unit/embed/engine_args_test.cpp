#include "embed/engine_args.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "embed/embedded_engine.h"

namespace pagellm::embed {
namespace {

using nlohmann::json;

json dummy(json extra = json::object()) {
  json j = {{"load_format", "dummy"}, {"dummy_shape", "tiny-llama"}, {"dummy_type", "f32"}, {"num_threads", 1}};
  j.update(extra);
  return j;
}

std::string param_of(const json& args) {
  try {
    parse_engine_args(args);
  } catch (const InvalidRequest& e) {
    return e.param();
  }
  return "(accepted)";
}

TEST(EngineArgs, VllmNamesMapToTheConfig) {
  const EngineArgs a = parse_engine_args(dummy({{"max_model_len", 300},
                                                {"max_num_seqs", 7},
                                                {"max_num_batched_tokens", 99},
                                                {"block_size", 32},
                                                {"enable_prefix_caching", false},
                                                {"kv_cache_memory", "64MiB"},
                                                {"scheduling_policy", "priority"},
                                                {"preemption_mode", "swap"},
                                                {"swap_space", 0.5},
                                                {"seed", 42},
                                                {"speculative_config", {{"method", "ngram"}, {"num_speculative_tokens", 3}}},
                                                {"dtype", "auto"},
                                                {"trust_remote_code", true},
                                                {"tensor_parallel_size", 1}}));
  const EngineConfig& c = a.config;
  EXPECT_EQ(c.scheduler.max_model_len, 300);
  EXPECT_EQ(c.scheduler.max_num_seqs, 7);
  EXPECT_EQ(c.scheduler.max_num_batched_tokens, 99);
  EXPECT_EQ(c.block_size, 32);
  EXPECT_FALSE(c.enable_prefix_caching);
  EXPECT_EQ(c.kv_cache_memory, int64_t{64} << 20);
  EXPECT_EQ(c.scheduler.policy, SchedulingPolicy::Priority);
  EXPECT_EQ(c.scheduler.preemption_mode, PreemptionMode::Swap);
  EXPECT_EQ(c.swap_space_bytes, int64_t{1} << 29);
  EXPECT_EQ(c.backend_options.at("threads"), "1");
  EXPECT_EQ(c.speculative.num_speculative_tokens, 3);
  EXPECT_EQ(a.seed, 42u);
  EXPECT_EQ(parse_engine_args(dummy({{"kv_cache_memory_bytes", 4096}})).config.kv_cache_memory, 4096);
}

TEST(EngineArgs, BadArgumentsNameTheirKey) {
  EXPECT_EQ(param_of(dummy({{"max_num_seqz", 1}})), "max_num_seqz");
  EXPECT_EQ(param_of(dummy({{"block_size", 5}})), "block_size");
  EXPECT_EQ(param_of(dummy({{"max_num_seqs", 0}})), "max_num_seqs");
  EXPECT_EQ(param_of(dummy({{"max_model_len", "long"}})), "max_model_len");
  EXPECT_EQ(param_of(dummy({{"kv_cache_memory", "lots"}})), "kv_cache_memory");
  EXPECT_EQ(param_of(dummy({{"kv_cache_memory", 1}, {"kv_cache_memory_bytes", 1}})), "kv_cache_memory");
  EXPECT_EQ(param_of(dummy({{"preemption_mode", "never"}})), "preemption_mode");
  EXPECT_EQ(param_of(dummy({{"gpu_memory_utilization", 2.0}})), "gpu_memory_utilization");
  EXPECT_EQ(param_of(dummy({{"dtype", "float16"}})), "dtype");
  EXPECT_EQ(param_of(dummy({{"tensor_parallel_size", 2}})), "tensor_parallel_size");
  EXPECT_EQ(param_of(dummy({{"speculative_config", {{"method", "ngram"}, {"num_speculative_tokens", 99}}}})),
            "speculative_config");
  EXPECT_EQ(param_of(dummy({{"backend_options", {{"x", {1, 2}}}}})), "backend_options");
  EXPECT_THROW(parse_engine_args(json::array()), InvalidRequest);
}

TEST(EmbeddedEngine, SamplingJsonAndDerivedSeeds) {
  EmbeddedEngine e(dummy({{"max_model_len", 64}, {"seed", 7}}));
  const std::vector<int32_t> prompt = {1, 5, 9};
  EngineRequest r = e.make_request("a", prompt, {{"temperature", 0.5}, {"max_tokens", 5}, {"stop", {"x"}}, {"n", 2}});
  EXPECT_FLOAT_EQ(r.params.temperature, 0.5f);
  EXPECT_EQ(r.params.max_tokens, 5);
  EXPECT_EQ(r.params.n, 2);
  ASSERT_TRUE(r.params.seed.has_value());  // from the engine seed
  const EngineRequest r2 = e.make_request("b", prompt, json::object());
  EXPECT_EQ(r2.params.max_tokens, 16);  // vLLM's default
  EXPECT_NE(r2.params.seed, r.params.seed);
  EXPECT_EQ(e.make_request("c", prompt, {{"max_tokens", nullptr}}).params.max_tokens, 64 - 3);  // the room left
  EXPECT_EQ(e.make_request("d", prompt, {{"seed", 3}}).params.seed, 3u);
  EXPECT_EQ(e.make_request("e", prompt, {{"structured_outputs", {{"choice", {"yes", "no"}}}}}).params.structured.kind,
            StructuredOutputs::Kind::Choice);
  EXPECT_THROW(e.make_request("f", {1, 1 << 30}, json::object()), InvalidRequest);
  EXPECT_THROW(e.make_request("g", prompt, json::array()), InvalidRequest);
  EXPECT_THROW(e.make_request("h", prompt, {{"top_k", "many"}}), InvalidRequest);
  EXPECT_EQ(e.make_request("i", prompt, {{"prompt_logprobs", 2}}).params.prompt_logprobs, 2);
  EXPECT_THROW(e.make_request("j", prompt, {{"prompt_logprobs", 21}}), InvalidRequest);
}

}  // namespace
}  // namespace pagellm::embed
