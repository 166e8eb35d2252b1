// KV sharing (ModelConfig::kv_source, Gemma 4's last num_kv_shared_layers):
// a layer that reads an earlier layer's K/V keeps no cache of its own, so
// the cache (and each sequence's memory) holds only the layers that keep
// theirs; and Gemma 4's config.json rules, including what is refused.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "backend/registry.h"
#include "core/error.h"
#include "core/kv_layout.h"
#include "core/thread_pool.h"
#include "model/dummy.h"
#include "model/model.h"
#include "model_test_util.h"
#include "test_paths.h"

namespace pagellm {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

void expect_error(const std::function<void()>& f, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing '" << what << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << "message: " << e.what();
  }
}

// tiny-gemma4: layers s s g | s s g, the last three reading layers 1, 1, 2.
TEST(KvSharing, SharedLayersKeepNoCache) {
  const ModelConfig c = dummy_config("tiny-gemma4", 512);
  ASSERT_EQ(c.kv_source, (std::vector<int32_t>{-1, -1, -1, 1, 1, 2}));
  for (int il = 0; il < 3; ++il) EXPECT_EQ(c.cache_layer_of(il), il);
  EXPECT_EQ(c.cache_layer_of(3), 1);
  EXPECT_EQ(c.cache_layer_of(4), 1);
  EXPECT_EQ(c.cache_layer_of(5), 2);
  EXPECT_EQ(c.cache_layers_before(6), 3);

  ThreadPool pool(2);
  auto backend = create_backend("cpu", {{"threads", "2"}});
  auto src = make_dummy_source(c, DummySpec{"tiny-gemma4", DType::F32, 1}, pool);
  auto model = Model::from_source(c, *src, *backend);
  // Three cache layers, not six: half the bytes per block.
  const KVCacheSpec plain = model->kv_cache_spec(16, 8, DType::F16);
  EXPECT_EQ(plain.n_layers, 3);
  EXPECT_TRUE(plain.layer_group.empty());
  EXPECT_EQ(model->kv_layer_windows(), (std::vector<int32_t>{32, 32, 0}));
  ModelConfig unshared = c;  // the same layers, each keeping its own K/V
  unshared.kv_source.clear();
  auto unshared_src = make_dummy_source(unshared, DummySpec{"tiny-gemma4", DType::F32, 1}, pool);
  auto unshared_model = Model::from_source(unshared, *unshared_src, *backend);
  EXPECT_EQ(unshared_model->kv_cache_spec(16, 8, DType::F16).bytes_per_block(), 2 * plain.bytes_per_block());
  // A pipeline stage must hold each shared layer's source: the even cut
  // (layers 3-5 on the second stage) does not, a cut after layer 0 does
  // (per-layer inputs come from the first stage with the hidden states).
  auto second_stage = Model::from_source(c, *src, *backend, {}, ModelShard{0, 1, 1, 2, {}, false});
  expect_error([&] { second_stage->kv_cache_spec(16, 8, DType::F16); }, "which another pipeline stage holds");
  auto sources_kept = Model::from_source(c, *src, *backend, {}, ModelShard{0, 1, 1, 2, {1, 5}, false});
  EXPECT_EQ(sources_kept->kv_cache_spec(16, 8, DType::F16).n_layers, 2);  // layers 1 and 2
  // Grouped: the global cache layer in the full group, each local one in a sliding group of one slot.
  const KvGroupPlan plan = plan_kv_groups(model->kv_layer_windows(), 512);
  ASSERT_TRUE(plan.grouped());
  const KVCacheSpec grouped = model->kv_cache_spec(16, 8, DType::F16, &plan);
  EXPECT_EQ(grouped.n_layers, 1);
  EXPECT_EQ(grouped.layer_group, (std::vector<int32_t>{1, 2, 0}));
  EXPECT_EQ(grouped.layer_slot, (std::vector<int32_t>{0, 0, 0}));
}

