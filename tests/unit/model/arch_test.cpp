// The architecture table (model/arch): names map both ways, unknown and
// Mixture-of-Experts families are refused by name, RoPE variants read from
// configs, and every dummy shape computes the same function loaded from its
// GGUF file and from its Hugging Face folder.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "hostile_input.h"
#include "model/arch.h"
#include "format/gguf.h"
#include "model/dummy.h"
#include "model/hf_writer.h"
#include "model/model.h"
#include "model/model_test_util.h"
#include "test_paths.h"

namespace pagellm {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::expect_error_with;

std::string scratch(const std::string& name) {
  const fs::path p = fs::path(test::temp_dir()) / "arch_test" / name;
  fs::create_directories(p.parent_path());
  return p.string();
}

// The registry of family files (model/families): every family once, found
// by its identity, with unique names and classes, tensors, and a tiny dummy
// shape to be tested with; every dummy shape belongs to the family it names.
TEST(Families, RegistryIsConsistent) {
  std::set<std::string> gguf_names, classes, shapes;
  for (const ArchInfo& a : all_archs()) {
    // A family whose GGUF files carry another's name (XLM-R's "bert") shares it.
    if (a.gguf_shared) EXPECT_NE(arch_by_gguf_name(a.gguf_name), nullptr) << a.gguf_name;
    else EXPECT_TRUE(gguf_names.insert(a.gguf_name).second) << a.gguf_name;
    EXPECT_EQ(&arch_info(a.arch), &a) << a.gguf_name;
    EXPECT_FALSE(a.globals.empty() || a.layer.empty()) << a.gguf_name;
    for (const HfClass& h : a.hf_classes) EXPECT_TRUE(classes.insert(h.name).second) << h.name;
    bool tiny = false;
    for (const DummyShape& d : a.dummy_shapes) {
      EXPECT_TRUE(shapes.insert(d.name).second) << d.name;
      tiny = tiny || std::string_view(d.name).starts_with("tiny-");
      EXPECT_EQ(dummy_config(d.name, 512).arch, a.arch) << d.name;
    }
    EXPECT_TRUE(tiny) << a.gguf_name << " has no tiny dummy shape";
  }
  EXPECT_EQ(shapes.size(), dummy_shape_names().size());
}

ModelConfig config_of(const json& j, const std::string& name = "cfg") {
  const std::string dir = scratch(name);
  fs::create_directories(dir);
  std::ofstream(dir + "/config.json") << j.dump(2);
  return config_from_hf_json(dir + "/config.json");
}

json small_config(const char* arch) {
  return {{"architectures", {arch}}, {"vocab_size", 512},       {"hidden_size", 256}, {"intermediate_size", 512},
          {"num_hidden_layers", 2},  {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 64}};
}

TEST(ArchTable, HfNamesMapBackToTheirTensors) {
  for (const ArchInfo& a : all_archs()) {
    if (a.gguf_shared) EXPECT_NE(arch_by_gguf_name(a.gguf_name), &a);
    else EXPECT_EQ(arch_by_gguf_name(a.gguf_name), &a);
    for (const HfClass& h : a.hf_classes) EXPECT_EQ(arch_by_hf_class(h.name), &a);
    for (const TensorSpec& t : a.layer) {
      if (t.need == Need::Derived) {  // made at load (MLA's absorbed weights), in no file
        EXPECT_FALSE(*t.hf) << a.gguf_name << " " << t.gguf;
        continue;
      }
      if (t.need == Need::IfKvBFused) {  // older GGUF files only (HF's kv_b_proj loads as the split pair)
        EXPECT_FALSE(*t.hf) << a.gguf_name << " " << t.gguf;
        continue;
      }
      ASSERT_TRUE(*t.hf) << a.gguf_name << " " << t.gguf;
      // Experts: HF names each one ("{}" is its index), the loader asks for
      // "<gguf>[e]"; or HF stacks them (gpt-oss), one tensor for all.
      std::string hf = t.hf, want = std::string("blk.11.") + t.gguf;
      const bool per_expert = t.experts && hf.find("{}") != std::string::npos;
      if (per_expert) {
        hf.replace(hf.find("{}"), 2, "37");
        want += "[37]";
      }
      // Decoders: their layers under "model.layers." (multimodal classes nest
      // them); BERT: under "encoder.layer.", with "bert." before it in task classes.
      std::vector<std::string> prefixes = {a.hf_layers};
      if (std::string(a.hf_layers) == "model.layers.")
        prefixes = {"model.layers.", "language_model.model.layers.", "model.language_model.layers."};
      else if (a.hf_base_prefix)
        prefixes.push_back(std::string(a.hf_base_prefix) + a.hf_layers);
      for (const std::string& prefix : prefixes) {
        // A fused gate_up maps to both halves, in table order.
        const auto all = hf_tensors(a, std::string(prefix) + "11." + hf);
        const auto got = std::find_if(all.begin(), all.end(), [&](const HfTensor& h) { return h.spec == &t; });
        ASSERT_NE(got, all.end()) << a.gguf_name << " " << prefix << hf;
        EXPECT_EQ(got->gguf, want);
        EXPECT_EQ(all.size() == 2, t.transform == Transform::GateUpEven || t.transform == Transform::GateUpOdd ||
                                       t.transform == Transform::GateUpFirstHalf ||
                                       t.transform == Transform::GateUpSecondHalf ||
                                       t.transform == Transform::KvBKeys || t.transform == Transform::KvBValues ||
                                       t.transform == Transform::QkvzQkv || t.transform == Transform::QkvzZ);
      }
      if (per_expert) {
        std::string bad = t.hf;
        EXPECT_FALSE(hf_tensor(a, "model.layers.0." + bad.replace(bad.find("{}"), 2, "x"))) << bad;
      }
    }
    for (const TensorSpec& t : a.globals) {
      if (!*t.hf) continue;  // rope_freqs: GGUF only
      EXPECT_EQ(hf_tensor(a, t.hf)->gguf, t.gguf) << a.gguf_name;
    }
    EXPECT_FALSE(hf_tensor(a, "model.layers.x.self_attn.q_proj.weight"));
    EXPECT_FALSE(hf_tensor(a, "model.layers.0.unknown.weight"));
  }
  // BertForSequenceClassification: the encoder under "bert.", its head by llama.cpp's names.
  const ArchInfo& bert = arch_info(Arch::Bert);
  EXPECT_EQ(hf_tensor(bert, "bert.embeddings.word_embeddings.weight")->gguf, "token_embd.weight");
  EXPECT_EQ(hf_tensor(bert, "bert.pooler.dense.weight")->gguf, "cls.weight");
  EXPECT_EQ(hf_tensor(bert, "classifier.weight")->gguf, "cls.output.weight");
  EXPECT_EQ(hf_tensor(bert, "classifier.bias")->gguf, "cls.output.bias");
  EXPECT_FALSE(hf_tensor(bert, "bert.embeddings.position_ids"));
  // XLMRobertaForSequenceClassification: the encoder under "roberta.", its
  // head (classifier.dense, classifier.out_proj) by llama.cpp's names.
  const ArchInfo& xlmr = arch_info(Arch::XlmRoberta);
  EXPECT_EQ(hf_tensor(xlmr, "roberta.embeddings.position_embeddings.weight")->gguf, "position_embd.weight");
  EXPECT_EQ(hf_tensor(xlmr, "embeddings.position_embeddings.weight")->gguf, "position_embd.weight");
  EXPECT_EQ(hf_tensor(xlmr, "classifier.dense.weight")->gguf, "cls.weight");
  EXPECT_EQ(hf_tensor(xlmr, "classifier.out_proj.bias")->gguf, "cls.output.bias");
  EXPECT_FALSE(hf_tensor(xlmr, "pooler.dense.weight"));  // XLMRobertaModel's pooler: not what embedders read
  // Its GGUF files are llama.cpp's "bert": they load as BERT.
  EXPECT_EQ(arch_by_gguf_name("bert"), &bert);
  // Llama calls the FFN norm post_attention_layernorm; Gemma has both norms.
  EXPECT_EQ(hf_tensor(arch_info(Arch::Llama), "model.layers.0.post_attention_layernorm.weight")->gguf,
            "blk.0.ffn_norm.weight");
  EXPECT_EQ(hf_tensor(arch_info(Arch::Gemma3), "model.layers.0.post_attention_layernorm.weight")->gguf,
            "blk.0.post_attention_norm.weight");
}

TEST(ArchErrors, UnknownAndMixtureOfExpertsFamiliesAreNamed) {
  // A family without MoE layers that says it has experts.
  GGUFWriter w;
  w.set_string("general.architecture", "gemma3");
  w.set_u32("gemma3.expert_count", 8);
  const std::string path = scratch("moe.gguf");
  w.write(path);
  auto f = GGUFFile::open(path);
  expect_error_with([&] { config_from_gguf(*f); }, "gemma3.expert_count");

  GGUFWriter q;
  q.set_string("general.architecture", "dbrx");
  q.write(path);
  f = GGUFFile::open(path);
  expect_error_with([&] { config_from_gguf(*f); }, "unsupported architecture 'dbrx' (Mixture-of-Experts");

  json j = small_config("GraniteMoeForCausalLM");
  expect_error_with([&] { config_of(j); }, "unsupported architecture 'GraniteMoeForCausalLM' (Mixture-of-Experts");
  j = small_config("Gemma3ForCausalLM");
  j["num_experts"] = 8;
  expect_error_with([&] { config_of(j); },
                    "architecture 'Gemma3ForCausalLM' with num_experts = 8: Mixture-of-Experts layers are not supported");
  j = small_config("Qwen3MoeForCausalLM");
  expect_error_with([&] { config_of(j); }, "Qwen3MoeForCausalLM needs num_experts");
  j["num_experts"] = 8;
  j["num_experts_per_tok"] = 9;
  expect_error_with([&] { config_of(j); }, "num_experts_per_tok");
  j["num_experts_per_tok"] = 2;
  j["mlp_only_layers"] = {0};
  expect_error_with([&] { config_of(j); }, "mlp_only_layers");
}

// Llama 3.1 8B's scaling: factor 8 over an original context of 8192.
// XLMRobertaConfig: positions start past the padding row (pad_token_id + 1
// rows of max_position_embeddings come before position 0), one token type is
// read whatever type_vocab_size says, classifiers count their labels; what
// the encoder does not compute is refused by name.
TEST(XlmRobertaConfig, PositionsPastThePaddingRowAndRefusals) {
  json j = {{"architectures", {"XLMRobertaModel"}}, {"vocab_size", 512}, {"hidden_size", 64},
            {"intermediate_size", 128}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
            {"max_position_embeddings", 514}, {"type_vocab_size", 1}, {"layer_norm_eps", 1e-5},
            {"pad_token_id", 1}, {"hidden_act", "gelu"}};
  ModelConfig c = config_of(j, "xlmr");
  EXPECT_EQ(c.arch, Arch::XlmRoberta);
  EXPECT_TRUE(c.non_causal);
  EXPECT_EQ(c.hf_pos_offset, 2);
  EXPECT_EQ(c.n_ctx_train, 512);
  EXPECT_EQ(c.n_token_types, 1);
  EXPECT_EQ(c.n_cls_out, 0);
  EXPECT_FLOAT_EQ(c.norm_eps, 1e-5f);
  j["pad_token_id"] = 0;
  j["type_vocab_size"] = 2;  // RobertaConfig's default; the tokenizer gives no types
  j["architectures"] = {"RobertaForSequenceClassification"};
  j["id2label"] = {{"0", "LABEL_0"}};
  c = config_of(j, "roberta");
  EXPECT_EQ(c.hf_pos_offset, 1);
  EXPECT_EQ(c.n_ctx_train, 513);
  EXPECT_EQ(c.n_token_types, 1);
  EXPECT_EQ(c.n_cls_out, 1);
  struct Bad {
    const char* key;
    json value;
    const char* what;
  };
  const std::vector<Bad> refused = {{"position_embedding_type", "relative_key", "relative_key"},
                                    {"is_decoder", true, "is_decoder"},
                                    {"add_cross_attention", true, "add_cross_attention"},
                                    {"max_position_embeddings", 1, "no position after the padding row"},
                                    {"hidden_act", "gelu_new", "activation 'gelu_new'"},
                                    {"type_vocab_size", 0, "type_vocab_size"}};
  for (const Bad& b : refused) {
    json bad = j;
    bad[b.key] = b.value;
    expect_error_with([&] { config_of(bad, "xlmr-bad"); }, b.what);
  }
}

TEST(Llama3Rope, FactorsFollowTransformers) {
  const ModelConfig::Llama3Rope p{8.0f, 1.0f, 4.0f, 8192};
  const std::vector<float> f = llama3_rope_factors(p, 500000.0f, 128);
  ASSERT_EQ(f.size(), 64u);
  EXPECT_EQ(f.front(), 1.0f);  // short wavelengths are kept
  EXPECT_EQ(f.back(), 8.0f);   // long ones divided by the factor
  for (size_t i = 1; i < f.size(); ++i) EXPECT_GE(f[i], f[i - 1]);
  // Between the bands: 1 / ((1 - s) / factor + s), s = (8192 / wavelen - 1) / (4 - 1).
  int medium = 0;
  for (int i = 0; i < 64; ++i) {
    const double wavelen = 2 * 3.141592653589793 / std::pow(500000.0, -2.0 * i / 128);
    if (wavelen < 8192 / 4.0 || wavelen > 8192) continue;
    const double s = (8192 / wavelen - 1) / 3;
    EXPECT_NEAR(f[i], 1 / ((1 - s) / 8 + s), 1e-5) << i;
    ++medium;
  }
  EXPECT_GT(medium, 0);
}

TEST(Llama3Rope, ReadFromRopeScalingOrRopeParameters) {
  json j = small_config("LlamaForCausalLM");
  j["rope_theta"] = 500000.0;
  j["rope_scaling"] = {{"rope_type", "llama3"},
                       {"factor", 8.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  const ModelConfig legacy = config_of(j);
  EXPECT_EQ(legacy.rope_freq_factors, llama3_rope_factors({8.0f, 1.0f, 4.0f, 8192}, 500000.0f, 64));
  EXPECT_EQ(legacy.rope.freq_scale, 1.0f);
  json t5 = small_config("LlamaForCausalLM");
  t5["rope_parameters"] = j["rope_scaling"];
  t5["rope_parameters"]["rope_theta"] = 500000.0;
  EXPECT_EQ(config_of(t5).rope_freq_factors, legacy.rope_freq_factors);
  t5["rope_parameters"].erase("low_freq_factor");
  expect_error_with([&] { config_of(t5); }, "missing or invalid field");
  t5["rope_parameters"]["low_freq_factor"] = 5.0;  // above high_freq_factor
  expect_error_with([&] { config_of(t5); }, "invalid llama3 RoPE scaling");
}

TEST(Gemma2Config, DefaultsSoftcapsAndAlternatingWindows) {
  json j = small_config("Gemma2ForCausalLM");
  j["num_hidden_layers"] = 4;
  ModelConfig c = config_of(j);
  EXPECT_EQ(c.arch, Arch::Gemma2);
  EXPECT_EQ(c.attn_softcap, 50.0f);
  EXPECT_EQ(c.final_softcap, 30.0f);
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_EQ(c.is_swa, (std::vector<bool>{true, false, true, false}));  // even layers local
  EXPECT_EQ(c.attn_scale, 1.0f / 16);  // query_pre_attn_scalar 256
  EXPECT_TRUE(c.post_norms);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.act, Activation::GeluTanh);
  EXPECT_EQ(c.rope_swa.freq_base, c.rope.freq_base);
  EXPECT_TRUE(c.tie_word_embeddings);
  j["attn_logit_softcapping"] = nullptr;  // null: no cap
  j["final_logit_softcapping"] = 20.0;
  j["query_pre_attn_scalar"] = 144;
  j["layer_types"] = {"full_attention", "sliding_attention", "full_attention", "full_attention"};
  c = config_of(j);
  EXPECT_EQ(c.attn_softcap, 0.0f);
  EXPECT_EQ(c.final_softcap, 20.0f);
  EXPECT_EQ(c.attn_scale, 1.0f / 12);
  EXPECT_EQ(c.is_swa, (std::vector<bool>{false, true, false, false}));

  // GGUF: the softcap and window keys.
  ThreadPool pool(1);
  const std::string path = scratch("gemma2.gguf");
  write_dummy_gguf(path, DummySpec{"tiny-gemma2", DType::F32, 0}, nullptr, pool);
  const ModelConfig g = config_from_gguf(*GGUFFile::open(path));
  EXPECT_EQ(g.attn_softcap, 5.0f);
  EXPECT_EQ(g.final_softcap, 3.0f);
  EXPECT_EQ(g.sliding_window, 32);
  EXPECT_EQ(g.is_swa, (std::vector<bool>{true, false, true, false}));
}

TEST(Phi3Config, PartialRotarySlidingWindowAndLongRope) {
  json j = small_config("Phi3ForCausalLM");
  j["partial_rotary_factor"] = 0.75;
  j["sliding_window"] = 2047;
  ModelConfig c = config_of(j);
  EXPECT_EQ(c.arch, Arch::Phi3);
  EXPECT_EQ(c.rope.n_rot, 48);
  EXPECT_TRUE(c.rope.neox);
  EXPECT_EQ(c.is_swa, std::vector<bool>(2, true));
  EXPECT_EQ(c.sliding_window, 2047);
  // LongRoPE: one factor per rotated pair; Phi-3 keeps the original context
  // at the top level, and the attention factor follows from the ratio.
  j["rope_scaling"] = {{"type", "longrope"}, {"short_factor", {1.0}}, {"long_factor", {1.0}}};
  expect_error_with([&] { config_of(j); }, "do not match the rotary dimension 48");
  j["rope_scaling"] = {{"type", "longrope"},
                       {"short_factor", std::vector<double>(24, 1.5)},
                       {"long_factor", std::vector<double>(24, 3.0)}};
  j["max_position_embeddings"] = 131072;
  j["original_max_position_embeddings"] = 4096;
  const ModelConfig lr = config_of(j);
  EXPECT_EQ(lr.rope_factors_short, std::vector<float>(24, 1.5f));
  EXPECT_EQ(lr.rope_factors_long, std::vector<float>(24, 3.0f));
  EXPECT_EQ(lr.rope.n_ctx_orig, 4096);
  EXPECT_FLOAT_EQ(lr.rope.attn_factor, static_cast<float>(std::sqrt(1 + std::log(32.0) / std::log(4096.0))));
  j["rope_scaling"]["long_factor"] = std::vector<double>(24, -1.0);
  expect_error_with([&] { config_of(j); }, "long_factor holds -1.0, not a positive number");
  j.erase("rope_scaling");
  json l = small_config("LlamaForCausalLM");
  l["partial_rotary_factor"] = 0.5;
  expect_error_with([&] { config_of(l); }, "partial_rotary_factor 0.5 is not supported for LlamaForCausalLM");

  // The fused tensors split into the table's parts, in HF's order (q, k, v; gate, up).
  const ArchInfo& a = arch_info(Arch::Phi3);
  const ModelConfig d = dummy_config("tiny-phi3", 512);
  const auto qkv = hf_tensor(a, "model.layers.0.self_attn.qkv_proj.weight");
  ASSERT_TRUE(qkv);
  EXPECT_EQ(qkv->gguf, "blk.0.attn_qkv.weight");
  EXPECT_EQ(qkv->spec->slots, (std::vector<Slot>{Slot::Q, Slot::K, Slot::V}));
  EXPECT_EQ(qkv->spec->split_rows(d), (std::vector<int64_t>{256, 128, 128}));
  const auto gate_up = hf_tensor(a, "model.layers.0.mlp.gate_up_proj.weight");
  ASSERT_TRUE(gate_up);
  EXPECT_EQ(gate_up->spec->slots, (std::vector<Slot>{Slot::Gate, Slot::Up}));

  // GGUF LongRoPE factors are refused, not ignored.
  ThreadPool pool(1);
  const std::string path = scratch("phi3.gguf");
  write_dummy_gguf(path, DummySpec{"tiny-phi3", DType::F32, 0}, nullptr, pool);
  EXPECT_EQ(config_from_gguf(*GGUFFile::open(path)).rope.n_rot, 32);
  auto f = GGUFFile::open(path);
  GGUFWriter w;
  for (const auto& [k, v] : f->metadata()) w.set_value(k, v);
  for (const auto& t : f->tensors()) {
    w.add_tensor(t.name, t.type, t.shape, std::vector<uint8_t>(t.data, t.data + t.nbytes));
  }
  w.add_tensor("rope_factors_short.weight", DType::F32, {16}, std::vector<uint8_t>(64, 0));
  const std::string longrope = scratch("phi3-longrope.gguf");
  w.write(longrope);
  expect_error_with([&] { config_from_gguf(*GGUFFile::open(longrope)); },
                    "LongRoPE needs both rope_factors_short.weight and rope_factors_long.weight");
}

TEST(GptOssConfig, DefaultsAndQuantizedCheckpointsRefused) {
  // A config.json with only the sizes: GptOssConfig's defaults (YaRN x32
  // over 4096, untruncated; alternating windows of 128).
  json j = {{"architectures", {"GptOssForCausalLM"}}, {"vocab_size", 512}, {"hidden_size", 256},
            {"num_hidden_layers", 4}, {"num_attention_heads", 8}, {"num_key_value_heads", 2},
            {"intermediate_size", 256}, {"num_local_experts", 4}, {"num_experts_per_tok", 2}};
  const ModelConfig c = config_of(j);
  EXPECT_EQ(c.arch, Arch::GptOss);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.act, Activation::SwigluOai);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_EQ(c.rope.freq_base, 150000.0f);
  EXPECT_EQ(c.rope.freq_scale, 1.0f / 32);
  EXPECT_EQ(c.rope.n_ctx_orig, 4096);
  EXPECT_FALSE(c.rope.yarn_truncate);
  EXPECT_EQ(c.sliding_window, 128);
  EXPECT_EQ(c.is_swa, (std::vector<bool>{true, false, true, false}));
  EXPECT_EQ(c.n_ff_exp, 256);
  EXPECT_TRUE(c.expert_norm_topk);
  // gpt-oss's own MXFP4 checkpoints load; other quantized checkpoints are refused by name.
  json q = j;
  q["quantization_config"] = {{"quant_method", "mxfp4"}};
  EXPECT_EQ(config_of(q).arch, Arch::GptOss);
  q["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}};
  expect_error_with([&] { config_of(q); }, "quantized Hugging Face checkpoints (quant_method 'gptq')");
  json lq = small_config("LlamaForCausalLM");
  lq["quantization_config"] = {{"quant_method", "mxfp4"}};
  expect_error_with([&] { config_of(lq); }, "quantized Hugging Face checkpoints (quant_method 'mxfp4')");
  json s = j;
  s["swiglu_limit"] = 10.0;
  expect_error_with([&] { config_of(s); }, "swiglu_limit 10 are not supported");
}

// Qwen3.5: layer kinds from full_attention_interval (default 4) or
// layer_types, Qwen3_5TextConfig's linear sizes and partial rotary factor,
// the multimodal class's text_config; GGUF files are refused by name.
TEST(Qwen35Config, LayerKindsDefaultsAndTextConfig) {
  json j = {{"architectures", {"Qwen3_5ForCausalLM"}}, {"vocab_size", 512}, {"hidden_size", 256},
            {"num_hidden_layers", 8}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
            {"intermediate_size", 512}, {"head_dim", 64}};
  const ModelConfig c = config_of(j);
  EXPECT_EQ(c.arch, Arch::Qwen35);
  EXPECT_EQ(c.is_linear, (std::vector<bool>{true, true, true, false, true, true, true, false}));
  EXPECT_EQ(c.linear.n_k_heads, 16);
  EXPECT_EQ(c.linear.n_v_heads, 32);
  EXPECT_EQ(c.linear.head_k_dim, 128);
  EXPECT_EQ(c.linear.conv_kernel, 4);
  EXPECT_EQ(c.rope.n_rot, 16);  // partial_rotary_factor 0.25
  EXPECT_TRUE(c.rope.neox);
  EXPECT_TRUE(c.attn_out_gate);
  json t = j;
  t["full_attention_interval"] = 2;
  t["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e7}, {"partial_rotary_factor", 0.5},
                          {"mrope_section", {2, 3, 3}}, {"mrope_interleaved", true}};
  const ModelConfig c2 = config_of(t);
  EXPECT_EQ(c2.is_linear, (std::vector<bool>{true, false, true, false, true, false, true, false}));
  EXPECT_EQ(c2.rope.n_rot, 32);
  EXPECT_EQ(c2.rope.freq_base, 1e7f);
  json mm = {{"architectures", {"Qwen3_5ForConditionalGeneration"}}, {"model_type", "qwen3_5"}, {"text_config", j}};
  mm["text_config"].erase("architectures");
  mm["text_config"]["layer_types"] = {"linear_attention", "full_attention", "full_attention", "linear_attention",
                                      "linear_attention", "linear_attention", "linear_attention", "full_attention"};
  const ModelConfig c3 = config_of(mm);
  EXPECT_EQ(c3.arch, Arch::Qwen35);
  EXPECT_EQ(c3.is_linear, (std::vector<bool>{true, false, false, true, true, true, true, false}));
  json bad = j;
  bad["layer_types"] = {"linear_attention"};
  expect_error_with([&] { config_of(bad); }, "layer_types must list one type per layer");
  bad["layer_types"] = std::vector<std::string>(8, "linear_attention");
  expect_error_with([&] { config_of(bad); }, "at least one full-attention layer");

  EXPECT_FALSE(c3.linear.v_heads_tiled);  // HF checkpoints group value heads by key head
}

// GGUF qwen35 as llama.cpp's converter writes it: SSM keys, recurrent_layers,
// value heads tiled; a file without one of the sizes is refused by name.
TEST(Qwen35Config, GgufKeysAsLlamaCppWritesThem) {
  ThreadPool pool(2);
  const std::string gguf = scratch("tiny-qwen35.gguf");
  write_dummy_gguf(gguf, DummySpec{"tiny-qwen35", DType::F32, 1}, nullptr, pool);
  const ModelConfig c = config_from_gguf(*GGUFFile::open(gguf));
  EXPECT_EQ(c.is_linear, (std::vector<bool>{true, false, true, false}));
  EXPECT_EQ(c.linear.n_k_heads, 2);
  EXPECT_EQ(c.linear.n_v_heads, 4);
  EXPECT_EQ(c.linear.head_k_dim, 64);
  EXPECT_EQ(c.linear.head_v_dim, 64);
  EXPECT_EQ(c.linear.conv_kernel, 4);
  EXPECT_TRUE(c.linear.v_heads_tiled);
  EXPECT_EQ(c.rope.n_rot, 16);
  auto backend = make_cpu_backend(1);
  EXPECT_TRUE(Model::load(gguf, *backend)->has_linear_layers());

  // The same file without qwen35.ssm.state_size.
  const auto f = GGUFFile::open(gguf);
  GGUFWriter w;
  for (const auto& [k, v] : f->metadata())
    if (k != "qwen35.ssm.state_size") w.set_value(k, v);
  for (const auto& t : f->tensors()) {
    const auto* b = static_cast<const uint8_t*>(t.data);
    w.add_tensor(t.name, t.type, t.shape, std::vector<uint8_t>(b, b + t.nbytes));
  }
  const std::string bad = scratch("tiny-qwen35-no-state-size.gguf");
  w.write(bad);
  expect_error_with([&] { Model::load(bad, *backend); }, "qwen35.ssm.state_size");
}

// DeepSeek V3 / V2 config.json: MLA sizes make the cache one latent head;
// YaRN's mscale_all_dim scales the attention; the router's options.
TEST(ArchConfig, DeepseekMlaAndRouter) {
  json j = small_config("DeepseekV3ForCausalLM");
  j["n_routed_experts"] = 16;
  j["num_experts_per_tok"] = 4;
  j["moe_intermediate_size"] = 128;
  j["kv_lora_rank"] = 512;
  j["q_lora_rank"] = 384;
  j["qk_nope_head_dim"] = 128;
  j["qk_rope_head_dim"] = 64;
  j["v_head_dim"] = 128;
  j["n_group"] = 4;
  j["topk_group"] = 2;
  j["first_k_dense_replace"] = 1;
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 40.0}, {"mscale", 1.0}, {"mscale_all_dim", 1.0},
                       {"original_max_position_embeddings", 4096}, {"beta_fast", 32}, {"beta_slow", 1}};
  const ModelConfig c = config_of(j);
  EXPECT_EQ(c.head_dim, 576);
  EXPECT_EQ(c.n_head_kv, 1);
  EXPECT_EQ(c.rope.n_rot, 64);
  EXPECT_FALSE(c.rope.neox);  // adjacent pairs (rope_interleave)
  EXPECT_EQ(c.mla.q_lora_rank, 384);
  const double m = 0.1 * std::log(40.0) + 1;
  EXPECT_FLOAT_EQ(c.attn_scale, static_cast<float>(m * m / std::sqrt(192.0)));
  EXPECT_FLOAT_EQ(c.rope.attn_factor * static_cast<float>(m), 1.0f);  // mscale / mscale_all_dim = 1
  EXPECT_EQ(c.n_dense_lead, 1);
  EXPECT_EQ(c.n_ff_shexp, 128);  // n_shared_experts defaults to 1
  EXPECT_EQ(c.expert_scoring, RouterScoring::Sigmoid);
  EXPECT_TRUE(c.expert_choice_bias);
  EXPECT_TRUE(c.expert_norm_topk);
  EXPECT_EQ(c.expert_weights_scale, 2.5f);
  EXPECT_EQ(c.routing().n_group, 4);
  EXPECT_EQ(c.routing().topk_group, 2);
  EXPECT_TRUE(c.layer_is_moe(1));
  EXPECT_FALSE(c.layer_is_moe(0));
  json bad = j;
  bad["topk_method"] = "greedy";
  expect_error_with([&] { config_of(bad); }, "topk_method 'greedy' is not supported");
  bad = j;
  bad["topk_group"] = 1;  // 4 of 16 experts cannot all come from one group of 4... they can: 4 <= 1 * 4
  EXPECT_NO_THROW(config_of(bad));
  bad["num_experts_per_tok"] = 5;
  expect_error_with([&] { config_of(bad); }, "invalid expert groups");
  bad = j;
  bad["kv_lora_rank"] = 1000;
  expect_error_with([&] { config_of(bad); }, "kv_lora_rank");

