// The Hugging Face folder path (config.json + safetensors) against transformers
// (fixtures from tools/gen_hf_fixtures.py): hf_writer writes each dummy model
// as a folder, Model::load reads it, and the logits must match what
// transformers computed from the very same folder. Also: the folder computes
// the same function as the GGUF-layout dummy, transformers-5 config.json files
// read to the same config, and broken folders fail with clear errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "hostile_input.h"
#include "model/dummy.h"
#include "model/hf_writer.h"
#include "model/model.h"
#include "model/model_config.h"
#include "model/model_test_util.h"
#include "test_paths.h"

namespace pagellm {
namespace {

using test::max_rel_gap;
using test::read_floats;
using test::read_json;

namespace fs = std::filesystem;
using nlohmann::json;

void write_json(const std::string& path, const json& j) {
  std::ofstream out(path, std::ios::trunc);
  out << j.dump(2);
}

std::vector<float> run_tokens(Model& model, const std::vector<int32_t>& tokens, int chunk) {
  test::PagedRunner runner(model, 16, 16, DType::F32);
  return runner.feed(tokens, chunk, true);
}

// Model folders are megabytes each: they live under one root that is
// removed when the tests end.
fs::path scratch_root() { return fs::path(test::temp_dir()) / "hf_model_test"; }

class RemoveScratch : public ::testing::Environment {
 public:
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(scratch_root(), ec);
  }
};
[[maybe_unused]] ::testing::Environment* const kRemoveScratch = ::testing::AddGlobalTestEnvironment(new RemoveScratch);

// A fresh folder under the scratch root.
std::string scratch(const std::string& name) {
  const fs::path p = scratch_root() / name;
  fs::remove_all(p);
  fs::create_directories(p.parent_path());
  return p.string();
}

// Runs f and checks that it throws pagellm::Error whose message contains `what`.
void expect_error(const std::function<void()>& f, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing '" << what << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << "message: " << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a pagellm::Error: " << e.what();
  }
}

// Every field the forward pass reads, except RoPE style (GGUF llama rotates
// adjacent pairs, HF halves) and the name.
void expect_same_config(const ModelConfig& a, const ModelConfig& b, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(a.arch, b.arch);
  EXPECT_EQ(a.n_vocab, b.n_vocab);
  EXPECT_EQ(a.n_embd, b.n_embd);
  EXPECT_EQ(a.n_layer, b.n_layer);
  EXPECT_EQ(a.n_head, b.n_head);
  EXPECT_EQ(a.n_head_kv, b.n_head_kv);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.n_ff, b.n_ff);
  EXPECT_EQ(a.n_ctx_train, b.n_ctx_train);
  EXPECT_EQ(a.norm_eps, b.norm_eps);
  for (auto [ra, rb] : {std::pair{a.rope, b.rope}, std::pair{a.rope_swa, b.rope_swa}}) {
    EXPECT_EQ(ra.n_rot, rb.n_rot);
    EXPECT_EQ(ra.freq_base, rb.freq_base);
    EXPECT_EQ(ra.freq_scale, rb.freq_scale);
    EXPECT_EQ(ra.ext_factor, rb.ext_factor);
    EXPECT_FLOAT_EQ(ra.attn_factor, rb.attn_factor);
    EXPECT_EQ(ra.beta_fast, rb.beta_fast);
    EXPECT_EQ(ra.beta_slow, rb.beta_slow);
    EXPECT_EQ(ra.n_ctx_orig, rb.n_ctx_orig);
    EXPECT_EQ(ra.yarn_truncate, rb.yarn_truncate);
  }
  EXPECT_EQ(a.rope_factors_short, b.rope_factors_short);
  EXPECT_EQ(a.rope_factors_long, b.rope_factors_long);
  EXPECT_EQ(a.attn_scale, b.attn_scale);
  EXPECT_EQ(a.sliding_window, b.sliding_window);
  EXPECT_EQ(a.is_swa, b.is_swa);
  EXPECT_EQ(a.attn_softcap, b.attn_softcap);
  EXPECT_EQ(a.final_softcap, b.final_softcap);
  EXPECT_EQ(a.qkv_bias, b.qkv_bias);
  EXPECT_EQ(a.qk_norm, b.qk_norm);
  EXPECT_EQ(a.post_norms, b.post_norms);
  EXPECT_EQ(a.embd_scale, b.embd_scale);
  EXPECT_EQ(a.act, b.act);
  EXPECT_EQ(a.n_expert, b.n_expert);
  EXPECT_EQ(a.n_expert_used, b.n_expert_used);
  EXPECT_EQ(a.n_ff_exp, b.n_ff_exp);
  EXPECT_EQ(a.n_ff_shexp, b.n_ff_shexp);
  EXPECT_EQ(a.expert_norm_topk, b.expert_norm_topk);
  EXPECT_EQ(a.attn_out_gate, b.attn_out_gate);
  EXPECT_EQ(a.is_linear, b.is_linear);
  EXPECT_EQ(a.linear.n_k_heads, b.linear.n_k_heads);
  EXPECT_EQ(a.linear.n_v_heads, b.linear.n_v_heads);
  EXPECT_EQ(a.linear.head_k_dim, b.linear.head_k_dim);
  EXPECT_EQ(a.linear.head_v_dim, b.linear.head_v_dim);
  EXPECT_EQ(a.linear.conv_kernel, b.linear.conv_kernel);
  EXPECT_EQ(a.expert_scoring, b.expert_scoring);
  EXPECT_EQ(a.expert_choice_bias, b.expert_choice_bias);
  EXPECT_EQ(a.expert_weights_scale, b.expert_weights_scale);
  EXPECT_EQ(a.expert_groups, b.expert_groups);
  EXPECT_EQ(a.expert_groups_used, b.expert_groups_used);
  EXPECT_EQ(a.expert_group_score, b.expert_group_score);
  EXPECT_EQ(a.n_dense_lead, b.n_dense_lead);
  EXPECT_EQ(a.mla.q_lora_rank, b.mla.q_lora_rank);
  EXPECT_EQ(a.mla.kv_lora_rank, b.mla.kv_lora_rank);
  EXPECT_EQ(a.mla.qk_nope_head_dim, b.mla.qk_nope_head_dim);
  EXPECT_EQ(a.mla.qk_rope_head_dim, b.mla.qk_rope_head_dim);
  EXPECT_EQ(a.mla.v_head_dim, b.mla.v_head_dim);
  EXPECT_EQ(a.rope_pairs_adjacent, b.rope_pairs_adjacent);
  EXPECT_EQ(a.rope_freq_factors, b.rope_freq_factors);
  EXPECT_EQ(a.kv_source, b.kv_source);
  EXPECT_EQ(a.n_embd_per_layer, b.n_embd_per_layer);
  EXPECT_EQ(a.moe_dense_ffn, b.moe_dense_ffn);
}