// The GGUF dummy (llama.cpp's keys: sliding_window_pattern, shared_kv_layers,
// embedding_length_per_layer_input; rope_freqs) reads back to the same config
// and computes what the in-memory dummy does.
TEST(KvSharing, Gemma4GgufDummyReadsBack) {
  ThreadPool pool(2);
  auto backend = create_backend("cpu", {{"threads", "2"}});
  // tiny-gemma4g: global layers of their own head and KV heads (key_length,
  // head_count_kv as a per-layer array), values from keys (no attn_v), and
  // double-wide shared MLPs (feed_forward_length as an array).
  // tiny-gemma4moe: experts with gate and up apart (llama.cpp reads both forms;
  // its converter's fused ffn_gate_up_exps: model_reference_test.cpp).
  for (const char* shape : {"tiny-gemma4", "tiny-gemma4g", "tiny-gemma4moe"}) {
    SCOPED_TRACE(shape);
    const DummySpec spec{shape, DType::F32, 3};
    const std::string path = (fs::path(test::temp_dir()) / (std::string(shape) + ".gguf")).string();
    write_dummy_gguf(path, spec, nullptr, pool);
    auto from_file = Model::load(path, *backend);
    const ModelConfig& c = from_file->config();
    const ModelConfig want = dummy_config(shape, 512);
    EXPECT_EQ(c.kv_source, want.kv_source);
    EXPECT_EQ(c.is_swa, want.is_swa);
    EXPECT_EQ(c.n_embd_per_layer, want.n_embd_per_layer);
    EXPECT_EQ(c.attn_scale, 1.0f);
    EXPECT_EQ(c.rope.n_rot, want.rope.n_rot);
    EXPECT_EQ(c.rope_swa.n_rot, want.rope_swa.n_rot);
    EXPECT_EQ(c.rope_swa.freq_base, want.rope_swa.freq_base);
    EXPECT_EQ(c.sliding_window, want.sliding_window);
    EXPECT_EQ(c.final_softcap, want.final_softcap);
    EXPECT_EQ(c.head_dim, want.head_dim);
    EXPECT_EQ(c.head_dim_global, want.head_dim_global);
    EXPECT_EQ(c.n_head_kv_global, want.n_head_kv_global);
    EXPECT_EQ(c.global_v_is_k, want.global_v_is_k);
    EXPECT_EQ(c.layer_n_ff, want.layer_n_ff);
    std::vector<int32_t> tokens;
    for (int i = 0; i < 40; ++i) tokens.push_back(3 + (i * 53) % 500);
    auto run = [&](Model& m) {
      test::PagedRunner runner(m, 16, 16, DType::F32);
      return runner.feed(tokens, 9, true);
    };
    const std::vector<float> got = run(*from_file);
    from_file.reset();
    auto src = make_dummy_source(want, spec, pool);
    auto in_memory = Model::from_source(want, *src, *backend);
    EXPECT_EQ(got, run(*in_memory));
    fs::remove(path);
  }
}

// tiny-gemma4g with KV-cache groups: the global layer (one KV head of 256)
// shares block slots with the local ones (two of 64), which fill half of
// each; an int8 cache addresses scales per head, so it refuses that mix.
TEST(KvSharing, GlobalLayersOfTheirOwnShapeShareSlots) {
  ThreadPool pool(2);
  auto backend = create_backend("cpu", {{"threads", "2"}});
  const ModelConfig c = dummy_config("tiny-gemma4g", 512);
  auto src = make_dummy_source(c, DummySpec{"tiny-gemma4g", DType::F32, 1}, pool);
  auto model = Model::from_source(c, *src, *backend);
  const KvGroupPlan plan = plan_kv_groups(model->kv_layer_windows(), 256);
  ASSERT_TRUE(plan.grouped());
  const KVCacheSpec spec = model->kv_cache_spec(16, 8, DType::F16, &plan);
  EXPECT_EQ(spec.layer_kv_heads, (std::vector<int32_t>{2, 2, 1}));
  EXPECT_EQ(spec.layer_head_dim, (std::vector<int32_t>{64, 64, 256}));
  EXPECT_EQ(spec.n_layers, 1);  // one slot a block: the global layer, or one local layer
  EXPECT_EQ(spec.bytes_per_block(), size_t{2} * 16 * 256 * 2);
  backend->allocate_kv_cache(spec);
  expect_error([&] { backend->allocate_kv_cache(model->kv_cache_spec(16, 8, DType::I8, &plan)); },
               "int8 KV cache cannot hold layers of different head sizes");
}