  // V2-Lite: no q-LoRA, softmax greedy routing, no choice bias.
  json v2 = j;
  v2["architectures"] = {"DeepseekV2ForCausalLM"};
  v2["q_lora_rank"] = nullptr;
  v2.erase("rope_scaling");
  v2.erase("n_group");
  v2.erase("topk_group");
  const ModelConfig c2 = config_of(v2);
  EXPECT_EQ(c2.mla.q_lora_rank, 0);
  EXPECT_EQ(c2.expert_scoring, RouterScoring::Softmax);
  EXPECT_FALSE(c2.expert_choice_bias);
  EXPECT_FALSE(c2.expert_norm_topk);
  EXPECT_EQ(c2.routing().n_group, 1);
  EXPECT_FLOAT_EQ(c2.attn_scale, static_cast<float>(1 / std::sqrt(192.0)));
  v2["topk_method"] = "group_limited_greedy";
  v2["n_group"] = 4;
  v2["topk_group"] = 2;
  EXPECT_EQ(config_of(v2).routing().group_score, GroupScore::Max);
  v2["norm_topk_prob"] = true;
  expect_error_with([&] { config_of(v2); }, "norm_topk_prob true is not supported for DeepseekV2ForCausalLM");
  // GGUF files: deepseek_gguf_test.cpp.
}

