#include "model/model_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <numbers>
#include <optional>

#include "core/error.h"
#include "core/json_limits.h"
#include "model/arch.h"
#include "format/gguf.h"

namespace pagellm {

void finalize_config(ModelConfig& c, bool gguf_layout) {
  c.check_sizes();  // before is_swa and anything else is sized from them
  const ArchInfo& a = arch_info(c.arch);
  c.rope.n_rot = c.rope.n_rot ? c.rope.n_rot : c.head_dim;
  c.attn_scale = c.attn_scale > 0 ? c.attn_scale : 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  if (c.is_swa.empty()) {
    // GGUF files carry no per-layer flags: the family's fixed pattern applies.
    c.is_swa.assign(c.n_layer, false);
    if (a.swa_pattern > 0 && c.sliding_window > 0)
      for (int il = 0; il < c.n_layer; ++il) c.is_swa[il] = (il + 1) % a.swa_pattern != 0;
    if (a.swa_every_layer && c.sliding_window > 0) c.is_swa.assign(c.n_layer, true);
  }
  if (a.qkv_bias) c.qkv_bias = true;
  if (a.qk_norm) c.qk_norm = true;
  if (a.attn_out_gate) c.attn_out_gate = true;
  if (a.non_causal) c.non_causal = true;
  if (a.post_norms) c.post_norms = true;
  c.act = a.act;
  if (a.embd_scale_sqrt) c.embd_scale = std::sqrt(static_cast<float>(c.n_embd));
  // GGUF llama files store Q/K permuted for adjacent-pair rotation; HF
  // checkpoints and the other families rotate halves.
  c.rope.neox = !(gguf_layout && a.gguf_permuted_qk) && !c.rope_pairs_adjacent;
  if (c.rope_llama3.factor > 0) c.rope_freq_factors = llama3_rope_factors(c.rope_llama3, c.rope.freq_base, c.rope.n_rot);
  c.rope_swa = c.rope;
  // Local layers with a smaller head than the global ones (Gemma 4) turn all of theirs.
  if (c.head_dim_global > 0) c.rope_swa.n_rot = c.head_dim;
  if (a.swa_rope_base > 0) {
    c.rope_swa.freq_base = c.rope_swa_base > 0 ? c.rope_swa_base : a.swa_rope_base;
    c.rope_swa.freq_scale = 1.0f;
  }
  c.validate();
}

std::vector<float> llama3_rope_factors(const ModelConfig::Llama3Rope& p, float freq_base, int n_rot) {
  const double low_wavelen = p.original_context / static_cast<double>(p.low_freq_factor);
  const double high_wavelen = p.original_context / static_cast<double>(p.high_freq_factor);
  std::vector<float> f(static_cast<size_t>(n_rot / 2));
  for (int i = 0; i < n_rot / 2; ++i) {
    const double inv_freq = std::pow(static_cast<double>(freq_base), -2.0 * i / n_rot);
    const double wavelen = 2 * std::numbers::pi / inv_freq;
    double divisor = 1;
    if (wavelen > low_wavelen) {
      divisor = p.factor;
    } else if (wavelen >= high_wavelen) {
      const double smooth = (p.original_context / wavelen - p.low_freq_factor) / (p.high_freq_factor - p.low_freq_factor);
      divisor = 1 / ((1 - smooth) / p.factor + smooth);
    }
    f[i] = static_cast<float>(divisor);
  }
  return f;
}

namespace {

const ArchInfo& arch_from_gguf_name(const std::string& a, const std::string& path) {
  if (const ArchInfo* info = arch_by_gguf_name(a)) return *info;
  const bool moe = a.ends_with("moe") || a == "mixtral" || a == "deepseek2" || a == "dbrx";
  fail("'{}': unsupported architecture '{}'{} (supported: {})", path, a,
       moe ? " (Mixture-of-Experts models are not supported yet)" : "", supported_gguf_names());
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

// The value a size takes when its key is absent and it is derived.
std::optional<int64_t> derived_size(Derived d, const ModelConfig& c) {
  switch (d) {
    case Derived::None: return std::nullopt;
    case Derived::HeadCount: return c.n_head;
    case Derived::EmbdOverHeads: return c.n_embd / c.n_head;
  }
  return std::nullopt;
}

}  // namespace

int ModelConfig::n_linear_layers() const {
  return static_cast<int>(std::count(is_linear.begin(), is_linear.end(), true));
}

int ModelConfig::cache_layers_before(int il) const {
  int n = 0;
  for (int l = 0; l < il; ++l) n += layer_reuses_kv(l) ? 0 : 1;
  return n;
}

ModelConfig ModelConfig::layer_view(int il) const {
  ModelConfig v = *this;
  if (layers_alike()) return v;
  v.head_dim = layer_head_dim(il);
  v.n_head_kv = layer_n_head_kv(il);
  v.n_ff = layer_ff(il);
  return v;
}

int ModelConfig::max_head_dim() const { return std::max(head_dim, head_dim_global); }

int64_t ModelConfig::max_kv_row() const {
  int64_t row = 0;
  for (int il = 0; il < n_layer; ++il) row = std::max(row, int64_t{layer_n_head_kv(il)} * layer_head_dim(il));
  return std::max(row, int64_t{n_head_kv} * head_dim);
}

int ModelConfig::max_ff() const {
  int ff = n_ff;
  for (int32_t f : layer_n_ff) ff = std::max(ff, f);
  return ff;
}

std::string ModelConfig::describe() const {
  std::string ffn = fmt::format("ffn {}", n_ff);
  if (n_linear_layers() > 0)
    ffn += fmt::format(", {} of {} layers Gated DeltaNet ({}/{} heads x {}/{}, conv {})", n_linear_layers(), n_layer,
                       linear.n_k_heads, linear.n_v_heads, linear.head_k_dim, linear.head_v_dim, linear.conv_kernel);
  if (moe())
    ffn = fmt::format("{} of {} experts x ffn {}{}{}", n_expert_used, n_expert, n_ff_exp,
                      n_ff_shexp ? fmt::format(" + shared {}", n_ff_shexp) : "",
                      n_dense_lead ? fmt::format(", {} dense layers first (ffn {})", n_dense_lead, n_ff) : "");
  if (is_mla())
    ffn = fmt::format("MLA (q_lora {}, kv_lora {}, nope {} + rope {}, v {}), {}", mla.q_lora_rank, mla.kv_lora_rank,
                      mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim, ffn);
  if (n_embd_per_layer > 0) ffn += fmt::format(", per-layer embeddings {}", n_embd_per_layer);
  if (head_dim_global > 0 || n_head_kv_global > 0)
    ffn += fmt::format(", global layers {}/{} x {}{}", n_head, layer_n_head_kv(n_layer - 1), max_head_dim(),
                       global_v_is_k ? " (values from keys)" : "");
  if (!layer_n_ff.empty()) ffn += fmt::format(", ffn up to {}", max_ff());
  if (const auto shared = std::count_if(kv_source.begin(), kv_source.end(), [](int32_t s) { return s >= 0; }))
    ffn += fmt::format(", {} layers reusing earlier layers' K/V", shared);
  return fmt::format("{} '{}': {} layers, hidden {}, heads {}/{} x {}, {}, vocab {}, ctx {}", arch_name(arch), name,
                     n_layer, n_embd, n_head, n_head_kv, head_dim, ffn, n_vocab, n_ctx_train);
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
  PAGELLM_CHECK(n_expert >= 0 && n_expert <= L::kExperts,
                "model hyperparameter n_expert = {} is out of range (0 to {})", n_expert, L::kExperts);
  if (n_expert > 0) {
    PAGELLM_CHECK(n_expert_used >= 1 && n_expert_used <= n_expert,
                  "model hyperparameter n_expert_used = {} is out of range (1 to n_expert = {})", n_expert_used,
                  n_expert);
    PAGELLM_CHECK(n_ff_exp >= 1 && n_ff_exp <= L::kFeedForward,
                  "model hyperparameter n_ff_exp = {} is out of range (1 to {})", n_ff_exp, L::kFeedForward);
  }
  PAGELLM_CHECK(n_ff_shexp >= 0 && n_ff_shexp <= L::kFeedForward,
                "model hyperparameter n_ff_shexp = {} is out of range (0 to {})", n_ff_shexp, L::kFeedForward);
}

void ModelConfig::validate() const {
  check_sizes();
  PAGELLM_CHECK(n_head % n_head_kv == 0, "head count {} is not a multiple of the KV head count {}", n_head, n_head_kv);
  PAGELLM_CHECK(rope.n_rot > 0 && rope.n_rot <= max_head_dim() && rope.n_rot % 2 == 0, "invalid RoPE dimension {}",
                rope.n_rot);
  {
    using L = ModelSizeLimits;
    PAGELLM_CHECK(head_dim_global >= 0 && head_dim_global <= L::kHeadDim && n_head_kv_global >= 0 &&
                      n_head_kv_global <= L::kHeads && (n_head_kv_global == 0 || n_head % n_head_kv_global == 0),
                  "invalid global layers' shape: {} KV heads (dividing the {} heads) of {}", n_head_kv_global, n_head,
                  head_dim_global);
    PAGELLM_CHECK(layer_n_ff.empty() || static_cast<int>(layer_n_ff.size()) == n_layer,
                  "per-layer FFN sizes ({}) do not match the layer count {}", layer_n_ff.size(), n_layer);
    for (int32_t f : layer_n_ff)
      PAGELLM_CHECK(f >= 1 && f <= L::kFeedForward, "per-layer FFN size {} is out of range (1 to {})", f,
                    L::kFeedForward);
  }
  PAGELLM_CHECK(static_cast<int>(is_swa.size()) == n_layer, "sliding-window layer flags do not match layer count");
  PAGELLM_CHECK(rope.freq_base > 0 && std::isfinite(rope.freq_base), "invalid RoPE base {}", rope.freq_base);
  PAGELLM_CHECK(norm_eps > 0 && std::isfinite(norm_eps), "invalid norm epsilon {}", norm_eps);
  PAGELLM_CHECK(rope.freq_scale > 0 && std::isfinite(rope.freq_scale), "invalid RoPE scale {}", rope.freq_scale);
  PAGELLM_CHECK(attn_scale > 0 && std::isfinite(attn_scale), "invalid attention scale {}", attn_scale);
  for (const auto* f : {&rope_freq_factors, &rope_factors_short, &rope_factors_long})
    PAGELLM_CHECK(f->empty() || static_cast<int>(f->size()) == rope.n_rot / 2,
                  "RoPE frequency factors ({}) do not match the rotary dimension {} (one per pair)", f->size(),
                  rope.n_rot);
  PAGELLM_CHECK(rope_factors_short.size() == rope_factors_long.size(),
                "LongRoPE needs as many short factors ({}) as long ones ({})", rope_factors_short.size(),
                rope_factors_long.size());
  PAGELLM_CHECK(rope.ext_factor >= 0 && std::isfinite(rope.ext_factor) && rope.attn_factor > 0 &&
                    std::isfinite(rope.attn_factor) && std::isfinite(rope.beta_fast) && std::isfinite(rope.beta_slow) &&
                    rope.beta_fast > 0 && rope.beta_slow > 0,
                "invalid YaRN parameters (ext_factor {}, attn_factor {}, beta_fast {}, beta_slow {})", rope.ext_factor,
                rope.attn_factor, rope.beta_fast, rope.beta_slow);
  PAGELLM_CHECK(attn_softcap >= 0 && std::isfinite(attn_softcap) && final_softcap >= 0 && std::isfinite(final_softcap),
                "invalid logit softcapping ({}, {})", attn_softcap, final_softcap);
  if (is_mla()) {
    using L = ModelSizeLimits;
    const Mla& m = mla;
    PAGELLM_CHECK(m.q_lora_rank >= 0 && m.q_lora_rank <= L::kEmbd && m.kv_lora_rank >= 1 &&
                      m.kv_lora_rank <= L::kHeadDim && m.qk_nope_head_dim >= 1 && m.qk_nope_head_dim <= L::kHeadDim &&
                      m.qk_rope_head_dim >= 2 && m.qk_rope_head_dim % 2 == 0 &&
                      m.qk_rope_head_dim <= L::kHeadDim && m.v_head_dim >= 1 && m.v_head_dim <= L::kHeadDim,
                  "invalid MLA sizes: q_lora_rank {}, kv_lora_rank {}, qk_nope_head_dim {}, qk_rope_head_dim {} (even), "
                  "v_head_dim {}", m.q_lora_rank, m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim);
    PAGELLM_CHECK(n_head_kv == 1 && head_dim == m.latent_dim() && rope.n_rot == m.qk_rope_head_dim,
                  "an MLA cache is one KV head of qk_rope_head_dim + kv_lora_rank ({}) values, {} rotating; got {} x {}, "
                  "{} rotating", m.latent_dim(), m.qk_rope_head_dim, n_head_kv, head_dim, rope.n_rot);
  }
  if (moe()) {
    PAGELLM_CHECK(n_dense_lead >= 0 && n_dense_lead <= n_layer, "invalid count of leading dense layers {}",
                  n_dense_lead);
    PAGELLM_CHECK(expert_groups >= 1 && n_expert % expert_groups == 0 && expert_groups_used >= 1 &&
                      expert_groups_used <= expert_groups &&
                      n_expert_used <= expert_groups_used * (n_expert / expert_groups),
                  "invalid expert groups: {} experts in {} groups, {} of them holding the {} chosen", n_expert,
                  expert_groups, expert_groups_used, n_expert_used);
    PAGELLM_CHECK(expert_weights_scale > 0 && std::isfinite(expert_weights_scale), "invalid routed scaling factor {}",
                  expert_weights_scale);
  }
  PAGELLM_CHECK(kv_source.empty() || static_cast<int>(kv_source.size()) == n_layer,
                "KV source layers ({}) do not match the layer count {}", kv_source.size(), n_layer);
  for (int il = 0; il < static_cast<int>(kv_source.size()); ++il) {
    const int src = kv_source[static_cast<size_t>(il)];
    if (src < 0) continue;
    PAGELLM_CHECK(src < il && !layer_reuses_kv(src) && is_swa[static_cast<size_t>(src)] == is_swa[static_cast<size_t>(il)] &&
                      layer_head_dim(src) == layer_head_dim(il) && layer_n_head_kv(src) == layer_n_head_kv(il),
                  "layer {} reuses the K/V of layer {}, which is not an earlier layer of its kind that keeps its own",
                  il, src);
  }
  PAGELLM_CHECK(n_embd_per_layer >= 0 && n_embd_per_layer <= ModelSizeLimits::kEmbd,
                "invalid per-layer embedding size {}", n_embd_per_layer);
  PAGELLM_CHECK(is_linear.empty() || static_cast<int>(is_linear.size()) == n_layer,
                "linear-attention layer flags ({}) do not match the layer count {}", is_linear.size(), n_layer);
  if (n_linear_layers() > 0) {
    using L = ModelSizeLimits;
    const LinearAttn& la = linear;
    PAGELLM_CHECK(la.n_k_heads >= 1 && la.n_k_heads <= L::kHeads && la.n_v_heads >= 1 && la.n_v_heads <= L::kHeads &&
                      la.n_v_heads % la.n_k_heads == 0 && la.head_k_dim >= 1 && la.head_k_dim <= L::kHeadDim &&
                      la.head_v_dim >= 1 && la.head_v_dim <= L::kHeadDim && la.conv_kernel >= 2 &&
                      la.conv_kernel <= 64,
                  "invalid linear-attention sizes: {} key heads, {} value heads (a multiple of them), head dims {}/{}, "
                  "conv kernel {}", la.n_k_heads, la.n_v_heads, la.head_k_dim, la.head_v_dim, la.conv_kernel);
    PAGELLM_CHECK(n_linear_layers() < n_layer, "every layer is linear attention; at least one full-attention layer "
                  "is needed");
  }
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

ModelConfig config_from_gguf(const GGUFFile& f) {
  const std::string a = f.get_string("general.architecture");
  const ArchInfo& info = arch_from_gguf_name(a, f.path());
  ModelConfig c;
  c.arch = info.arch;
  c.name = f.get_string("general.name", a);
  auto key = [&](const std::string& k) { return a + "." + k; };
  // Experts in a family without MoE layers would be ignored: refuse first.
  if (!info.moe && f.get_int(key("expert_count"), 0) > 0)
    fail("'{}': architecture '{}' with {} = {}: Mixture-of-Experts layers are not supported for it", f.path(), a,
         key("expert_count"), f.get_int(key("expert_count"), 0));
  // Every size is range-checked as it is read, and the layer count against
  // the tensors, before anything is sized from them.
  using L = ModelSizeLimits;
  for (const SizeParam& p : size_params()) {
    if (p.field == &ModelConfig::n_vocab) {
      int64_t embd_rows = 0;
      if (const auto* t = f.find_tensor("token_embd.weight")) embd_rows = t->rows();
      if (embd_rows > L::kVocab)
        fail("'{}': token_embd.weight has {} rows, more than the vocabulary limit of {}", f.path(), embd_rows,
             L::kVocab);
      if (embd_rows == 0 && !f.has(key(p.gguf)))
        fail("'{}': neither a token_embd.weight tensor nor {} gives the vocabulary size", f.path(), key(p.gguf));
      c.n_vocab = gguf_size(f, key(p.gguf), embd_rows, 1, p.max);
      continue;
    }
    std::optional<int64_t> fallback = derived_size(p.derived, c);
    if (p.gguf_default) fallback = *p.gguf_default;
    // Families without dense FFN layers (Qwen3.5-MoE) may state only the expert size.
    if (p.field == &ModelConfig::n_ff && info.moe_only && f.has(key("expert_feed_forward_length")))
      fallback = f.get_int(key("expert_feed_forward_length"));
    const GGUFValue* per_layer = info.gguf_layer_sizes ? f.find(key(p.gguf)) : nullptr;
    if (per_layer && per_layer->type == GGUFType::ARRAY) {
      const std::vector<int64_t> v = f.get_int_array(key(p.gguf));
      PAGELLM_CHECK(!v.empty() && v[0] >= 1 && v[0] <= p.max, "'{}': {} starts with {} (1 to {})", f.path(),
                    key(p.gguf), v.empty() ? 0 : v[0], p.max);
      c.*p.field = static_cast<int>(v[0]);
      continue;
    }
    c.*p.field = gguf_size(f, key(p.gguf), fallback, 1, p.max);
    if (p.field == &ModelConfig::n_layer) {
      // Multi-token-prediction blocks (GLM-4.5's nextn_predict_layers) are
      // counted in block_count after the model's layers; the file may hold
      // their tensors or not. Generation does not run them.
      const int nextn = gguf_size(f, key("nextn_predict_layers"), 0, 0, c.n_layer - 1);
      // A file without any layer tensors is left to the loader, which names
      // the first missing tensor.
      const int64_t tensor_layers = layers_in_tensors(f);
      if (tensor_layers > 0 && c.n_layer != tensor_layers && c.n_layer - nextn != tensor_layers)
        fail("'{}': {} = {} does not match the tensors, which hold {} layers", f.path(), key(p.gguf), c.n_layer,
             tensor_layers);
      c.n_layer -= nextn;
    }
  }
  // Experts: Mixtral-style files keep arch llama and add expert_count; the
  // expert FFN size is feed_forward_length there, its own key in Qwen-MoE files.
  c.n_expert = gguf_size(f, key("expert_count"), 0, 0, L::kExperts);
  if (c.n_expert > 0) {
    PAGELLM_CHECK(info.moe, "'{}': architecture '{}' with {} = {}: Mixture-of-Experts layers are not supported for it",
                  f.path(), a, key("expert_count"), c.n_expert);
    c.n_expert_used = gguf_size(f, key("expert_used_count"), std::nullopt, 1, c.n_expert);
    c.n_ff_exp = gguf_size(f, key("expert_feed_forward_length"), c.n_ff, 1, L::kFeedForward);
    c.n_ff_shexp = gguf_size(f, key("expert_shared_feed_forward_length"), 0, 0, L::kFeedForward);
    c.expert_norm_topk = f.get_bool(key("expert_weights_norm"), info.moe_norm_topk);
  } else {
    PAGELLM_CHECK(!info.moe_only, "'{}': architecture '{}' needs {} (its layers are Mixture-of-Experts)", f.path(), a,
                  key("expert_count"));
  }
  c.norm_eps = static_cast<float>(f.get_float(key("attention.layer_norm_rms_epsilon"), 1e-5));
  const int head_dim_v = gguf_size(f, key("attention.value_length"), c.head_dim, 1, L::kHeadDim);
  PAGELLM_CHECK(head_dim_v == c.head_dim || info.gguf_mla, "'{}': different key and value head sizes are not "
                "supported", f.path());
  c.rope.n_rot = gguf_size(f, key("rope.dimension_count"), c.head_dim, 1, L::kHeadDim);
  c.rope.freq_base = static_cast<float>(f.get_float(key("rope.freq_base"), 10000.0));
  // Families with their own base on sliding-window layers (Gemma 3); 0: the family's default.
  c.rope_swa_base = static_cast<float>(f.get_float(key("rope.freq_base_swa"), 0.0));
  const std::string scaling = f.get_string(key("rope.scaling.type"), "none");
  const double factor = f.get_float(key("rope.scaling.factor"), 1.0);
  // YaRN and LongRoPE: the context the model was trained at before extension.
  const int n_ctx_orig = gguf_size(f, key("rope.scaling.original_context_length"), c.n_ctx_train, 1, L::kContext);
  c.rope.attn_factor = static_cast<float>(f.get_float(key("rope.scaling.attn_factor"), 1.0));
  PAGELLM_CHECK(c.rope.attn_factor > 0 && std::isfinite(c.rope.attn_factor), "'{}': invalid {} {}", f.path(),
                key("rope.scaling.attn_factor"), c.rope.attn_factor);
  if (scaling == "linear") {
    if (factor > 0) c.rope.freq_scale = static_cast<float>(1.0 / factor);
  } else if (scaling == "yarn") {
    // As llama.cpp reads these files: every pair blends by the ramp
    // (ext_factor 1), cos / sin scaled by 1 + 0.1 ln(factor), times attn_factor.
    PAGELLM_CHECK(factor >= 1 && std::isfinite(factor), "'{}': invalid YaRN factor {}", f.path(), factor);
    PAGELLM_CHECK(info.gguf_mla || f.get_float(key("rope.scaling.yarn_log_multiplier"), 0.0) == 0.0,
                  "'{}': YaRN with {} (DeepSeek's mscale) is not supported", f.path(),
                  key("rope.scaling.yarn_log_multiplier"));
    c.rope.freq_scale = static_cast<float>(1.0 / factor);
    c.rope.ext_factor = static_cast<float>(f.get_float(key("rope.scaling.yarn_ext_factor"), 1.0));
    c.rope.beta_fast = static_cast<float>(f.get_float(key("rope.scaling.yarn_beta_fast"), 32.0));
    c.rope.beta_slow = static_cast<float>(f.get_float(key("rope.scaling.yarn_beta_slow"), 1.0));
    c.rope.n_ctx_orig = n_ctx_orig;
  } else if (scaling != "none" && scaling != "longrope" && !scaling.empty()) {
    fail("'{}': RoPE scaling type '{}' is not supported (linear, yarn and longrope are)", f.path(), scaling);
  }
  // LongRoPE files (Phi-3 128k) carry the two factor sets as tensors.
  const bool has_short = f.find_tensor("rope_factors_short.weight"), has_long = f.find_tensor("rope_factors_long.weight");
  PAGELLM_CHECK(has_short == has_long, "'{}': LongRoPE needs both rope_factors_short.weight and "
                "rope_factors_long.weight; the file has only one", f.path());
  if (has_long) c.rope.n_ctx_orig = n_ctx_orig;
  if (info.gguf_sliding_window > 0 || info.swa_every_layer)
    c.sliding_window = gguf_size(f, key("attention.sliding_window"), info.gguf_sliding_window, 0, L::kContext);
  if (info.softcaps) {
    c.attn_softcap = static_cast<float>(f.get_float(key("attn_logit_softcapping"), 0.0));
    c.final_softcap = static_cast<float>(f.get_float(key("final_logit_softcapping"), 0.0));
  }
  if (info.read_gguf) info.read_gguf(f, c);
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


std::vector<float> hf_factor_list(const json& p, const char* key, const std::string& path) {
  PAGELLM_CHECK(p.contains(key) && p[key].is_array(), "'{}': LongRoPE needs {} (a list of numbers)", path, key);
  std::vector<float> v;
  for (const json& x : p[key]) {
    PAGELLM_CHECK(x.is_number() && x.get<double>() > 0 && std::isfinite(x.get<double>()),
                  "'{}': {} holds {}, not a positive number", path, key, x.dump());
    v.push_back(x.get<float>());
  }
  return v;
}

// One RoPE parameter set: legacy keys (rope_theta, rope_scaling) or a
// transformers-5 rope_parameters entry ({"rope_type", "rope_theta", "factor"}).
// Plain, linear, Llama 3, YaRN and LongRoPE scaling are supported; the last
// three only where `c` may receive them (global layers), with transformers'
// defaults: original_max_position_embeddings from the config's top level
// (Phi-3 keeps it there), the entry, then max_position_embeddings; an absent
// factor is max_position_embeddings over it.
void apply_rope_params(const json& p, const json& top, RopeConfig& r, ModelConfig* c, const std::string& path) {
  if (!p.is_object()) return;
  if (is_number(p, "rope_theta")) r.freq_base = p["rope_theta"].get<float>();
  const std::string type = p.value("rope_type", p.value("type", std::string("default")));
  const bool extended = type == "llama3" || type == "yarn" || type == "longrope" || type == "su";
  if (extended && !c)
    fail("'{}': RoPE type '{}' is not supported on sliding-window layers", path, type);
  int orig = 0;
  double factor = 1;
  if (extended) {
    using L = ModelSizeLimits;
    orig = is_number(top, "original_max_position_embeddings")
               ? hf_int(top, "original_max_position_embeddings", 1, L::kContext, path)
               : is_number(p, "original_max_position_embeddings")
                     ? hf_int(p, "original_max_position_embeddings", 1, L::kContext, path)
                     : c->n_ctx_train;
    factor = hf_float(p, "factor", static_cast<double>(c->n_ctx_train) / orig);
    PAGELLM_CHECK(std::isfinite(factor) && factor > 0, "'{}': invalid {} RoPE factor {}", path, type, factor);
  }
  if (type == "linear") {
    const float f = p.at("factor").get<float>();
    PAGELLM_CHECK(f > 0, "'{}': invalid linear RoPE scaling factor {}", path, f);
    r.freq_scale = 1.0f / f;
  } else if (type == "llama3") {
    ModelConfig::Llama3Rope l;
    l.factor = static_cast<float>(factor);
    l.low_freq_factor = p.at("low_freq_factor").get<float>();
    l.high_freq_factor = p.at("high_freq_factor").get<float>();
    l.original_context = orig;
    PAGELLM_CHECK(l.factor >= 1 && std::isfinite(l.factor) && l.low_freq_factor > 0 &&
                      l.high_freq_factor > l.low_freq_factor && std::isfinite(l.high_freq_factor),
                  "'{}': invalid llama3 RoPE scaling (factor {}, low_freq_factor {}, high_freq_factor {})", path,
                  l.factor, l.low_freq_factor, l.high_freq_factor);
    c->rope_llama3 = l;
  } else if (type == "yarn") {
    // transformers' _compute_yarn_parameters: its attention factor is
    // get_mscale(factor) unless stated (or derived from mscale / mscale_all_dim);
    // the backend multiplies attn_factor by 1 + 0.1 ln(factor), so that part is divided out.
    PAGELLM_CHECK(factor >= 1, "'{}': YaRN factor {} is below 1", path, factor);
    auto mscale = [&](double m) { return factor <= 1 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; };
    const double m = hf_float(p, "mscale", 0), m_all = hf_float(p, "mscale_all_dim", 0);
    const double attention = hf_float(p, "attention_factor", m && m_all ? mscale(m) / mscale(m_all) : mscale(1));
    PAGELLM_CHECK(attention > 0 && std::isfinite(attention), "'{}': invalid YaRN attention_factor {}", path, attention);
    r.freq_scale = static_cast<float>(1.0 / factor);
    r.ext_factor = 1.0f;
    r.attn_factor = static_cast<float>(attention / mscale(1));
    r.beta_fast = static_cast<float>(hf_float(p, "beta_fast", 32));
    r.beta_slow = static_cast<float>(hf_float(p, "beta_slow", 1));
    r.n_ctx_orig = orig;
    if (p.contains("truncate") && p["truncate"].is_boolean()) r.yarn_truncate = p["truncate"].get<bool>();
  } else if (type == "longrope" || type == "su") {
    // transformers' _compute_longrope_parameters; the factor lists are
    // checked against the rotary dimension once it is known (validate).
    c->rope_factors_short = hf_factor_list(p, "short_factor", path);
    c->rope_factors_long = hf_factor_list(p, "long_factor", path);
    const double attention = hf_float(
        p, "attention_factor", factor <= 1 ? 1.0 : std::sqrt(1 + std::log(factor) / std::log(static_cast<double>(orig))));
    PAGELLM_CHECK(attention > 0 && std::isfinite(attention), "'{}': invalid LongRoPE attention_factor {}", path,
                  attention);
    r.attn_factor = static_cast<float>(attention);
    r.n_ctx_orig = orig;
  } else if (type == "proportional") {
    // transformers' _compute_proportional_rope_parameters (Gemma 4's global
    // layers): the first partial_rotary_factor * head_dim / 2 pairs turn at
    // base^(-2i / head_dim), the others not at all; the whole head is the
    // rotary dimension and the still pairs get a divisor of 1e30, as
    // llama.cpp's converter writes them (they turn by < 1e-25 radians).
    PAGELLM_CHECK(c, "'{}': RoPE type '{}' is not supported on sliding-window layers", path, type);
    const double f = hf_float(p, "partial_rotary_factor", 1.0), scale = hf_float(p, "factor", 1.0);
    PAGELLM_CHECK(f > 0 && f <= 1 && scale > 0 && std::isfinite(scale),
                  "'{}': invalid proportional RoPE (partial_rotary_factor {}, factor {})", path, f, scale);
    const int pairs = c->head_dim / 2, turning = static_cast<int>(f * c->head_dim / 2);
    c->rope_freq_factors.assign(static_cast<size_t>(pairs), kStillRopePair);
    std::fill_n(c->rope_freq_factors.begin(), turning, 1.0f);
    r.freq_scale = static_cast<float>(1.0 / scale);
    r.n_rot = c->head_dim;
  } else if (type != "default") {
    fail("'{}': RoPE type '{}' is not supported (default, linear, llama3, yarn, longrope and proportional are)", path,
         type);
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

double hf_float(const nlohmann::json& j, const char* key, double fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  PAGELLM_CHECK(j[key].is_number(), "missing or invalid field: {} must be a number, not {}", key, j[key].type_name());
  return j[key].get<double>();
}

// Field defaults follow transformers' config classes for each family
// (ArchInfo::hf), so a config.json that omits a field means what it means to
// transformers.
// The expert sizes and routing of a MoE config.json (Mixtral: the expert
// FFN is intermediate_size; Qwen-MoE: moe_intermediate_size, a shared expert,
// norm_topk_prob, and possibly dense layers, which are refused).
void read_hf_moe(const json& j, const ArchInfo& info, ModelConfig& c, const std::string& path) {
  using L = ModelSizeLimits;
  // Gemma 4 names it top_k_experts.
  c.n_expert_used = hf_int(j, is_number(j, "top_k_experts") ? "top_k_experts" : "num_experts_per_tok", 1, c.n_expert,
                           path);
  c.n_ff_exp = is_number(j, "moe_intermediate_size") ? hf_int(j, "moe_intermediate_size", 1, L::kFeedForward, path)
                                                     : c.n_ff;
  if (is_number(j, "shared_expert_intermediate_size"))
    c.n_ff_shexp = hf_int(j, "shared_expert_intermediate_size", 0, L::kFeedForward, path);
  c.expert_norm_topk = j.contains("norm_topk_prob") && j["norm_topk_prob"].is_boolean()
                           ? j["norm_topk_prob"].get<bool>()
                           : info.moe_norm_topk;
  if (is_number(j, "decoder_sparse_step"))
    PAGELLM_CHECK(j["decoder_sparse_step"].get<double>() == 1, "'{}': decoder_sparse_step {} (dense layers between "
                  "MoE layers) is not supported", path, j["decoder_sparse_step"].dump());
  if (j.contains("mlp_only_layers") && j["mlp_only_layers"].is_array())
    PAGELLM_CHECK(j["mlp_only_layers"].empty(), "'{}': mlp_only_layers (dense layers in a MoE model) is not supported",
                  path);
}

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
  HfSwa swa_rule = HfSwa::None;
  const ArchInfo* found = arch_by_hf_class(a, &swa_rule);
  if (!found) {
    const bool moe = a.find("Moe") != std::string::npos || a.starts_with("Mixtral") || a.starts_with("Deepseek");
    fail("'{}': unsupported architecture '{}'{} (supported: {})", path, a,
         moe ? " (Mixture-of-Experts models are not supported yet)" : "", supported_hf_classes());
  }
  const ArchInfo& info = *found;
  const HfDefaults& d = info.hf;
  // Quantized checkpoints (GPTQ / AWQ / FP8 / ...) hold packed tensors under
  // other names: refuse them by name.
  if (j.contains("quantization_config") && j["quantization_config"].is_object()) {
    const json& q = j["quantization_config"];
    const std::string method = q.contains("quant_method") && q["quant_method"].is_string()
                                   ? q["quant_method"].get<std::string>()
                                   : std::string("unknown");
    // gpt-oss's own MXFP4 experts are read (the safetensors source repacks them).
    if (!(method == "mxfp4" && info.hf_mxfp4_experts))
      fail("'{}': quantized Hugging Face checkpoints (quant_method '{}') are not supported; use an unquantized "
           "folder or a GGUF file of the model", path, method);
  }
  using L = ModelSizeLimits;
  ModelConfig c;
  c.arch = info.arch;
  try {
    for (const char* experts : {"num_local_experts", "num_experts", "n_routed_experts"})
      if (is_number(j, experts) && j[experts].get<double>() > 0) {
        PAGELLM_CHECK(info.moe, "'{}': architecture '{}' with {} = {}: Mixture-of-Experts layers are not supported for it",
                      path, a, experts, j[experts].dump());
        c.n_expert = hf_int(j, experts, 1, L::kExperts, path);
      }
    const std::filesystem::path folder = std::filesystem::path(path).parent_path();
    c.name = j.value("_name_or_path", folder.filename().string());
    if (c.name.empty()) c.name = arch_name(c.arch);
    // Sizes are range-checked as they are read: is_swa and the weights are
    // sized from them. An absent (or null) field takes the family's default,
    // then the derived value; without either it is an error.
    for (const SizeParam& p : size_params()) {
      const bool absent = !j.contains(p.hf) || j[p.hf].is_null();
      const std::optional<int> def = d.*p.hf_default;
      if (absent && def) c.*p.field = *def;
      else if (absent && p.derived != Derived::None) c.*p.field = static_cast<int>(*derived_size(p.derived, c));
      else c.*p.field = hf_int(j, p.hf, 1, p.max, path);
    }
    if (c.n_expert > 0) read_hf_moe(j, info, c, path);  // after n_ff: Mixtral's experts are intermediate_size
    else PAGELLM_CHECK(!info.moe_only, "'{}': {} needs num_experts (its layers are Mixture-of-Experts)", path, a);
    c.norm_eps = is_number(j, "rms_norm_eps") ? j["rms_norm_eps"].get<float>() : d.rms_norm_eps;
    c.tie_word_embeddings = j.contains("tie_word_embeddings") && j["tie_word_embeddings"].is_boolean()
                                ? j["tie_word_embeddings"].get<bool>()
                                : d.tie_word_embeddings;

    // Activation and biases: what the forward pass computes is fixed per
    // family; refuse configs that ask for something else.
    const std::string act = j.value("hidden_activation", j.value("hidden_act", std::string(d.hidden_act)));
    // gpt-oss's experts apply their own clamped SwiGLU whatever hidden_act says (its file checks the constants).
    const bool act_ok = info.act == Activation::GeluTanh  ? act == "gelu_pytorch_tanh" || act == "gelu_tanh"
                        : info.act == Activation::GeluErf ? act == "gelu"
                                                          : act == "silu";
    PAGELLM_CHECK(act_ok, "'{}': activation '{}' is not supported for {}", path, act, a);
    PAGELLM_CHECK(!j.value("attention_bias", false) || info.qkv_bias,
                  "'{}': attention_bias (biases on q/k/v/o projections) is not supported for {}", path, a);
    PAGELLM_CHECK(!j.value("mlp_bias", false), "'{}': mlp_bias is not supported", path);

    // RoPE: legacy keys first, then transformers-5 rope_parameters (which win,
    // as in transformers). Families with local layers keep one set per layer type.
    const bool local_rope = info.swa_rope_base > 0;
    c.rope.freq_base = is_number(j, "rope_theta") ? j["rope_theta"].get<float>() : d.rope_theta;
    if (j.contains("rope_scaling")) apply_rope_params(j["rope_scaling"], j, c.rope, &c, path);
    const bool stated = (j.contains("rope_scaling") && j["rope_scaling"].is_object()) ||
                        (j.contains("rope_parameters") && j["rope_parameters"].is_object());
    if (!stated && d.rope_parameters) apply_rope_params(json::parse(d.rope_parameters), j, c.rope, &c, path);
    RopeConfig local;
    local.freq_base = is_number(j, "rope_local_base_freq") ? j["rope_local_base_freq"].get<float>() : info.swa_rope_base;
    if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {
      const json& rp = j["rope_parameters"];
      if (local_rope && (rp.contains("full_attention") || rp.contains("sliding_attention"))) {
        if (rp.contains("full_attention")) apply_rope_params(rp["full_attention"], j, c.rope, &c, path);
        if (rp.contains("sliding_attention")) apply_rope_params(rp["sliding_attention"], j, local, nullptr, path);
      } else {
        apply_rope_params(rp, j, c.rope, &c, path);
      }
    }
    if (is_number(j, "partial_rotary_factor")) {
      const float f = j["partial_rotary_factor"].get<float>();
      PAGELLM_CHECK(f == 1.0f || (info.partial_rotary && f > 0 && f < 1),
                    "'{}': partial_rotary_factor {} is not supported for {}", path, f, a);
      // transformers: int(head_dim * factor) leading dimensions rotate.
      c.rope.n_rot = static_cast<int>(static_cast<double>(c.head_dim) * f);
    }

    // Attention scale and logit softcapping (Gemma).
    if (d.query_pre_attn_scalar > 0)
      c.attn_scale = 1.0f / std::sqrt(is_number(j, "query_pre_attn_scalar") ? j["query_pre_attn_scalar"].get<float>()
                                                                             : d.query_pre_attn_scalar);
    if (info.softcaps) {
      // A null cap means none; an absent one the family's default.
      auto cap = [&](const char* key, float def) {
        if (!j.contains(key)) return def;
        return is_number(j, key) ? j[key].get<float>() : 0.0f;
      };
      c.final_softcap = cap("final_logit_softcapping", d.final_logit_softcapping);
      c.attn_softcap = cap("attn_logit_softcapping", d.attn_logit_softcapping);
    }

    // Sliding-window layers.
    c.is_swa.assign(c.n_layer, false);
    switch (swa_rule) {
      case HfSwa::None: break;
      case HfSwa::Pattern: {
        // Bidirectional attention (EmbeddingGemma's Gemma3TextModel) is its
        // own family: a class of causal models does not take it, and it needs it.
        const bool bidirectional = j.contains("use_bidirectional_attention") &&
                                   j["use_bidirectional_attention"].is_boolean() &&
                                   j["use_bidirectional_attention"].get<bool>();
        PAGELLM_CHECK(bidirectional || !info.non_causal,
                      "'{}': a bidirectional model's config.json without use_bidirectional_attention: true (a causal "
                      "base model of this class is not served)", path);
        PAGELLM_CHECK(!bidirectional || info.non_causal,
                      "'{}': use_bidirectional_attention is not supported for this class (Gemma3TextModel takes it)",
                      path);
        PAGELLM_CHECK(local.freq_scale == 1.0f, "'{}': scaled RoPE on sliding-window layers is not supported", path);
        c.rope_swa_base = local.freq_base;
        c.sliding_window =
            is_number(j, "sliding_window") ? hf_int(j, "sliding_window", 0, L::kContext, path) : d.sliding_window;
        if (j.contains("layer_types") && !j["layer_types"].is_null()) {
          c.is_swa = swa_from_layer_types(j["layer_types"], c.n_layer, path);
        } else {
          const int pattern = is_number(j, "sliding_window_pattern")
                                  ? hf_int(j, "sliding_window_pattern", 1, L::kLayers, path)
                                  : info.swa_pattern;
          for (int il = 0; il < c.n_layer; ++il) c.is_swa[il] = (il + 1) % pattern != 0;
        }
        break;
      }
      case HfSwa::EveryLayer:
        // Mistral: every layer uses the window when one is set (v0.1).
        c.sliding_window = is_number(j, "sliding_window") ? hf_int(j, "sliding_window", 0, L::kContext, path) : 0;
        c.is_swa.assign(c.n_layer, c.sliding_window > 0);
        break;
      case HfSwa::UseFlag:
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
        break;
    }
    PAGELLM_CHECK(c.sliding_window >= 0, "'{}': invalid sliding_window {}", path, c.sliding_window);
    if (info.read_hf) info.read_hf(j, c, path);  // the family's own fields
  } catch (const nlohmann::json::exception& e) {
    fail("'{}': missing or invalid field: {}", path, e.what());
  }
  finalize_config(c, false);
  return c;
}

}  // namespace pagellm