TEST(KvSharing, InvalidSourcesAreRefused) {
  ModelConfig c = dummy_config("tiny-gemma4", 512);
  c.kv_source = {-1, -1, -1, 4, -1, -1};  // a later layer
  expect_error([&] { c.validate(); }, "layer 3 reuses the K/V of layer 4");
  c.kv_source = {-1, -1, -1, 2, -1, -1};  // a global layer for a local one
  expect_error([&] { c.validate(); }, "layer 3 reuses the K/V of layer 2");
  c.kv_source = {-1, -1, -1, 1, 3, -1};  // a layer that keeps no cache of its own
  expect_error([&] { c.validate(); }, "layer 4 reuses the K/V of layer 3");
  c.kv_source = {-1, -1};
  expect_error([&] { c.validate(); }, "KV source layers (2)");
}

ModelConfig config_of(const json& j) {
  const fs::path dir = fs::path(test::temp_dir()) / "gemma4-cfg";
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << j.dump(2);
  return config_from_hf_json((dir / "config.json").string());
}

json gemma4_config() {
  return {{"architectures", {"Gemma4ForCausalLM"}},
          {"vocab_size", 512},
          {"hidden_size", 256},
          {"intermediate_size", 512},
          {"num_hidden_layers", 6},
          {"num_attention_heads", 2},
          {"num_key_value_heads", 1},
          {"head_dim", 128},
          {"global_head_dim", 128},
          {"hidden_size_per_layer_input", 64},
          {"vocab_size_per_layer_input", 512},
          {"num_kv_shared_layers", 2},
          {"layer_types",
           {"sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "sliding_attention",
            "full_attention"}}};
}

TEST(Gemma4Config, ReadsSharingPleAndProportionalRope) {
  const ModelConfig c = config_of(gemma4_config());
  EXPECT_EQ(c.arch, Arch::Gemma4);
  EXPECT_EQ(c.kv_source, (std::vector<int32_t>{-1, -1, -1, -1, 3, 2}));
  EXPECT_EQ(c.n_embd_per_layer, 64);
  EXPECT_EQ(c.attn_scale, 1.0f);
  // transformers' defaults: proportional RoPE (a quarter of the pairs turning, base 1e6) on
  // global layers, plain RoPE of base 10000 on local ones, a window of 512.
  EXPECT_EQ(c.rope.n_rot, 128);
  EXPECT_EQ(c.rope.freq_base, 1e6f);
  ASSERT_EQ(c.rope_freq_factors.size(), 64u);
  EXPECT_EQ(c.rope_freq_factors[15], 1.0f);
  EXPECT_EQ(c.rope_freq_factors[16], kStillRopePair);
  EXPECT_EQ(c.rope_swa.freq_base, 10000.0f);
  EXPECT_EQ(c.sliding_window, 512);
  EXPECT_EQ(c.final_softcap, 0.0f);

  // As transformers saves it: per_layer_config (here empty) instead of global_head_dim.
  json saved = gemma4_config();
  saved.erase("global_head_dim");
  saved["per_layer_config"] = json::object();
  EXPECT_EQ(config_of(saved).head_dim, 128);

  // The multimodal class: text_config is the text model.
  json mm = {{"architectures", {"Gemma4ForConditionalGeneration"}}, {"text_config", gemma4_config()}};
  mm["text_config"].erase("architectures");
  mm["text_config"]["final_logit_softcapping"] = 30.0;
  const ModelConfig m = config_of(mm);
  EXPECT_EQ(m.kv_source, c.kv_source);
  EXPECT_EQ(m.final_softcap, 30.0f);
}