// GLM-4.5 config.json: Glm4MoeConfig's defaults (half of each head rotates,
// one dense layer, one shared expert, ungrouped sigmoid routing), q/k norms
// only with use_qk_norm, and the q/k/v biases it requires.
TEST(ArchConfig, Glm4MoeDefaultsAndOptions) {
  json j = small_config("Glm4MoeForCausalLM");
  j["head_dim"] = 128;
  j["attention_bias"] = true;
  j["n_routed_experts"] = 16;
  j["num_experts_per_tok"] = 4;
  j["moe_intermediate_size"] = 128;
  const ModelConfig c = config_of(j);
  EXPECT_EQ(c.arch, Arch::Glm4Moe);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rope.n_rot, 64);
  EXPECT_TRUE(c.rope.neox);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.n_dense_lead, 1);
  EXPECT_EQ(c.n_ff_shexp, 128);
  EXPECT_EQ(c.expert_scoring, RouterScoring::Sigmoid);
  EXPECT_TRUE(c.expert_choice_bias);
  EXPECT_TRUE(c.expert_norm_topk);
  EXPECT_EQ(c.expert_weights_scale, 1.0f);
  EXPECT_EQ(c.routing().n_group, 1);
  EXPECT_FALSE(c.layer_is_moe(0));
  EXPECT_TRUE(c.layer_is_moe(1));

  json o = j;
  o["use_qk_norm"] = true;
  o["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1000000}, {"partial_rotary_factor", 0.25}};
  o["n_group"] = 4;
  o["topk_group"] = 2;
  o["routed_scaling_factor"] = 2.5;
  o["n_shared_experts"] = 2;
  o["first_k_dense_replace"] = 2;
  o["num_nextn_predict_layers"] = 1;  // the MTP block: not run
  const ModelConfig d = config_of(o);
  EXPECT_TRUE(d.qk_norm);
  EXPECT_EQ(d.rope.n_rot, 32);
  EXPECT_EQ(d.rope.freq_base, 1000000.0f);
  EXPECT_EQ(d.routing().n_group, 4);
  EXPECT_EQ(d.routing().topk_group, 2);
  EXPECT_EQ(d.expert_weights_scale, 2.5f);
  EXPECT_EQ(d.n_ff_shexp, 256);
  EXPECT_EQ(d.n_dense_lead, 2);
  EXPECT_EQ(d.n_layer, 2);

  json bad = j;
  bad.erase("attention_bias");
  expect_error_with([&] { config_of(bad); }, "without attention_bias");
  bad = j;
  bad["use_qk_norm"] = 1;
  expect_error_with([&] { config_of(bad); }, "use_qk_norm must be true or false");
  bad = j;
  bad["first_k_dense_replace"] = 3;
  expect_error_with([&] { config_of(bad); }, "invalid first_k_dense_replace 3");
  bad = j;
  bad["n_group"] = 3;
  expect_error_with([&] { config_of(bad); }, "invalid expert groups");
}