// The shapes tools/gen_hf_fixtures.py writes fixtures for, and whether each ties its embeddings.
const std::vector<std::pair<const char*, bool>> kFixtureShapes = {
    {"tiny-llama", false},   {"tiny-qwen2", true},     {"tiny-qwen3", true},    {"tiny-gemma3", true},
    {"tiny-llama3", false},  {"tiny-gemma2", true},    {"tiny-phi3", false},
    {"tiny-mixtral", false}, {"tiny-qwen2moe", false}, {"tiny-qwen3moe", true},
    {"tiny-qwen3-yarn", true}, {"tiny-phi3-longrope", false}, {"tiny-gptoss", false},
    {"tiny-qwen35", false},    {"tiny-qwen35moe", false}, {"tiny-deepseek3", false}, {"tiny-deepseek2", false},
    {"tiny-glm4moe", false},   {"tiny-qwen3next", false},
    {"tiny-gemma4", true},     {"tiny-gemma4moe", true},  {"tiny-gemma4g", true},
};

struct HFCase {
  std::string shape, type;
  int shards = 1;
  std::string name() const {
    return "hf-" + shape + "-" + type + (shards > 1 ? "-" + std::to_string(shards) + "shards" : "");
  }
};

// The cases tools/gen_hf_fixtures.py writes.
std::vector<HFCase> hf_cases() {
  std::vector<HFCase> cases;
  for (auto [s, tied] : kFixtureShapes)
    for (const char* t : {"f32", "bf16"}) cases.push_back({s, t, 1});
  cases.push_back({"tiny-llama", "f16", 3});
  cases.push_back({"tiny-gptoss", "mxfp4", 1});  // MXFP4 experts as gpt-oss checkpoints ship them
  return cases;
}

class HFModelVsTransformers : public ::testing::TestWithParam<HFCase> {};