TEST(Gemma4Config, ReadsTheMoeBlock) {
  json j = gemma4_config();
  j["num_experts"] = 8;
  j["top_k_experts"] = 2;
  j["moe_intermediate_size"] = 256;
  EXPECT_FALSE(config_of(j).moe());  // experts without the block: transformers builds none
  j["enable_moe_block"] = true;
  const ModelConfig c = config_of(j);
  EXPECT_EQ(c.n_expert, 8);
  EXPECT_EQ(c.n_expert_used, 2);
  EXPECT_EQ(c.n_ff_exp, 256);
  EXPECT_EQ(c.n_ff, 512);  // the dense MLP beside the experts
  EXPECT_TRUE(c.moe_dense_ffn);
  EXPECT_TRUE(c.expert_norm_topk);
}

// The released checkpoints: global layers of their own head size (E2B..31B),
// KV heads and values from the keys (31B, 26B-A4B), double-wide shared MLPs (E2B, E4B).
TEST(Gemma4Config, ReadsTheReleasedGlobalLayers) {
  json j = gemma4_config();
  j["global_head_dim"] = 256;
  ModelConfig c = config_of(j);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.layer_head_dim(0), 128);
  EXPECT_EQ(c.layer_head_dim(2), 256);
  EXPECT_EQ(c.layer_head_dim(5), 256);
  // Proportional RoPE turns a quarter of the global head; the local layers turn all of theirs.
  EXPECT_EQ(c.rope.n_rot, 256);
  ASSERT_EQ(c.rope_freq_factors.size(), 128u);
  EXPECT_EQ(c.rope_freq_factors[31], 1.0f);
  EXPECT_EQ(c.rope_freq_factors[32], kStillRopePair);
  EXPECT_EQ(c.rope_swa.n_rot, 128);
  EXPECT_FALSE(c.global_v_is_k);
  EXPECT_EQ(c.layer_n_head_kv(5), 1);

  // As transformers saves it.
  json saved = gemma4_config();
  saved.erase("global_head_dim");
  saved["per_layer_config"] = {{"2", {{"head_dim", 256}}}, {"5", {{"head_dim", 256}}}};
  EXPECT_EQ(config_of(saved).layer_head_dim(5), 256);

  // num_global_key_value_heads counts only with attention_k_eq_v (transformers' rule).
  j["num_global_key_value_heads"] = 2;
  EXPECT_EQ(config_of(j).layer_n_head_kv(5), 1);
  j["attention_k_eq_v"] = true;
  c = config_of(j);
  EXPECT_TRUE(c.global_v_is_k && c.layer_v_is_k(5) && !c.layer_v_is_k(4));
  EXPECT_EQ(c.layer_n_head_kv(5), 2);
  EXPECT_EQ(c.layer_n_head_kv(4), 1);
  EXPECT_FALSE(c.layers_alike());

  j["use_double_wide_mlp"] = true;  // the two shared layers
  EXPECT_EQ(config_of(j).layer_n_ff, (std::vector<int32_t>{512, 512, 512, 512, 1024, 1024}));
}

TEST(Gemma4Config, UnsupportedVariantsAreRefusedByName) {
  auto refused = [](const char* key, const json& value, const std::string& what) {
    json j = gemma4_config();
    j[key] = value;
    expect_error([&] { config_of(j); }, what);
  };
  refused("global_head_dim", 100000, "invalid global layers' shape");
  refused("enable_moe_block", true, "enable_moe_block needs num_experts");
  refused("vocab_size_per_layer_input", 256, "vocab_size_per_layer_input 256 differs");
  refused("num_kv_shared_layers", 6, "num_kv_shared_layers 6 must be below the layer count 6");
  refused("use_bidirectional_attention", "all", "use_bidirectional_attention 'all'");
  refused("num_kv_shared_layers", 1e12, "num_kv_shared_layers 1000000000000 must be a whole number");
  json j = gemma4_config();
  j["num_kv_shared_layers"] = 4;  // layers 2..5 shared: no global layer before them
  expect_error([&] { config_of(j); }, "shared layer 2 has no earlier global layer");
  j["num_kv_shared_layers"] = 0;  // the double-wide MLP only widens shared layers
  j["use_double_wide_mlp"] = true;
  EXPECT_TRUE(config_of(j).kv_source.empty());
}

}  // namespace
}  // namespace pagellm