// A LongRoPE model takes the long factors when it serves more than the
// original context, the short ones within it (llama.cpp's rule).
TEST(Phi3Config, LongRopePicksTheFactorSetByContext) {
  ThreadPool pool(1);
  const std::string path = scratch("phi3-longrope-ok.gguf");
  write_dummy_gguf(path, DummySpec{"tiny-phi3-longrope", DType::F32, 0}, nullptr, pool);
  auto backend = make_cpu_backend(1);
  auto m = Model::load(path, *backend);
  EXPECT_EQ(m->config().rope.n_ctx_orig, 32);
  ASSERT_TRUE(m->config().rope.freq_factors);
  EXPECT_EQ(m->config().rope.freq_factors->name, "rope_factors_long.weight");
  EXPECT_EQ(m->config().rope_swa.freq_factors, m->config().rope.freq_factors) << "every Phi-3 layer is windowed";
  m->set_context_length(32);
  EXPECT_EQ(m->config().rope.freq_factors->name, "rope_factors_short.weight");
  m->set_context_length(33);
  EXPECT_EQ(m->config().rope.freq_factors->name, "rope_factors_long.weight");
}

std::vector<float> run(Model& m, const std::vector<int32_t>& tokens) {
  test::PagedRunner runner(m, 16, 16, DType::F32);
  return runner.feed(tokens, 16, true);
}