TEST_P(HFModelVsTransformers, LogitsMatchAtEveryPosition) {
  const HFCase& c = GetParam();
  const std::string base = test::fixture("hf/" + c.name());
  REQUIRE_FILE(base + ".json");
  const auto meta = read_json(base + ".json");
  const auto ref = read_floats(base + ".bin");
  const auto tokens = meta["tokens"].get<std::vector<int32_t>>();
  const int n_vocab = meta["n_vocab"].get<int>();
  ASSERT_EQ(ref.size(), tokens.size() * n_vocab);

  ThreadPool pool(2);
  const std::string dir = scratch(c.name());
  write_dummy_hf(dir, DummySpec{c.shape, dtype_from_name(c.type), meta["seed"].get<uint64_t>()}, c.shards, pool);
  if (c.shards > 1) {
    ASSERT_TRUE(fs::exists(fs::path(dir) / "model.safetensors.index.json"));
    ASSERT_TRUE(fs::exists(fs::path(dir) / fmt::format("model-{:05d}-of-{:05d}.safetensors", c.shards, c.shards)));
  }
  // MXFP4 experts and BF16 weights: float activations, as transformers
  // multiplies the dequantized weights (the fast path rounds activations to
  // 8 bits, and to bf16 on AVX512-BF16 machines).
  CpuBackendOptions opts;
  opts.threads = 2;
  opts.exact_matmul = c.type == "mxfp4" || c.type == "bf16";
  auto backend = make_cpu_backend(opts);
  auto model = Model::load(dir, *backend);
  ModelConfig want = dummy_config(c.shape, n_vocab);
  expect_same_config(model->config(), want, "HF config vs dummy config");
  // HF checkpoints rotate halves, except DeepSeek's (adjacent pairs).
  EXPECT_EQ(model->config().rope.neox, !model->config().rope_pairs_adjacent);

  // Both sides compute in float32 from identical weight values (F16/BF16
  // weights are exact in float32; F16 matmul widens them and uses float
  // FMAs, BF16 runs exact here), so the differences are float
  // summation order only: measured <1e-6 of the largest logit. The bar is
  // 1e-4, a hundred times that.
  // Slips in what the HF path configures move these logits far more: a
  // wrong local RoPE base by 0.7, a sliding window off by one by >0.1.
  const double tol = 1e-4;
  for (int chunk : {static_cast<int>(tokens.size()), 7}) {
    const auto logits = run_tokens(*model, tokens, chunk);
    const double gap = max_rel_gap(logits, ref, n_vocab);
    EXPECT_LE(gap, tol) << c.name() << " chunk " << chunk;
    RecordProperty(c.name() + "_chunk" + std::to_string(chunk), std::to_string(gap));
    std::printf("[ hf ] %s chunk %d: max relative gap to transformers %.2e\n", c.name().c_str(), chunk, gap);
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(AllArchs, HFModelVsTransformers, ::testing::ValuesIn(hf_cases()), [](const auto& info) {
  std::string n = info.param.name();
  for (auto& ch : n)
    if (ch == '-') ch = '_';
  return n;
});

// Released Qwen3.5-MoE checkpoints store each expert's gate, up and down
// matrices apart (transformers merges them into gate_up_proj / down_proj on
// load). The same folder with its stacked experts renamed into per-expert
// views of the same bytes must compute transformers' logits too.
TEST(HFModelFolder, QwenMoeExpertsOnePerMatrix) {
  const std::string base = test::fixture("hf/hf-tiny-qwen35moe-f32");
  REQUIRE_FILE(base + ".json");
  const auto meta = read_json(base + ".json");
  const auto ref = read_floats(base + ".bin");
  const auto tokens = meta["tokens"].get<std::vector<int32_t>>();
  const int n_vocab = meta["n_vocab"].get<int>();
  ThreadPool pool(2);
  const std::string dir = scratch("per-expert-qwen35moe");
  write_dummy_hf(dir, DummySpec{"tiny-qwen35moe", DType::F32, meta["seed"].get<uint64_t>()}, 1, pool);
  int split = 0;
  test::edit_safetensors_header(dir + "/model.safetensors", [&](json& h) {
    json out = json::object();
    for (auto& [name, info] : h.items()) {
      const bool gate_up = name.ends_with(".mlp.experts.gate_up_proj"), down = name.ends_with(".mlp.experts.down_proj");
      if (!gate_up && !down) {
        out[name] = info;
        continue;
      }
      ++split;
      const std::string stem = name.substr(0, name.rfind('.') + 1);  // "...mlp.experts."
      const auto shape = info["shape"].get<std::vector<uint64_t>>();  // [E, rows, in]
      const uint64_t experts = shape[0], rows = shape[1], in = shape[2], begin = info["data_offsets"][0];
      const uint64_t part_rows = gate_up ? rows / 2 : rows, part_bytes = part_rows * in * sizeof(float);
      uint64_t at = begin;
      for (uint64_t e = 0; e < experts; ++e)
        for (const char* part : gate_up ? std::vector<const char*>{"gate_proj", "up_proj"}
                                        : std::vector<const char*>{"down_proj"}) {
          out[fmt::format("{}{}.{}.weight", stem, e, part)] = {
              {"dtype", "F32"}, {"shape", {part_rows, in}}, {"data_offsets", {at, at + part_bytes}}};
          at += part_bytes;
        }
    }
    h = out;
  });
  ASSERT_GT(split, 0);
  CpuBackendOptions opts;
  opts.threads = 2;
  auto backend = make_cpu_backend(opts);
  auto model = Model::load(dir, *backend);
  const double gap = max_rel_gap(run_tokens(*model, tokens, static_cast<int>(tokens.size())), ref, n_vocab);
  EXPECT_LE(gap, 1e-4);
  std::printf("[ hf ] tiny-qwen35moe, experts one per matrix: max relative gap to transformers %.2e\n", gap);
  // One expert's matrix missing is named.
  test::edit_safetensors_header(dir + "/model.safetensors",
                                [](json& h) { h.erase("model.layers.0.mlp.experts.1.up_proj.weight"); });
  expect_error([&] { Model::load(dir, *backend); }, "blk.0.ffn_up_exps.weight[1]");
  fs::remove_all(dir);
}

// The F32 folder and the GGUF-layout dummy are one function: hf_writer
// un-permutes Llama Q/K (the loader then rotates halves) and writes Gemma
// norms as w - 1 (the loader adds 1 back, exactly for w in [0.5, 2]).
TEST(HFModelFolder, ComputesTheSameFunctionAsTheGGUFDummy) {
  ThreadPool pool(2);
  auto backend = make_cpu_backend(2);
  std::vector<int32_t> tokens;
  for (int i = 0; i < 24; ++i) tokens.push_back(1 + (i * 37) % 500);
  for (auto [shape, tied] : kFixtureShapes) {
    const int n_vocab = dummy_vocab_size(shape, nullptr);
    const DummySpec spec{shape, DType::F32, 5};
    const ModelConfig cfg = dummy_config(shape, n_vocab);
    auto src = make_dummy_source(cfg, spec, pool);
    auto gguf_model = Model::from_source(cfg, *src, *backend);
    const auto want = run_tokens(*gguf_model, tokens, 24);
    gguf_model.reset();

    const std::string dir = scratch(std::string("same-") + shape);
    write_dummy_hf(dir, spec, 1, pool);
    auto hf_model = Model::load(dir, *backend);
    const double gap = max_rel_gap(run_tokens(*hf_model, tokens, 24), want, n_vocab);
    // Same weights and same arithmetic up to the order of Q/K rows and the
    // RoPE pairing, so only rounding differs.
    EXPECT_LE(gap, 1e-5) << shape;
  }
}

// transformers 5 saves configs with rope_parameters (per layer type for
// Gemma 3) instead of rope_theta / rope_local_base_freq: both must read to
// the same config.
TEST(HFConfig, TransformersSavedConfigsReadTheSame) {
  ThreadPool pool(2);
  for (auto [shape, tied] : kFixtureShapes) {
    const std::string saved = test::fixture(std::string("hf/config-") + shape + ".json");
    REQUIRE_FILE(saved);
    const std::string dir = scratch(std::string("cfg-") + shape);
    fs::create_directories(dir);
    fs::copy_file(saved, fs::path(dir) / "config.json");
    const ModelConfig from_saved = config_from_hf_json((fs::path(dir) / "config.json").string());
    const ModelConfig want = dummy_config(shape, dummy_vocab_size(shape, nullptr));
    expect_same_config(from_saved, want, shape);
    EXPECT_EQ(from_saved.tie_word_embeddings, tied) << shape;
    EXPECT_TRUE(read_json(saved).contains("rope_parameters")) << "fixture is not in the current format";
  }
}

// --- Config parsing details -------------------------------------------------

ModelConfig config_of(const json& j) {
  const std::string dir = scratch("cfg");
  fs::create_directories(dir);
  write_json(dir + "/config.json", j);
  return config_from_hf_json(dir + "/config.json");
}

json small_config(const char* arch) {
  return {{"architectures", {arch}}, {"vocab_size", 512}, {"hidden_size", 256}, {"intermediate_size", 512},
          {"num_hidden_layers", 6}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 64}};
}

TEST(HFConfig, RopeParametersAndLegacyKeys) {
  json j = small_config("LlamaForCausalLM");
  EXPECT_EQ(config_of(j).rope.freq_base, 10000.0f);
  j["rope_theta"] = 500000.0;
  EXPECT_EQ(config_of(j).rope.freq_base, 500000.0f);
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 4.0}};
  EXPECT_EQ(config_of(j).rope.freq_scale, 0.25f);
  j.erase("rope_theta");
  j.erase("rope_scaling");
  j["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 2.0}, {"rope_theta", 250000.0}};
  const ModelConfig c = config_of(j);
  EXPECT_EQ(c.rope.freq_base, 250000.0f);
  EXPECT_EQ(c.rope.freq_scale, 0.5f);
  j["rope_parameters"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"rope_theta", 500000.0}};
  expect_error([&] { config_of(j); }, "missing or invalid field");  // llama3 needs its band factors
  // YaRN (transformers' defaults: original context = max_position_embeddings,
  // betas 32 / 1, attention factor 0.1 ln(factor) + 1, which the backend applies).
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 8.0}};
  const ModelConfig y = config_of(j);
  EXPECT_EQ(y.rope.freq_scale, 0.125f);
  EXPECT_EQ(y.rope.ext_factor, 1.0f);
  EXPECT_EQ(y.rope.n_ctx_orig, 2048);
  EXPECT_EQ(y.rope.beta_fast, 32.0f);
  EXPECT_EQ(y.rope.beta_slow, 1.0f);
  EXPECT_FLOAT_EQ(y.rope.attn_factor, 1.0f);
  EXPECT_TRUE(y.rope.yarn_truncate);
  j["rope_parameters"] = {{"rope_type", "yarn"},   {"factor", 4.0}, {"original_max_position_embeddings", 512},
                          {"attention_factor", 2.0}, {"truncate", false}, {"beta_fast", 16.0}};
  const ModelConfig y2 = config_of(j);
  EXPECT_EQ(y2.rope.n_ctx_orig, 512);
  EXPECT_FLOAT_EQ(y2.rope.attn_factor, static_cast<float>(2.0 / (1 + 0.1 * std::log(4.0))));
  EXPECT_FALSE(y2.rope.yarn_truncate);
  EXPECT_EQ(y2.rope.beta_fast, 16.0f);
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 0.5}};
  expect_error([&] { config_of(j); }, "YaRN factor 0.5 is below 1");
  j["rope_parameters"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
  expect_error([&] { config_of(j); }, "RoPE type 'dynamic' is not supported");

  // Gemma 3: one set per layer type; scaling applies to global layers only.
  json g = small_config("Gemma3ForCausalLM");
  g["rope_parameters"] = {{"full_attention", {{"rope_type", "linear"}, {"factor", 8.0}, {"rope_theta", 1e6}}},
                          {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 1e4}}}};
  const ModelConfig gc = config_of(g);
  EXPECT_EQ(gc.rope.freq_base, 1e6f);
  EXPECT_EQ(gc.rope.freq_scale, 0.125f);
  EXPECT_EQ(gc.rope_swa.freq_base, 1e4f);
  EXPECT_EQ(gc.rope_swa.freq_scale, 1.0f);
}

