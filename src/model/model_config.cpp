#include "model/model_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/error.h"
#include "core/json_limits.h"
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
  c.check_sizes();  // before is_swa and anything else is sized from them
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

// An integer key in [lo, hi] (the fallback when absent); narrowing to int is
// safe after the check.
int gguf_size(const GGUFFile& f, const std::string& key, std::optional<int64_t> fallback, int64_t lo, int64_t hi) {
  const GGUFValue* v = f.find(key);
  if (v && v->type == GGUFType::U64 && v->u > static_cast<uint64_t>(hi))
    fail("'{}': {} = {} is out of range ({} to {})", f.path(), key, v->u, lo, hi);
  const int64_t n = fallback ? f.get_int(key, *fallback) : f.get_int(key);
  if (n < lo || n > hi) fail("'{}': {} = {} is out of range ({} to {})", f.path(), key, n, lo, hi);
  return static_cast<int>(n);
}

// One past the highest N of the file's "blk.N." tensors (0 when there are none).
int64_t layers_in_tensors(const GGUFFile& f) {
  int64_t layers = 0;
  for (const auto& t : f.tensors()) {
    const std::string_view name = t.name;
    if (!name.starts_with("blk.")) continue;
    int64_t il = -1;
    const char* end = name.data() + name.size();
    const auto [ptr, ec] = std::from_chars(name.data() + 4, end, il);
    // Indices past the limit count as the limit + 1: enough for the mismatch error.
    if (ec == std::errc() && ptr != end && *ptr == '.' && il >= 0)
      layers = std::max(layers, std::min(il, ModelSizeLimits::kLayers) + 1);
  }
  return layers;
}

}  // namespace

std::string ModelConfig::describe() const {
  return fmt::format("{} '{}': {} layers, hidden {}, heads {}/{} x {}, ffn {}, vocab {}, ctx {}", arch_name(arch), name,
                     n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx_train);
}

void ModelConfig::check_sizes() const {
  PAGELLM_CHECK(n_embd > 0 && n_layer > 0 && n_head > 0 && n_head_kv > 0 && head_dim > 0 && n_ff > 0 && n_vocab > 0,
                "model hyperparameters missing or zero ({})", describe());
  using L = ModelSizeLimits;
  const struct {
    const char* name;
    int64_t value, max;
  } sizes[] = {
      {"n_layer", n_layer, L::kLayers},      {"n_embd", n_embd, L::kEmbd},
      {"n_head", n_head, L::kHeads},         {"n_head_kv", n_head_kv, L::kHeads},
      {"head_dim", head_dim, L::kHeadDim},   {"n_ff", n_ff, L::kFeedForward},
      {"n_vocab", n_vocab, L::kVocab},       {"n_ctx_train", n_ctx_train, L::kContext},
  };
  for (const auto& s : sizes)
    PAGELLM_CHECK(s.value >= 1 && s.value <= s.max, "model hyperparameter {} = {} is out of range (1 to {})", s.name,
                  s.value, s.max);
  PAGELLM_CHECK(sliding_window >= 0 && sliding_window <= L::kContext,
                "model hyperparameter sliding_window = {} is out of range (0 to {})", sliding_window, L::kContext);
}

void ModelConfig::validate() const {
  check_sizes();
  PAGELLM_CHECK(n_head % n_head_kv == 0, "head count {} is not a multiple of the KV head count {}", n_head, n_head_kv);
  PAGELLM_CHECK(rope.n_rot > 0 && rope.n_rot <= head_dim && rope.n_rot % 2 == 0, "invalid RoPE dimension {}",
                rope.n_rot);
  PAGELLM_CHECK(static_cast<int>(is_swa.size()) == n_layer, "sliding-window layer flags do not match layer count");
  PAGELLM_CHECK(rope.freq_base > 0 && std::isfinite(rope.freq_base), "invalid RoPE base {}", rope.freq_base);
  PAGELLM_CHECK(norm_eps > 0 && std::isfinite(norm_eps), "invalid norm epsilon {}", norm_eps);
  PAGELLM_CHECK(rope.freq_scale > 0 && std::isfinite(rope.freq_scale), "invalid RoPE scale {}", rope.freq_scale);
  PAGELLM_CHECK(attn_scale > 0 && std::isfinite(attn_scale), "invalid attention scale {}", attn_scale);
  PAGELLM_CHECK(attn_softcap >= 0 && std::isfinite(attn_softcap) && final_softcap >= 0 && std::isfinite(final_softcap),
                "invalid logit softcapping ({}, {})", attn_softcap, final_softcap);
}

