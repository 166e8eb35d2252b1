#include "model/model_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
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
  if (c.is_swa.empty()) {
    // GGUF files carry no per-layer flags: Gemma 3's fixed pattern applies.
    c.is_swa.assign(c.n_layer, false);
    if (c.arch == Arch::Gemma3 && c.sliding_window > 0)
      for (int il = 0; il < c.n_layer; ++il) c.is_swa[il] = (il + 1) % kGemma3SwaPattern != 0;
  }
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

namespace {

using nlohmann::json;

bool is_number(const json& j, const char* key) { return j.contains(key) && j[key].is_number(); }

// One RoPE parameter set: legacy keys (rope_theta, rope_scaling) or a
// transformers-5 rope_parameters entry ({"rope_type", "rope_theta", "factor"}).
// Only plain and linearly scaled RoPE are supported.
void apply_rope_params(const json& p, RopeConfig& r, const std::string& path) {
  if (!p.is_object()) return;
  if (is_number(p, "rope_theta")) r.freq_base = p["rope_theta"].get<float>();
  const std::string type = p.value("rope_type", p.value("type", std::string("default")));
  if (type == "linear") {
    const float factor = p.at("factor").get<float>();
    PAGELLM_CHECK(factor > 0, "'{}': invalid linear RoPE scaling factor {}", path, factor);
    r.freq_scale = 1.0f / factor;
  } else if (type != "default") {
    fail("'{}': RoPE type '{}' is not supported (default and linear are)", path, type);
  }
}

// Sliding-window layers from layer_types ("sliding_attention" / "full_attention").
std::vector<bool> swa_from_layer_types(const json& types, int n_layer, const std::string& path) {
  PAGELLM_CHECK(types.is_array() && static_cast<int>(types.size()) == n_layer,
                "'{}': layer_types must list one type per layer ({})", path, n_layer);
  std::vector<bool> swa(n_layer);
  for (int il = 0; il < n_layer; ++il) {
    const std::string t = types[il].get<std::string>();
    PAGELLM_CHECK(t == "sliding_attention" || t == "full_attention", "'{}': unknown layer type '{}'", path, t);
    swa[il] = t == "sliding_attention";
  }
  return swa;
}

}  // namespace