TEST(HFConfig, Gemma3DefaultsAndLayerTypes) {
  json g = small_config("Gemma3ForCausalLM");
  g.erase("head_dim");
  ModelConfig c = config_of(g);
  // transformers' Gemma3TextConfig defaults.
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.rope.freq_base, 1e6f);
  EXPECT_EQ(c.rope_swa.freq_base, 1e4f);
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_EQ(c.attn_scale, 1.0f / 16.0f);  // query_pre_attn_scalar 256
  EXPECT_EQ(c.is_swa, (std::vector<bool>{true, true, true, true, true, false}));
  EXPECT_TRUE(c.tie_word_embeddings);
  // Explicit layer types are kept, all-global ones included (they used to be
  // replaced by the default pattern).
  g["layer_types"] = std::vector<std::string>(6, "full_attention");
  g["sliding_window"] = 32;
  c = config_of(g);
  EXPECT_EQ(c.is_swa, std::vector<bool>(6, false));
  g["layer_types"] = {"full_attention", "sliding_attention"};
  expect_error([&] { config_of(g); }, "one type per layer");
  g["layer_types"] = std::vector<std::string>(6, "global");
  expect_error([&] { config_of(g); }, "unknown layer type 'global'");
  g["layer_types"] = 3;
  expect_error([&] { config_of(g); }, "one type per layer");
  g.erase("layer_types");
  g["use_bidirectional_attention"] = true;
  expect_error([&] { config_of(g); }, "use_bidirectional_attention");
}