ModelConfig config_from_gguf(const GGUFFile& f) {
  const std::string a = f.get_string("general.architecture");
  ModelConfig c;
  c.arch = arch_from_gguf_name(a, f.path());
  c.name = f.get_string("general.name", a);
  auto key = [&](const std::string& k) { return a + "." + k; };
  // Every size is range-checked as it is read, and the layer count against
  // the tensors, before anything is sized from them.
  using L = ModelSizeLimits;
  c.n_embd = gguf_size(f, key("embedding_length"), std::nullopt, 1, L::kEmbd);
  c.n_layer = gguf_size(f, key("block_count"), std::nullopt, 1, L::kLayers);
  // A file without any layer tensors is left to the loader, which names the
  // first missing tensor.
  const int64_t tensor_layers = layers_in_tensors(f);
  if (tensor_layers > 0 && c.n_layer != tensor_layers)
    fail("'{}': {} = {} does not match the tensors, which hold {} layers", f.path(), key("block_count"), c.n_layer,
         tensor_layers);
  c.n_ff = gguf_size(f, key("feed_forward_length"), std::nullopt, 1, L::kFeedForward);
  c.n_head = gguf_size(f, key("attention.head_count"), std::nullopt, 1, L::kHeads);
  c.n_head_kv = gguf_size(f, key("attention.head_count_kv"), c.n_head, 1, L::kHeads);
  c.n_ctx_train = gguf_size(f, key("context_length"), 2048, 1, L::kContext);
  c.norm_eps = static_cast<float>(f.get_float(key("attention.layer_norm_rms_epsilon"), 1e-5));
  c.head_dim = gguf_size(f, key("attention.key_length"), c.n_embd / c.n_head, 1, L::kHeadDim);
  const int head_dim_v = gguf_size(f, key("attention.value_length"), c.head_dim, 1, L::kHeadDim);
  PAGELLM_CHECK(head_dim_v == c.head_dim, "'{}': different key and value head sizes are not supported", f.path());
  c.rope.n_rot = gguf_size(f, key("rope.dimension_count"), c.head_dim, 1, L::kHeadDim);
  c.rope.freq_base = static_cast<float>(f.get_float(key("rope.freq_base"), 10000.0));
  const std::string scaling = f.get_string(key("rope.scaling.type"), "none");
  if (scaling == "linear") {
    const double factor = f.get_float(key("rope.scaling.factor"), 1.0);
    if (factor > 0) c.rope.freq_scale = static_cast<float>(1.0 / factor);
  } else if (scaling != "none" && !scaling.empty()) {
    fail("'{}': RoPE scaling type '{}' is not supported", f.path(), scaling);
  }
  int64_t embd_rows = 0;
  if (const auto* t = f.find_tensor("token_embd.weight")) embd_rows = t->rows();
  if (embd_rows > L::kVocab)
    fail("'{}': token_embd.weight has {} rows, more than the vocabulary limit of {}", f.path(), embd_rows, L::kVocab);
  if (embd_rows == 0 && !f.has(key("vocab_size")))
    fail("'{}': neither a token_embd.weight tensor nor {} gives the vocabulary size", f.path(), key("vocab_size"));
  c.n_vocab = gguf_size(f, key("vocab_size"), embd_rows, 1, L::kVocab);
  if (c.arch == Arch::Gemma3) c.sliding_window = gguf_size(f, key("attention.sliding_window"), 512, 0, L::kContext);
  finalize_config(c, true);
  return c;
}