// A GLM-4.5 GGUF counts its multi-token-prediction block in block_count
// (nextn_predict_layers), with or without that block's tensors: pagellm runs
// the other layers, and computes what the file without the block computes.
TEST(ArchDummies, Glm4MoeGgufSkipsTheNextnBlock) {
  ThreadPool pool(2);
  auto backend = make_cpu_backend(2);
  const std::string plain = scratch("glm4moe.gguf");
  write_dummy_gguf(plain, DummySpec{"tiny-glm4moe", DType::F32, 5}, nullptr, pool);
  std::vector<int32_t> tokens;
  for (int i = 0; i < 24; ++i) tokens.push_back(3 + (i * 71) % 500);
  std::vector<float> want;
  {
    auto m = Model::load(plain, *backend);
    EXPECT_EQ(m->config().n_layer, 3);
    EXPECT_EQ(m->config().n_dense_lead, 1);
    EXPECT_EQ(m->config().routing().n_group, 4);
    EXPECT_EQ(m->config().routing().topk_group, 2);
    EXPECT_EQ(m->config().expert_scoring, RouterScoring::Sigmoid);
    EXPECT_TRUE(m->config().expert_choice_bias);
    EXPECT_TRUE(m->config().qk_norm);
    EXPECT_EQ(m->config().rope.n_rot, 64);
    want = run(*m, tokens);
  }
  auto f = GGUFFile::open(plain);
  const int64_t n_embd = f->get_int("glm4moe.embedding_length");
  // with_block: the block's tensors as llama.cpp's converter writes them (a
  // copy of the last layer plus the nextn projections); block_count_extra: how
  // many layers block_count claims beyond the model's.
  auto rewrite = [&](const std::string& path, bool with_block, uint32_t block_count_extra) {
    GGUFWriter w;
    for (const auto& [k, v] : f->metadata())
      if (k != "glm4moe.block_count") w.set_value(k, v);
    w.set_u32("glm4moe.block_count", 3 + block_count_extra);
    w.set_u32("glm4moe.nextn_predict_layers", 1);
    auto bytes = [](const GGUFTensorInfo& t) { return std::vector<uint8_t>(t.data, t.data + t.nbytes); };
    for (const GGUFTensorInfo& t : f->tensors()) {
      w.add_tensor(t.name, t.type, t.shape, bytes(t));
      if (with_block && t.name.starts_with("blk.2."))
        w.add_tensor("blk.3." + t.name.substr(6), t.type, t.shape, bytes(t));
    }
    if (with_block) {
      const std::vector<float> ones(static_cast<size_t>(2 * n_embd * n_embd), 0.5f);
      auto f32 = [](const float* p, size_t n) {
        return std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(p), reinterpret_cast<const uint8_t*>(p + n));
      };
      w.add_tensor("blk.3.nextn.eh_proj.weight", DType::F32, {2 * n_embd, n_embd}, f32(ones.data(), ones.size()));
      for (const char* n : {"blk.3.nextn.enorm.weight", "blk.3.nextn.hnorm.weight"})
        w.add_tensor(n, DType::F32, {n_embd}, f32(ones.data(), static_cast<size_t>(n_embd)));
    }
    w.write(path);
  };
  for (const bool with_block : {true, false}) {
    const std::string path = scratch(with_block ? "glm4moe-mtp.gguf" : "glm4moe-mtp-trunk.gguf");
    rewrite(path, with_block, 1);
    auto m = Model::load(path, *backend);
    EXPECT_EQ(m->config().n_layer, 3) << with_block;
    EXPECT_EQ(test::max_rel_gap(run(*m, tokens), want, m->config().n_vocab), 0.0) << with_block;
  }
  const std::string bad = scratch("glm4moe-mtp-bad.gguf");
  rewrite(bad, true, 3);  // block_count 6: neither 6 nor 6 - 1 layers in the tensors (4)
  expect_error_with([&] { Model::load(bad, *backend); }, "glm4moe.block_count = 6 does not match the tensors");
}