// A multimodal Gemma 3 config (as the 4B model's): the text model under
// text_config, which leaves out fields equal to transformers' defaults.
TEST(HFConfig, Gemma3MultimodalTextConfig) {
  json j = {{"architectures", {"Gemma3ForConditionalGeneration"}},
            {"model_type", "gemma3"},
            {"text_config",
             {{"hidden_size", 2560},
              {"intermediate_size", 10240},
              {"model_type", "gemma3_text"},
              {"num_hidden_layers", 34},
              {"rope_scaling", {{"factor", 8.0}, {"rope_type", "linear"}}},
              {"sliding_window", 1024}}},
            {"vision_config", {{"hidden_size", 1152}}}};
  const ModelConfig c = config_of(j);
  EXPECT_EQ(c.arch, Arch::Gemma3);
  EXPECT_EQ(c.n_vocab, 262208);
  EXPECT_EQ(c.n_embd, 2560);
  EXPECT_EQ(c.n_layer, 34);
  EXPECT_EQ(c.n_head, 8);
  EXPECT_EQ(c.n_head_kv, 4);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.sliding_window, 1024);
  EXPECT_EQ(c.rope.freq_base, 1e6f);
  EXPECT_EQ(c.rope.freq_scale, 0.125f);
  EXPECT_EQ(c.rope_swa.freq_base, 1e4f);
  EXPECT_EQ(c.rope_swa.freq_scale, 1.0f);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_TRUE(c.is_swa[0]);
  EXPECT_FALSE(c.is_swa[5]);
}

