#include "model/model_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/gguf.h"

namespace pagellm {

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::Llama: return "llama";
    case Arch::Qwen2: return "qwen2";
    case Arch::Qwen3: return "qwen3";
    case Arch::Gemma3: return "gemma3";
  }
  return "?";
}

namespace {

// Gemma 3: every 6th layer is global, the rest use a 512-token window; local
// layers use RoPE base 10000 without scaling.
constexpr int kGemma3SwaPattern = 6;
constexpr float kGemma3LocalRopeBase = 10000.0f;

}  // namespace

void finalize_config(ModelConfig& c, bool gguf_layout) {
  c.rope.n_rot = c.rope.n_rot ? c.rope.n_rot : c.head_dim;
  c.attn_scale = c.attn_scale > 0 ? c.attn_scale : 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  if (c.is_swa.empty()) c.is_swa.assign(c.n_layer, false);
  switch (c.arch) {
    case Arch::Llama: c.act = Activation::Silu; break;
    case Arch::Qwen2: c.qkv_bias = true; break;
    case Arch::Qwen3: c.qk_norm = true; break;
    case Arch::Gemma3:
      c.qk_norm = true;
      c.post_norms = true;
      c.act = Activation::GeluTanh;
      c.embd_scale = std::sqrt(static_cast<float>(c.n_embd));
      break;
  }
  if (c.arch == Arch::Gemma3 && c.sliding_window > 0 && std::none_of(c.is_swa.begin(), c.is_swa.end(), [](bool b) { return b; }))
    for (int il = 0; il < c.n_layer; ++il) c.is_swa[il] = (il + 1) % kGemma3SwaPattern != 0;
  // GGUF llama files store Q/K permuted for adjacent-pair rotation; HF
  // checkpoints and the other families rotate halves.
  c.rope.neox = !(gguf_layout && c.arch == Arch::Llama);
  c.rope_swa = c.rope;
  if (c.arch == Arch::Gemma3) {
    c.rope_swa.freq_base = c.rope_swa_base > 0 ? c.rope_swa_base : kGemma3LocalRopeBase;
    c.rope_swa.freq_scale = 1.0f;
  }
  c.validate();
}

namespace {

Arch arch_from_gguf_name(const std::string& a, const std::string& path) {
  if (a == "llama") return Arch::Llama;
  if (a == "qwen2") return Arch::Qwen2;
  if (a == "qwen3") return Arch::Qwen3;
  if (a == "gemma3") return Arch::Gemma3;
  fail("'{}': unsupported architecture '{}' (supported: llama, qwen2, qwen3, gemma3)", path, a);
}

}  // namespace

std::string ModelConfig::describe() const {
  return fmt::format("{} '{}': {} layers, hidden {}, heads {}/{} x {}, ffn {}, vocab {}, ctx {}", arch_name(arch), name,
                     n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx_train);
}

void ModelConfig::validate() const {
  PAGELLM_CHECK(n_embd > 0 && n_layer > 0 && n_head > 0 && n_head_kv > 0 && head_dim > 0 && n_ff > 0 && n_vocab > 0,
                "model hyperparameters missing or zero ({})", describe());
  PAGELLM_CHECK(n_head % n_head_kv == 0, "head count {} is not a multiple of the KV head count {}", n_head, n_head_kv);
  PAGELLM_CHECK(rope.n_rot > 0 && rope.n_rot <= head_dim && rope.n_rot % 2 == 0, "invalid RoPE dimension {}",
                rope.n_rot);
  PAGELLM_CHECK(static_cast<int>(is_swa.size()) == n_layer, "sliding-window layer flags do not match layer count");
  PAGELLM_CHECK(rope.freq_base > 0 && std::isfinite(rope.freq_base), "invalid RoPE base {}", rope.freq_base);
  PAGELLM_CHECK(norm_eps > 0, "invalid norm epsilon {}", norm_eps);
}

ModelConfig config_from_gguf(const GGUFFile& f) {
  const std::string a = f.get_string("general.architecture");
  ModelConfig c;
  c.arch = arch_from_gguf_name(a, f.path());
  c.name = f.get_string("general.name", a);
  auto key = [&](const std::string& k) { return a + "." + k; };
  c.n_embd = static_cast<int>(f.get_int(key("embedding_length")));
  c.n_layer = static_cast<int>(f.get_int(key("block_count")));
  c.n_ff = static_cast<int>(f.get_int(key("feed_forward_length")));
  c.n_head = static_cast<int>(f.get_int(key("attention.head_count")));
  c.n_head_kv = static_cast<int>(f.get_int(key("attention.head_count_kv"), c.n_head));
  c.n_ctx_train = static_cast<int>(f.get_int(key("context_length"), 2048));
  c.norm_eps = static_cast<float>(f.get_float(key("attention.layer_norm_rms_epsilon"), 1e-5));
  c.head_dim = static_cast<int>(f.get_int(key("attention.key_length"), c.n_head ? c.n_embd / c.n_head : 0));
  const int head_dim_v = static_cast<int>(f.get_int(key("attention.value_length"), c.head_dim));
  PAGELLM_CHECK(head_dim_v == c.head_dim, "'{}': different key and value head sizes are not supported", f.path());
  c.rope.n_rot = static_cast<int>(f.get_int(key("rope.dimension_count"), c.head_dim));
  c.rope.freq_base = static_cast<float>(f.get_float(key("rope.freq_base"), 10000.0));
  const std::string scaling = f.get_string(key("rope.scaling.type"), "none");
  if (scaling == "linear") {
    const double factor = f.get_float(key("rope.scaling.factor"), 1.0);
    if (factor > 0) c.rope.freq_scale = static_cast<float>(1.0 / factor);
  } else if (scaling != "none" && !scaling.empty()) {
    fail("'{}': RoPE scaling type '{}' is not supported", f.path(), scaling);
  }
  if (const auto* t = f.find_tensor("token_embd.weight")) c.n_vocab = static_cast<int>(t->rows());
  c.n_vocab = static_cast<int>(f.get_int(key("vocab_size"), c.n_vocab));
  if (c.arch == Arch::Gemma3) c.sliding_window = static_cast<int>(f.get_int(key("attention.sliding_window"), 512));
  finalize_config(c, true);
  return c;
}