// Qwen3-Next's GGUF files (llama.cpp's qwen3next) keep the value heads
// grouped by key head, Qwen3.5's tile them; its config.json's defaults.
TEST(ArchConfig, Qwen3NextValueHeadOrderAndDefaults) {
  ThreadPool pool(1);
  for (const auto& [shape, tiled] : {std::pair{"tiny-qwen3next", false}, std::pair{"tiny-qwen35moe", true}}) {
    const std::string path = scratch(std::string(shape) + "-heads.gguf");
    write_dummy_gguf(path, DummySpec{shape, DType::F32, 0}, nullptr, pool);
    auto f = GGUFFile::open(path);
    const ModelConfig c = config_from_gguf(*f);
    EXPECT_EQ(c.linear.v_heads_tiled, tiled) << shape;
    EXPECT_EQ(c.linear.n_k_heads, 2) << shape;
    EXPECT_EQ(c.linear.n_v_heads, 4) << shape;
  }
  {  // an early conversion: in_proj_qkvz fused as ssm_in
    auto f = GGUFFile::open(scratch("tiny-qwen3next-heads.gguf"));
    GGUFWriter w;
    for (const auto& [k, v] : f->metadata()) w.set_value(k, v);
    for (const GGUFTensorInfo& t : f->tensors()) {
      const std::string name = t.name == "blk.0.attn_qkv.weight" ? "blk.0.ssm_in.weight" : t.name;
      w.add_tensor(name, t.type, t.shape, std::vector<uint8_t>(t.data, t.data + t.nbytes));
    }
    const std::string legacy = scratch("tiny-qwen3next-ssm-in.gguf");
    w.write(legacy);
    auto g = GGUFFile::open(legacy);
    expect_error_with([&] { config_from_gguf(*g); }, "fused ssm_in tensor");
  }
  json j = small_config("Qwen3NextForCausalLM");
  j["num_hidden_layers"] = 8;
  j["num_experts"] = 8;
  j["num_experts_per_tok"] = 2;
  j["moe_intermediate_size"] = 128;
  j["shared_expert_intermediate_size"] = 128;
  const ModelConfig c = config_of(j);
  EXPECT_EQ(c.arch, Arch::Qwen3Next);
  EXPECT_FALSE(c.linear.v_heads_tiled);
  EXPECT_EQ(c.linear.n_k_heads, 16);  // Qwen3NextConfig's linear defaults
  EXPECT_EQ(c.linear.n_v_heads, 32);
  EXPECT_EQ(c.n_linear_layers(), 6);  // every 4th layer full (full_attention_interval 4)
  EXPECT_FALSE(c.layer_is_linear(3));
  EXPECT_EQ(c.rope.n_rot, 16);  // a quarter of 64
  EXPECT_TRUE(c.expert_norm_topk);
  EXPECT_TRUE(c.attn_out_gate);
  j["mlp_only_layers"] = {1};
  expect_error_with([&] { config_of(j); }, "mlp_only_layers");
}