TEST(HFConfig, SlidingWindowsOfOtherFamilies) {
  json q = small_config("Qwen2ForCausalLM");
  q["sliding_window"] = 4096;
  q["max_window_layers"] = 2;
  EXPECT_EQ(config_of(q).is_swa, std::vector<bool>(6, false)) << "window without use_sliding_window";
  q["use_sliding_window"] = true;
  ModelConfig c = config_of(q);
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_EQ(c.is_swa, (std::vector<bool>{false, false, true, true, true, true}));
  json m = small_config("MistralForCausalLM");
  m["sliding_window"] = 4096;
  c = config_of(m);
  EXPECT_EQ(c.arch, Arch::Llama);
  EXPECT_EQ(c.is_swa, std::vector<bool>(6, true));
  m["sliding_window"] = nullptr;
  EXPECT_EQ(config_of(m).is_swa, std::vector<bool>(6, false));
}

TEST(HFConfig, RefusesWhatTheForwardPassDoesNotCompute) {
  json j = small_config("LlamaForCausalLM");
  j["attention_bias"] = true;
  expect_error([&] { config_of(j); }, "attention_bias");
  j = small_config("LlamaForCausalLM");
  j["mlp_bias"] = true;
  expect_error([&] { config_of(j); }, "mlp_bias");
  j = small_config("LlamaForCausalLM");
  j["hidden_act"] = "gelu";
  expect_error([&] { config_of(j); }, "activation 'gelu'");
  j = small_config("LlamaForCausalLM");
  j.erase("hidden_size");
  expect_error([&] { config_of(j); }, "missing or invalid field");
  j = small_config("LlamaForCausalLM");
  j["num_hidden_layers"] = "six";
  expect_error([&] { config_of(j); }, "missing or invalid field");
  expect_error([&] { config_of(json::array({1, 2})); }, "not a JSON object");
  j = small_config("LlamaForCausalLM");
  j["architectures"] = json::array();
  expect_error([&] { config_of(j); }, "unsupported architecture ''");
}

// --- Broken folders ---------------------------------------------------------

// A written tiny-qwen3 F32 folder (tied embeddings).
std::string make_folder(const std::string& name, int shards = 1, const std::string& shape = "tiny-qwen3") {
  ThreadPool pool(2);
  const std::string dir = scratch(name);
  write_dummy_hf(dir, DummySpec{shape, DType::F32, 2}, shards, pool);
  return dir;
}

std::unique_ptr<Model> load(const std::string& dir) {
  static auto backend = make_cpu_backend(1);
  return Model::load(dir, *backend);
}

TEST(HFModelErrors, FolderWithoutConfigJson) {
  const std::string dir = make_folder("no-config");
  fs::remove(fs::path(dir) / "config.json");
  expect_error([&] { load(dir); }, "without config.json");
}