ModelConfig config_from_hf_json(const std::string& path) {
  std::ifstream in(path);
  PAGELLM_CHECK(in.good(), "cannot open '{}'", path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    fail("'{}' is not valid JSON: {}", path, e.what());
  }
  // Multimodal Gemma 3 configs keep the language model under text_config.
  if (j.contains("text_config") && j["text_config"].is_object()) {
    nlohmann::json t = j["text_config"];
    if (!t.contains("architectures") && j.contains("architectures")) t["architectures"] = j["architectures"];
    j = t;
  }
  std::string a = j.value("architectures", nlohmann::json::array({""}))[0].get<std::string>();
  ModelConfig c;
  if (a == "LlamaForCausalLM" || a == "MistralForCausalLM") c.arch = Arch::Llama;
  else if (a == "Qwen2ForCausalLM") c.arch = Arch::Qwen2;
  else if (a == "Qwen3ForCausalLM") c.arch = Arch::Qwen3;
  else if (a == "Gemma3ForCausalLM" || a == "Gemma3ForConditionalGeneration") c.arch = Arch::Gemma3;
  else fail("'{}': unsupported architecture '{}' (supported: Llama, Mistral, Qwen2, Qwen3, Gemma3)", path, a);
  try {
    c.name = j.value("_name_or_path", std::string(arch_name(c.arch)));
    c.n_vocab = j.at("vocab_size").get<int>();
    c.n_embd = j.at("hidden_size").get<int>();
    c.n_layer = j.at("num_hidden_layers").get<int>();
    c.n_head = j.at("num_attention_heads").get<int>();
    c.n_head_kv = j.value("num_key_value_heads", c.n_head);
    c.n_ff = j.at("intermediate_size").get<int>();
    c.head_dim = (j.contains("head_dim") && !j["head_dim"].is_null()) ? j["head_dim"].get<int>() : c.n_embd / c.n_head;
    c.n_ctx_train = j.value("max_position_embeddings", 2048);
    c.norm_eps = j.value("rms_norm_eps", 1e-6f);
    c.rope.freq_base = j.value("rope_theta", 10000.0f);
    if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) {
      const auto& rs = j["rope_scaling"];
      const std::string type = rs.value("rope_type", rs.value("type", std::string("default")));
      if (type == "linear") c.rope.freq_scale = 1.0f / rs.at("factor").get<float>();
      else if (type != "default") fail("'{}': rope_scaling type '{}' is not supported", path, type);
    }
    if (c.arch == Arch::Qwen2) c.qkv_bias = true;
    if (c.arch == Arch::Gemma3) {
      c.sliding_window = j.value("sliding_window", 512);
      c.is_swa.assign(c.n_layer, false);
      if (j.contains("layer_types")) {
        for (int il = 0; il < c.n_layer; ++il) c.is_swa[il] = j["layer_types"].at(il) == "sliding_attention";
      } else {
        const int pattern = j.value("sliding_window_pattern", kGemma3SwaPattern);
        for (int il = 0; il < c.n_layer; ++il) c.is_swa[il] = (il + 1) % pattern != 0;
      }
      if (j.contains("query_pre_attn_scalar"))
        c.attn_scale = 1.0f / std::sqrt(j["query_pre_attn_scalar"].get<float>());
      c.final_softcap = j.value("final_logit_softcapping", nlohmann::json()).is_number()
                            ? j["final_logit_softcapping"].get<float>() : 0.0f;
      c.attn_softcap = j.value("attn_logit_softcapping", nlohmann::json()).is_number()
                           ? j["attn_logit_softcapping"].get<float>() : 0.0f;
    }
  } catch (const nlohmann::json::exception& e) {
    fail("'{}': missing or invalid field: {}", path, e.what());
  }
  if (c.arch == Arch::Gemma3) c.rope_swa_base = j.value("rope_local_base_freq", kGemma3LocalRopeBase);
  finalize_config(c, false);
  return c;
}

}  // namespace pagellm