// Field defaults follow transformers' config classes for each family, so a
// config.json that omits a field means what it means to transformers.
ModelConfig config_from_hf_json(const std::string& path) {
  std::ifstream in(path);
  PAGELLM_CHECK(in.good(), "cannot open '{}'", path);
  json j;
  try {
    j = json::parse(in);
  } catch (const std::exception& e) {
    fail("'{}' is not valid JSON: {}", path, e.what());
  }
  PAGELLM_CHECK(j.is_object(), "'{}' is not a JSON object", path);
  // Multimodal Gemma 3 configs keep the language model under text_config.
  if (j.contains("text_config") && j["text_config"].is_object()) {
    json t = j["text_config"];
    for (const char* key : {"architectures", "tie_word_embeddings"})
      if (!t.contains(key) && j.contains(key)) t[key] = j[key];
    j = t;
  }
  std::string a;
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string())
    a = j["architectures"][0].get<std::string>();
  ModelConfig c;
  bool mistral = false;
  if (a == "LlamaForCausalLM") c.arch = Arch::Llama;
  else if (a == "MistralForCausalLM") c.arch = Arch::Llama, mistral = true;
  else if (a == "Qwen2ForCausalLM") c.arch = Arch::Qwen2;
  else if (a == "Qwen3ForCausalLM") c.arch = Arch::Qwen3;
  else if (a == "Gemma3ForCausalLM" || a == "Gemma3ForConditionalGeneration") c.arch = Arch::Gemma3;
  else fail("'{}': unsupported architecture '{}' (supported: Llama, Mistral, Qwen2, Qwen3, Gemma3)", path, a);
  const bool gemma = c.arch == Arch::Gemma3;
  try {
    const std::filesystem::path folder = std::filesystem::path(path).parent_path();
    c.name = j.value("_name_or_path", folder.filename().string());
    if (c.name.empty()) c.name = arch_name(c.arch);
    // Multimodal Gemma 3 text_configs leave out what equals Gemma3TextConfig's
    // defaults (vocabulary, heads); other families must say.
    auto size = [&](const char* key, int gemma_default) {
      if (gemma && !j.contains(key)) return gemma_default;
      return j.at(key).get<int>();
    };
    c.n_vocab = size("vocab_size", 262208);
    c.n_embd = size("hidden_size", 2304);
    c.n_layer = size("num_hidden_layers", 26);
    c.n_head = size("num_attention_heads", 8);
    c.n_head_kv = is_number(j, "num_key_value_heads") ? j["num_key_value_heads"].get<int>() : gemma ? 4 : c.n_head;
    c.n_ff = size("intermediate_size", 9216);
    PAGELLM_CHECK(c.n_head > 0 && c.n_layer > 0, "'{}': num_attention_heads and num_hidden_layers must be positive",
                  path);
    const int default_head_dim = gemma ? 256 : c.arch == Arch::Qwen3 ? 128 : c.n_embd / c.n_head;
    c.head_dim = is_number(j, "head_dim") ? j["head_dim"].get<int>() : default_head_dim;
    c.n_ctx_train = is_number(j, "max_position_embeddings") ? j["max_position_embeddings"].get<int>()
                    : gemma                                  ? 131072
                                                             : 2048;
    c.norm_eps = is_number(j, "rms_norm_eps") ? j["rms_norm_eps"].get<float>() : 1e-6f;
    c.tie_word_embeddings = j.contains("tie_word_embeddings") && j["tie_word_embeddings"].is_boolean()
                                ? j["tie_word_embeddings"].get<bool>()
                                : gemma;

    // Activation and biases: what the forward pass computes is fixed per
    // family; refuse configs that ask for something else.
    const std::string act = gemma ? j.value("hidden_activation", j.value("hidden_act", std::string("gelu_pytorch_tanh")))
                                  : j.value("hidden_act", std::string("silu"));
    if (gemma)
      PAGELLM_CHECK(act == "gelu_pytorch_tanh" || act == "gelu_tanh", "'{}': activation '{}' is not supported for {}",
                    path, act, a);
    else
      PAGELLM_CHECK(act == "silu", "'{}': activation '{}' is not supported for {}", path, act, a);
    PAGELLM_CHECK(!j.value("attention_bias", false) || c.arch == Arch::Qwen2,
                  "'{}': attention_bias (biases on q/k/v/o projections) is not supported for {}", path, a);
    PAGELLM_CHECK(!j.value("mlp_bias", false), "'{}': mlp_bias is not supported", path);

    // RoPE: legacy keys first, then transformers-5 rope_parameters (which win,
    // as in transformers). Gemma 3 keeps one set per layer type.
    c.rope.freq_base = is_number(j, "rope_theta") ? j["rope_theta"].get<float>() : gemma ? 1e6f : 10000.0f;
    if (j.contains("rope_scaling")) apply_rope_params(j["rope_scaling"], c.rope, path);
    RopeConfig local;
    local.freq_base = is_number(j, "rope_local_base_freq") ? j["rope_local_base_freq"].get<float>() : kGemma3LocalRopeBase;
    if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {
      const json& rp = j["rope_parameters"];
      if (gemma && (rp.contains("full_attention") || rp.contains("sliding_attention"))) {
        if (rp.contains("full_attention")) apply_rope_params(rp["full_attention"], c.rope, path);
        if (rp.contains("sliding_attention")) apply_rope_params(rp["sliding_attention"], local, path);
      } else {
        apply_rope_params(rp, c.rope, path);
      }
    }
    if (is_number(j, "partial_rotary_factor"))
      PAGELLM_CHECK(j["partial_rotary_factor"].get<float>() == 1.0f, "'{}': partial_rotary_factor is not supported",
                    path);

    // Sliding-window layers.
    c.is_swa.assign(c.n_layer, false);
    if (gemma) {
      PAGELLM_CHECK(!j.value("use_bidirectional_attention", false),
                    "'{}': use_bidirectional_attention is not supported", path);
      PAGELLM_CHECK(local.freq_scale == 1.0f, "'{}': scaled RoPE on sliding-window layers is not supported", path);
      c.rope_swa_base = local.freq_base;
      c.sliding_window = is_number(j, "sliding_window") ? j["sliding_window"].get<int>() : 4096;
      if (j.contains("layer_types") && !j["layer_types"].is_null()) {
        c.is_swa = swa_from_layer_types(j["layer_types"], c.n_layer, path);
      } else {
        const int pattern = is_number(j, "sliding_window_pattern") ? j["sliding_window_pattern"].get<int>()
                                                                    : kGemma3SwaPattern;
        PAGELLM_CHECK(pattern > 0, "'{}': invalid sliding_window_pattern {}", path, pattern);
        for (int il = 0; il < c.n_layer; ++il) c.is_swa[il] = (il + 1) % pattern != 0;
      }
      c.attn_scale = 1.0f / std::sqrt(is_number(j, "query_pre_attn_scalar") ? j["query_pre_attn_scalar"].get<float>()
                                                                             : 256.0f);
      c.final_softcap = is_number(j, "final_logit_softcapping") ? j["final_logit_softcapping"].get<float>() : 0.0f;
      c.attn_softcap = is_number(j, "attn_logit_softcapping") ? j["attn_logit_softcapping"].get<float>() : 0.0f;
    } else if (mistral) {
      // Mistral: every layer uses the window when one is set (v0.1).
      c.sliding_window = is_number(j, "sliding_window") ? j["sliding_window"].get<int>() : 0;
      c.is_swa.assign(c.n_layer, c.sliding_window > 0);
    } else if (c.arch == Arch::Qwen2 || c.arch == Arch::Qwen3) {
      // Qwen: the window applies only with use_sliding_window, to the layers
      // layer_types marks (by default those from max_window_layers on).
      if (j.value("use_sliding_window", false) && is_number(j, "sliding_window")) {
        c.sliding_window = j["sliding_window"].get<int>();
        if (j.contains("layer_types") && !j["layer_types"].is_null()) {
          c.is_swa = swa_from_layer_types(j["layer_types"], c.n_layer, path);
        } else {
          const int first = is_number(j, "max_window_layers") ? j["max_window_layers"].get<int>() : 28;
          for (int il = 0; il < c.n_layer; ++il) c.is_swa[il] = il >= first;
        }
      }
    }
    PAGELLM_CHECK(c.sliding_window >= 0, "'{}': invalid sliding_window {}", path, c.sliding_window);
  } catch (const nlohmann::json::exception& e) {
    fail("'{}': missing or invalid field: {}", path, e.what());
  }
  finalize_config(c, false);
  return c;
}

}  // namespace pagellm