TEST(HFModelErrors, UnsupportedArchitecture) {
  const std::string dir = make_folder("bad-arch");
  json c = read_json(dir + "/config.json");
  c["architectures"] = {"GPT2LMHeadModel"};
  write_json(dir + "/config.json", c);
  expect_error([&] { load(dir); }, "unsupported architecture 'GPT2LMHeadModel'");
}

TEST(HFModelErrors, ConfigIsNotJson) {
  const std::string dir = make_folder("bad-json");
  test::write_bytes(dir + "/config.json", "{\"architectures\": [");
  expect_error([&] { load(dir); }, "is not valid JSON");
}

TEST(HFModelErrors, NoWeights) {
  const std::string dir = make_folder("no-weights");
  fs::remove(fs::path(dir) / "model.safetensors");
  expect_error([&] { load(dir); }, "neither model.safetensors nor model.safetensors.index.json");
}

TEST(HFModelErrors, TruncatedSafetensors) {
  const std::string dir = make_folder("truncated");
  const std::string path = dir + "/model.safetensors";
  const std::string bytes = test::read_bytes(path);
  test::write_bytes(path, bytes.substr(0, bytes.size() / 2));
  expect_error([&] { load(dir); }, "data offsets exceed the file");
  test::write_bytes(path, bytes.substr(0, 100));  // inside the header
  expect_error([&] { load(dir); }, "header length");
  test::write_bytes(path, bytes.substr(0, 5));
  expect_error([&] { load(dir); }, "truncated (no safetensors header)");
  test::write_bytes(path, "");
  expect_error([&] { load(dir); }, "truncated (no safetensors header)");
}

TEST(HFModelErrors, HeaderOffsetsExceedTheFile) {
  const std::string dir = make_folder("offsets");
  const std::string path = dir + "/model.safetensors";
  test::edit_safetensors_header(path, [](json& h) { h["model.norm.weight"]["data_offsets"][1] = uint64_t{1} << 40; });
  expect_error([&] { load(dir); }, "tensor model.norm.weight data offsets exceed the file");
}

TEST(HFModelErrors, BadHeaderEntries) {
  const std::string dir = make_folder("entries");
  const std::string path = dir + "/model.safetensors";
  const std::string good = test::read_bytes(path);
  test::edit_safetensors_header(path, [](json& h) { h["model.norm.weight"]["shape"] = {128}; });
  expect_error([&] { load(dir); }, "size does not match its shape");
  test::write_bytes(path, good);
  test::edit_safetensors_header(path, [](json& h) { h["model.norm.weight"]["dtype"] = "I64"; });
  expect_error([&] { load(dir); }, "dtype I64 is not supported");
  test::write_bytes(path, good);
  test::edit_safetensors_header(path, [](json& h) { h["model.norm.weight"].erase("data_offsets"); });
  expect_error([&] { load(dir); }, "bad safetensors entry model.norm.weight");
  test::write_bytes(path, good);
  test::edit_safetensors_header(path, [](json& h) { h["model.norm.weight"]["shape"] = {-4, -64}; });
  expect_error([&] { load(dir); }, "invalid dimension");
  test::write_bytes(path, good);
  // Transposed: right size, wrong shape.
  test::edit_safetensors_header(path, [](json& h) { h["model.layers.0.mlp.up_proj.weight"]["shape"] = {256, 512}; });
  expect_error([&] { load(dir); }, "tensor 'blk.0.ffn_up.weight' has shape [512, 256], expected [256, 512]");
  test::write_bytes(path, good);
  test::edit_safetensors_header(path, [](json& h) { h = json::array({1}); });
  expect_error([&] { load(dir); }, "header is not a JSON object");
  test::write_bytes(path, good);
  std::string bad = good;
  bad[8] = 'x';  // header JSON broken
  test::write_bytes(path, bad);
  expect_error([&] { load(dir); }, "header is not valid JSON");
}

TEST(HFModelErrors, MissingTensor) {
  const std::string dir = make_folder("missing");
  test::edit_safetensors_header(dir + "/model.safetensors", [](json& h) { h.erase("model.layers.1.mlp.up_proj.weight"); });
  expect_error([&] { load(dir); }, "model is missing tensor 'blk.1.ffn_up.weight'");
}

TEST(HFModelErrors, UntiedConfigWithoutLmHead) {
  const std::string dir = make_folder("untied");
  json c = read_json(dir + "/config.json");
  c["tie_word_embeddings"] = false;
  write_json(dir + "/config.json", c);
  expect_error([&] { load(dir); }, "tie_word_embeddings is false, but there is no lm_head.weight");
}