// The new shapes, written as GGUF and as HF folders by make-dummy's writers,
// load to the same function.
TEST(ArchDummies, GGUFAndHFLoadsAgree) {
  ThreadPool pool(2);
  auto backend = make_cpu_backend(2);
  std::vector<int32_t> tokens;
  for (int i = 0; i < 40; ++i) tokens.push_back(1 + (i * 53) % 500);
  for (const char* shape : {"tiny-llama3", "tiny-gemma2", "tiny-phi3", "tiny-glm4moe", "tiny-qwen3next"}) {
    const DummySpec spec{shape, DType::F32, 3};
    const std::string gguf = scratch(std::string(shape) + ".gguf");
    write_dummy_gguf(gguf, spec, nullptr, pool);
    auto gm = Model::load(gguf, *backend);
    const std::vector<float> want = run(*gm, tokens);
    gm.reset();
    const std::string dir = scratch(std::string(shape) + "-hf");
    write_dummy_hf(dir, spec, 1, pool);
    auto hm = Model::load(dir, *backend);
    EXPECT_LE(test::max_rel_gap(run(*hm, tokens), want, hm->config().n_vocab), 1e-5) << shape;
  }
}

// tiny-llama3 is tiny-llama (same tensor names, so the same weights) with
// Llama 3 scaling: the factors must change what it computes.
// A decode step reads only the routed experts: the roofline counts k of n.
TEST(ArchDummies, MoeDecodeBytesCountOnlyRoutedExperts) {
  ThreadPool pool(2);
  auto backend = make_cpu_backend(2);
  const ModelConfig cfg = dummy_config("tiny-qwen2moe", 512);
  auto src = make_dummy_source(cfg, DummySpec{"tiny-qwen2moe", DType::Q8_0, 1}, pool);
  auto model = Model::from_source(cfg, *src, *backend);
  size_t experts = 0;
  for (int il = 0; il < cfg.n_layer; ++il)
    for (const char* n : {"ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"}) {
      const TensorData* t = src->find("blk." + std::to_string(il) + "." + n);
      ASSERT_TRUE(t) << n;
      experts += dtype_row_bytes(t->type, t->cols()) * static_cast<size_t>(t->rows());
    }
  const size_t embd = [&] {
    const TensorData* t = src->find("token_embd.weight");
    return dtype_row_bytes(t->type, t->cols()) * static_cast<size_t>(t->rows());
  }();
  EXPECT_EQ(model->decode_weight_bytes(),
            model->weight_bytes() - embd - experts + experts / cfg.n_expert * cfg.n_expert_used);
}