namespace {

using nlohmann::json;

bool is_number(const json& j, const char* key) { return j.contains(key) && j[key].is_number(); }

// An integer field in [lo, hi]. A float must be a whole number, checked
// before converting (casting an out-of-range double is undefined).
int hf_int(const json& j, const char* key, int64_t lo, int64_t hi, const std::string& path) {
  const json& v = j.at(key);
  int64_t n = 0;
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi)) {
    n = hi + 1;  // reported below as out of range
  } else if (v.is_number_integer()) {
    n = v.get<int64_t>();
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!(d >= static_cast<double>(lo) && d <= static_cast<double>(hi)) || d != std::floor(d))
      fail("'{}': {} = {} is not an integer from {} to {}", path, key, d, lo, hi);
    n = static_cast<int64_t>(d);
  } else {
    fail("'{}': missing or invalid field: {} must be an integer, not {}", path, key, v.type_name());
  }
  if (n < lo || n > hi) fail("'{}': {} = {} is out of range ({} to {})", path, key, v.dump(), lo, hi);
  return static_cast<int>(n);
}

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
  json j = read_json_file_bounded(path, kConfigJsonLimits);
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
    // Sizes are range-checked as they are read: is_swa and the weights are
    // sized from them.
    using L = ModelSizeLimits;
    auto size = [&](const char* key, int gemma_default, int64_t max) {
      if (gemma && !j.contains(key)) return gemma_default;
      return hf_int(j, key, 1, max, path);
    };
    c.n_vocab = size("vocab_size", 262208, L::kVocab);
    c.n_embd = size("hidden_size", 2304, L::kEmbd);
    c.n_layer = size("num_hidden_layers", 26, L::kLayers);
    c.n_head = size("num_attention_heads", 8, L::kHeads);
    c.n_head_kv = is_number(j, "num_key_value_heads") ? hf_int(j, "num_key_value_heads", 1, L::kHeads, path)
                  : gemma                              ? 4
                                                       : c.n_head;
    c.n_ff = size("intermediate_size", 9216, L::kFeedForward);
    const int default_head_dim = gemma ? 256 : c.arch == Arch::Qwen3 ? 128 : c.n_embd / c.n_head;
    c.head_dim = is_number(j, "head_dim") ? hf_int(j, "head_dim", 1, L::kHeadDim, path) : default_head_dim;
    c.n_ctx_train = is_number(j, "max_position_embeddings") ? hf_int(j, "max_position_embeddings", 1, L::kContext, path)
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
      c.sliding_window = is_number(j, "sliding_window") ? hf_int(j, "sliding_window", 0, L::kContext, path) : 4096;
      if (j.contains("layer_types") && !j["layer_types"].is_null()) {
        c.is_swa = swa_from_layer_types(j["layer_types"], c.n_layer, path);
      } else {
        const int pattern = is_number(j, "sliding_window_pattern")
                                ? hf_int(j, "sliding_window_pattern", 1, L::kLayers, path)
                                : kGemma3SwaPattern;
        for (int il = 0; il < c.n_layer; ++il) c.is_swa[il] = (il + 1) % pattern != 0;
      }
      c.attn_scale = 1.0f / std::sqrt(is_number(j, "query_pre_attn_scalar") ? j["query_pre_attn_scalar"].get<float>()
                                                                             : 256.0f);
      c.final_softcap = is_number(j, "final_logit_softcapping") ? j["final_logit_softcapping"].get<float>() : 0.0f;
      c.attn_softcap = is_number(j, "attn_logit_softcapping") ? j["attn_logit_softcapping"].get<float>() : 0.0f;
    } else if (mistral) {
      // Mistral: every layer uses the window when one is set (v0.1).
      c.sliding_window = is_number(j, "sliding_window") ? hf_int(j, "sliding_window", 0, L::kContext, path) : 0;
      c.is_swa.assign(c.n_layer, c.sliding_window > 0);
    } else if (c.arch == Arch::Qwen2 || c.arch == Arch::Qwen3) {
      // Qwen: the window applies only with use_sliding_window, to the layers
      // layer_types marks (by default those from max_window_layers on).
      if (j.value("use_sliding_window", false) && is_number(j, "sliding_window")) {
        c.sliding_window = hf_int(j, "sliding_window", 0, L::kContext, path);
        if (j.contains("layer_types") && !j["layer_types"].is_null()) {
          c.is_swa = swa_from_layer_types(j["layer_types"], c.n_layer, path);
        } else {
          const int first =
              is_number(j, "max_window_layers") ? hf_int(j, "max_window_layers", 0, INT32_MAX, path) : 28;
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