TEST(HFModelFolder, TiedConfigIgnoresAStoredLmHead) {
  // tiny-llama has its own lm_head; declaring it tied makes transformers (and
  // us) use the embedding instead.
  ThreadPool pool(2);
  auto backend = make_cpu_backend(2);
  const std::string dir = make_folder("tied", 1, "tiny-llama");
  std::vector<int32_t> tokens = {1, 50, 300, 7, 99};
  const auto untied = run_tokens(*Model::load(dir, *backend), tokens, 5);
  json c = read_json(dir + "/config.json");
  c["tie_word_embeddings"] = true;
  write_json(dir + "/config.json", c);
  auto model = Model::load(dir, *backend);
  const auto tied = run_tokens(*model, tokens, 5);
  EXPECT_GT(max_rel_gap(tied, untied, model->config().n_vocab), 0.1);
}

TEST(HFModelErrors, BrokenShardIndex) {
  const std::string dir = make_folder("shards", 2);
  const std::string index = dir + "/model.safetensors.index.json";
  const json good = read_json(index);
  ASSERT_NO_THROW(load(dir));

  json j = good;
  j["weight_map"]["model.layers.0.mlp.up_proj.weight"] = "model-00001-of-00002.safetensors";
  j["weight_map"]["model.layers.1.mlp.up_proj.weight"] = "model-00002-of-00002.safetensors";
  // One of the two moves to the wrong file.
  const std::string real0 = good["weight_map"]["model.layers.0.mlp.up_proj.weight"];
  const std::string real1 = good["weight_map"]["model.layers.1.mlp.up_proj.weight"];
  if (real0 == "model-00001-of-00002.safetensors" && real1 == "model-00002-of-00002.safetensors") {
    j["weight_map"]["model.layers.0.mlp.up_proj.weight"] = "model-00002-of-00002.safetensors";
  }
  write_json(index, j);
  expect_error([&] { load(dir); }, "which does not contain it");

  j = good;
  j["weight_map"]["model.norm.weight"] = "model-00003-of-00003.safetensors";
  write_json(index, j);
  expect_error([&] { load(dir); }, "which does not exist");

  j = good;
  j["weight_map"]["model.norm.weight"] = "../elsewhere.safetensors";
  write_json(index, j);
  expect_error([&] { load(dir); }, "not a plain file name");

  write_json(index, json{{"metadata", json::object()}});
  expect_error([&] { load(dir); }, "not a valid safetensors index");

  test::write_bytes(index, "not json");
  expect_error([&] { load(dir); }, "not a valid safetensors index");

  // The same tensor in two shards.
  write_json(index, good);
  const std::string first = dir + "/model-00001-of-00002.safetensors";
  test::edit_safetensors_header(first, [](json& h) {
    for (auto& [name, info] : h.items())
      if (name != "__metadata__") {
        h["model.norm.weight"] = info;  // bytes of another tensor: only the name matters here
        h["model.norm.weight"]["shape"] = {static_cast<int64_t>(info["data_offsets"][1].get<uint64_t>() -
                                                                info["data_offsets"][0].get<uint64_t>()) /
                                           4};
        break;
      }
  });
  expect_error([&] { load(dir); }, "appears twice");
}

TEST(HFWriter, RefusesWhatItCannotWrite) {
  ThreadPool pool(1);
  expect_error([&] { write_dummy_hf(scratch("q8"), DummySpec{"tiny-llama", DType::Q8_0, 0}, 1, pool); },
               "F32, F16 or BF16");
  expect_error([&] { write_dummy_hf(scratch("many"), DummySpec{"tiny-llama", DType::F32, 0}, 1000, pool); },
               "cannot split");
}

TEST(HFWriter, RewritingAFolderRemovesOldShards) {
  ThreadPool pool(1);
  const std::string dir = scratch("rewrite");
  write_dummy_hf(dir, DummySpec{"tiny-qwen2", DType::BF16, 0}, 3, pool);
  write_dummy_hf(dir, DummySpec{"tiny-qwen2", DType::F16, 0}, 1, pool);
  int files = 0;
  for (const auto& f : fs::directory_iterator(dir)) files += f.path().extension() == ".safetensors";
  EXPECT_EQ(files, 1);
  EXPECT_FALSE(fs::exists(fs::path(dir) / "model.safetensors.index.json"));
  EXPECT_NO_THROW(load(dir));
}

}  // namespace
}  // namespace pagellm