// MLA's absorbed matrices (stacked per head, as experts are) are F16 for a
// quantized file, F32 for an F32 one, and the roofline counts them whole:
// every token reads every head's.
TEST(ArchDummies, MlaAbsorbedMatricesAreReadWholeAndF16ForQuantizedFiles) {
  ThreadPool pool(2);
  auto backend = make_cpu_backend(2);
  const ModelConfig cfg = dummy_config("tiny-deepseek2", 512);
  for (DType type : {DType::Q8_0, DType::F32}) {
    auto src = make_dummy_source(cfg, DummySpec{"tiny-deepseek2", type, 1}, pool);
    const auto derived = arch_info(cfg.arch).derive_tensors(cfg, *src);
    const TensorData* q = derived->find("blk.0.mla_q_absorb.weight");
    const TensorData* o = derived->find("blk.0.mla_o_absorb.weight");
    ASSERT_TRUE(q && o);
    const DType want = type == DType::F32 ? DType::F32 : DType::F16;
    EXPECT_EQ(q->type, want) << dtype_name(type);
    EXPECT_EQ(o->type, want) << dtype_name(type);
    auto model = Model::from_source(cfg, *src, *backend);
    size_t experts = 0;
    for (int il = 0; il < cfg.n_layer; ++il)
      for (const char* n : {"ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"})
        if (const TensorData* t = src->find("blk." + std::to_string(il) + "." + n))
          experts += dtype_row_bytes(t->type, t->cols()) * static_cast<size_t>(t->rows());
    ASSERT_GT(experts, 0u);
    const TensorData* embd = src->find("token_embd.weight");
    const size_t embd_bytes = dtype_row_bytes(embd->type, embd->cols()) * static_cast<size_t>(embd->rows());
    EXPECT_EQ(model->decode_weight_bytes(),
              model->weight_bytes() - embd_bytes - experts + experts / cfg.n_expert * cfg.n_expert_used)
        << dtype_name(type);
  }
}

// A one-row matrix may be [n] (GGUF) or [n, 1] (HF); a norm given [n, 1]
// must be refused, not uploaded as a matrix that rms_norm cannot read.
TEST(ArchDummies, OnlyMatricesDropATrailingOne) {
  struct Reshaped : TensorSource {
    const TensorSource& base;
    std::string name;
    TensorData t;
    Reshaped(const TensorSource& b, std::string n) : base(b), name(std::move(n)), t(*b.find(name)) {
      t.shape.push_back(1);
    }
    const TensorData* find(const std::string& n) const override { return n == name ? &t : base.find(n); }
    size_t count() const override { return base.count(); }
  };
  ThreadPool pool(2);
  auto backend = make_cpu_backend(2);
  const ModelConfig cfg = dummy_config("tiny-qwen2moe", 512);
  auto src = make_dummy_source(cfg, DummySpec{"tiny-qwen2moe", DType::F32, 1}, pool);
  expect_error_with([&] { Model::from_source(cfg, Reshaped(*src, "blk.1.attn_norm.weight"), *backend); },
                    "tensor 'blk.1.attn_norm.weight' has shape [256, 1], expected [256]");
  // The shared expert's gate: [n_embd] in the dummy (as llama.cpp writes it), [n_embd, 1] as HF stores it.
  EXPECT_NO_THROW(Model::from_source(cfg, Reshaped(*src, "blk.1.ffn_gate_inp_shexp.weight"), *backend));
}

TEST(ArchDummies, Llama3ScalingChangesTheFunction) {
  ThreadPool pool(2);
  auto backend = make_cpu_backend(2);
  std::vector<int32_t> tokens;
  for (int i = 0; i < 40; ++i) tokens.push_back(1 + (i * 53) % 500);
  std::vector<float> out[2];
  int k = 0;
  for (const char* shape : {"tiny-llama", "tiny-llama3"}) {
    const ModelConfig cfg = dummy_config(shape, dummy_vocab_size(shape, nullptr));
    auto src = make_dummy_source(cfg, DummySpec{shape, DType::F32, 3}, pool);
    auto m = Model::from_source(cfg, *src, *backend);
    out[k++] = run(*m, tokens);
  }
  EXPECT_GT(test::max_rel_gap(out[1], out[0], 512), 1e-3);
}

// The tiny Gemma 2's caps bind (else the GGUF/HF agreement would not test
// that both read them).
TEST(ArchDummies, Gemma2SoftcapsChangeTheFunction) {
  ThreadPool pool(2);
  auto backend = make_cpu_backend(2);
  std::vector<int32_t> tokens;
  for (int i = 0; i < 40; ++i) tokens.push_back(1 + (i * 53) % 500);
  const ModelConfig cfg = dummy_config("tiny-gemma2", dummy_vocab_size("tiny-gemma2", nullptr));
  auto src = make_dummy_source(cfg, DummySpec{"tiny-gemma2", DType::F32, 3}, pool);
  auto capped = Model::from_source(cfg, *src, *backend);
  const std::vector<float> want = run(*capped, tokens);
  capped.reset();
  for (int which = 0; which < 2; ++which) {
    ModelConfig c = cfg;
    (which == 0 ? c.attn_softcap : c.final_softcap) = 0;
    auto m = Model::from_source(c, *src, *backend);
    EXPECT_GT(test::max_rel_gap(run(*m, tokens), want, 512), 1e-3) << (which == 0 ? "attention" : "final");
  }
}

}  // namespace
}  // namespace pagellm
