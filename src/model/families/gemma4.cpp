// Gemma 4 (text): Gemma 3's sandwich-normed layer with plain RMSNorm weights
// (x * w, not 1 + w), an unscaled attention (q and k are normed per head, V
// too, without a weight), proportional RoPE on the global layers (a part of
// each head turns, at the whole head's frequencies), five local layers to
// each global one, and two things Gemma 3 has not:
//  - per-layer embeddings (PLE): a second table gives every token one small
//    vector per layer, mixed with a projection of its input embedding
//    (model.cpp computes them after the embedding); each layer gates a
//    residual branch with its own after the FFN;
//  - KV sharing: the last num_kv_shared_layers layers compute no K/V and
//    attend over the cache of the last earlier layer of their kind
//    (ModelConfig::kv_source), so they keep no cache of their own.
// Each layer's output is scaled by its layer_scalar. The multimodal class's
// text_config is read as the text model.
//
// The MoE variant (enable_moe_block) runs the dense MLP and routed experts
// side by side on the attention's output, each with its own norms; the
// router reads the residual's unweighted norm times a learned scale over
// sqrt(hidden), and scales each chosen expert by its per_expert_scale
// (folded into the expert's down projection at load: derive_tensors).
//
// The released checkpoints' global layers have their own head size and KV
// head count (global_head_dim, num_global_key_value_heads), their values may
// be their keys (attention_k_eq_v), and the shared layers' MLP may be twice
// as wide (use_double_wide_mlp): ModelConfig's per-layer shapes, cut per
// layer under tensor parallelism (ShardGeometry::for_layer).
#include <algorithm>
#include <charconv>
#include <cmath>

#include <unordered_map>

#include "core/error.h"
#include "core/quant_blocks.h"
#include "format/gguf.h"
#include "model/blocks.h"
#include "model/families/common.h"
#include "model/families/families.h"
#include "model/model_config.h"
#include "model/tensor_source.h"

namespace pagellm::family {
namespace {

Dims ple_table(const ModelConfig& c) { return {int64_t{c.n_layer} * c.n_embd_per_layer, c.n_vocab}; }
Dims ple_model_proj(const ModelConfig& c) { return {c.n_embd, int64_t{c.n_layer} * c.n_embd_per_layer}; }
Dims ple_vec(const ModelConfig& c) { return {c.n_embd_per_layer}; }
Dims ple_gate(const ModelConfig& c) { return {c.n_embd, c.n_embd_per_layer}; }
Dims ple_proj(const ModelConfig& c) { return {c.n_embd_per_layer, c.n_embd}; }
Dims one(const ModelConfig&) { return {1}; }
Dims expert_vec(const ModelConfig& c) { return {c.n_expert}; }

std::vector<TensorSpec> gemma4_globals() {
  std::vector<TensorSpec> g = globals(Transform::None);
  g.push_back(mat("per_layer_token_embd.weight", "model.embed_tokens_per_layer.weight", ple_table, Slot::PleTokEmbd,
                  Need::IfPle));
  g.push_back(mat("per_layer_model_proj.weight", "model.per_layer_model_projection.weight", ple_model_proj,
                  Slot::PleModelProj, Need::IfPle));
  g.push_back(vec("per_layer_proj_norm.weight", "model.per_layer_projection_norm.weight", ple_vec, Slot::PleProjNorm,
                  Need::IfPle));
  return g;
}

TensorSpec router() {
  TensorSpec t = mat("ffn_gate_inp.weight", "router.proj.weight", router_mat, Slot::Router, Need::IfMoe);
  t.keep_f32 = true;
  return t;
}

std::vector<TensorSpec> gemma4_layer() {
  constexpr Need R = Need::Required, Own = Need::IfOwnKv;
  return {
      vec("attn_norm.weight", "input_layernorm.weight", embd_vec, Slot::AttnNorm),
      mat("attn_q.weight", "self_attn.q_proj.weight", q_mat, Slot::Q),
      mat("attn_k.weight", "self_attn.k_proj.weight", kv_mat, Slot::K, Own),
      mat("attn_v.weight", "self_attn.v_proj.weight", kv_mat, Slot::V, Need::IfOwnV),
      mat("attn_output.weight", "self_attn.o_proj.weight", o_mat, Slot::O),
      vec("attn_q_norm.weight", "self_attn.q_norm.weight", head_vec, Slot::QNorm),
      vec("attn_k_norm.weight", "self_attn.k_norm.weight", head_vec, Slot::KNorm, Own),
      vec("post_attention_norm.weight", "post_attention_layernorm.weight", embd_vec, Slot::PostAttnNorm),
      vec("ffn_norm.weight", "pre_feedforward_layernorm.weight", embd_vec, Slot::FfnNorm),
      mat("ffn_gate.weight", "mlp.gate_proj.weight", ff_mat, Slot::Gate),
      mat("ffn_up.weight", "mlp.up_proj.weight", ff_mat, Slot::Up),
      mat("ffn_down.weight", "mlp.down_proj.weight", down_mat, Slot::Down),
      vec("post_ffw_norm.weight", "post_feedforward_layernorm.weight", embd_vec, Slot::PostFfnNorm),
      // The MoE block: the dense MLP above keeps running beside the experts.
      router(),
      vec("ffn_gate_inp.scale", "router.scale", embd_vec, Slot::RouterInScale, Need::IfMoe),
      vec("ffn_down_exps.scale", "router.per_expert_scale", expert_vec, Slot::Unused, Need::IfMoe),
      experts("ffn_gate_exps.weight", "experts.gate_up_proj", ff_exps, Slot::GateExps, Transform::GateUpFirstHalf),
      experts("ffn_up_exps.weight", "experts.gate_up_proj", ff_exps, Slot::UpExps, Transform::GateUpSecondHalf),
      experts("ffn_down_exps.weight", "experts.down_proj", down_exps, Slot::DownExps),
      vec("post_ffw_norm_1.weight", "post_feedforward_layernorm_1.weight", embd_vec, Slot::PostFfnNorm1, Need::IfMoe),
      vec("pre_ffw_norm_2.weight", "pre_feedforward_layernorm_2.weight", embd_vec, Slot::FfnNorm2, Need::IfMoe),
      vec("post_ffw_norm_2.weight", "post_feedforward_layernorm_2.weight", embd_vec, Slot::PostFfnNorm2, Need::IfMoe),
      mat("inp_gate.weight", "per_layer_input_gate.weight", ple_gate, Slot::PleGate, Need::IfPle),
      mat("proj.weight", "per_layer_projection.weight", ple_proj, Slot::PleProj, Need::IfPle),
      vec("post_norm.weight", "post_per_layer_input_norm.weight", embd_vec, Slot::PlePostNorm, Need::IfPle),
      vec("layer_output_scale.weight", "layer_scalar", one, Slot::LayerOutScale, R),
  };
}

// transformers' kv_sharing_modes: from layer n_layer - shared on, each layer
// reads the cache of the last layer of its kind before that point.
std::vector<int32_t> kv_sources(const std::vector<bool>& is_swa, int shared, const std::string& where) {
  const int n = static_cast<int>(is_swa.size()), first = n - shared;
  PAGELLM_CHECK(shared >= 0 && shared < n, "{}: num_kv_shared_layers {} must be below the layer count {}", where,
                shared, n);
  std::vector<int32_t> src(static_cast<size_t>(n), -1);
  if (shared == 0) return {};
  for (int il = first; il < n; ++il) {
    for (int l = first - 1; l >= 0 && src[il] < 0; --l)
      if (is_swa[l] == is_swa[il]) src[il] = l;
    PAGELLM_CHECK(src[il] >= 0, "{}: shared layer {} has no earlier {} layer to read its K/V from", where, il,
                  is_swa[il] ? "sliding-window" : "global");
  }
  return src;
}

bool json_true(const nlohmann::json& j, const char* key) {
  return j.contains(key) && j[key].is_boolean() && j[key].get<bool>();
}

void read_hf(const nlohmann::json& j, ModelConfig& c, const std::string& path) {
  using L = ModelSizeLimits;
  c.attn_scale = 1.0f;  // Gemma4TextAttention.scaling: q and k are normed instead
  // The global layers' shape: transformers saves it as per_layer_config
  // (overrides by layer index or type; global_head_dim is gone), a
  // checkpoint's config.json as global_head_dim (default 512) and, with
  // attention_k_eq_v, num_global_key_value_heads.
  const bool k_eq_v = json_true(j, "attention_k_eq_v");
  double global_hd = c.head_dim, global_kv = c.n_head_kv;
  if (j.contains("per_layer_config") && j["per_layer_config"].is_object()) {
    for (const auto& [key, over] : j["per_layer_config"].items()) {
      int il = -1;
      if (std::from_chars(key.data(), key.data() + key.size(), il).ec != std::errc() || il < 0 || il >= c.n_layer) il = -1;
      const bool global = il >= 0 ? !c.is_swa[static_cast<size_t>(il)] : key == "full_attention";
      if (!global || !over.is_object()) continue;
      global_hd = hf_float(over, "head_dim", global_hd);
      global_kv = hf_float(over, "num_key_value_heads", global_kv);
    }
  } else {
    global_hd = hf_float(j, "global_head_dim", 512);
    if (k_eq_v) global_kv = hf_float(j, "num_global_key_value_heads", global_kv);
  }
  using L = ModelSizeLimits;
  PAGELLM_CHECK(global_hd >= 1 && global_hd <= L::kHeadDim && global_hd == static_cast<int>(global_hd) &&
                    global_kv >= 1 && global_kv <= L::kHeads && global_kv == static_cast<int>(global_kv),
                "'{}': invalid global layers' shape: {} KV heads of {}", path, global_kv, global_hd);
  if (global_hd != c.head_dim) c.head_dim_global = static_cast<int>(global_hd);
  if (global_kv != c.n_head_kv) c.n_head_kv_global = static_cast<int>(global_kv);
  c.global_v_is_k = k_eq_v;
  // Proportional RoPE turns a share of the global layers' own head.
  if (c.head_dim_global > 0 && !c.rope_freq_factors.empty()) {
    size_t turning = 0;
    while (turning < c.rope_freq_factors.size() && c.rope_freq_factors[turning] == 1.0f) ++turning;
    const double f = 2.0 * static_cast<double>(turning) / c.head_dim;
    c.rope.n_rot = c.head_dim_global;
    c.rope_freq_factors.assign(static_cast<size_t>(c.head_dim_global / 2), kStillRopePair);
    std::fill_n(c.rope_freq_factors.begin(), static_cast<int>(f * c.head_dim_global / 2), 1.0f);
  }
  if (json_true(j, "enable_moe_block")) {
    PAGELLM_CHECK(c.moe(), "'{}': enable_moe_block needs num_experts", path);
    PAGELLM_CHECK(c.expert_norm_topk, "'{}': Gemma 4's router always renormalises the chosen experts' weights", path);
    c.moe_dense_ffn = true;
  } else {
    c.n_expert = c.n_expert_used = c.n_ff_exp = 0;  // experts without the block: transformers builds none
  }
  const std::string bidi = j.contains("use_bidirectional_attention") && j["use_bidirectional_attention"].is_string()
                               ? j["use_bidirectional_attention"].get<std::string>()
                               : "";
  PAGELLM_CHECK(bidi != "all", "'{}': use_bidirectional_attention 'all' is not supported", path);
  const double ple = hf_float(j, "hidden_size_per_layer_input", 256);
  PAGELLM_CHECK(ple >= 0 && ple <= L::kEmbd && ple == static_cast<int>(ple),
                "'{}': invalid hidden_size_per_layer_input {}", path, ple);
  c.n_embd_per_layer = static_cast<int>(ple);
  if (c.n_embd_per_layer > 0) {
    const double v = hf_float(j, "vocab_size_per_layer_input", 262144);
    PAGELLM_CHECK(v == c.n_vocab, "'{}': vocab_size_per_layer_input {} differs from vocab_size {} (not supported)",
                  path, v, c.n_vocab);
  }
  const double shared = hf_float(j, "num_kv_shared_layers", 0);
  PAGELLM_CHECK(shared >= 0 && shared <= c.n_layer && shared == static_cast<int>(shared),
                "'{}': num_kv_shared_layers {} must be a whole number below the layer count {}", path, shared,
                c.n_layer);
  c.kv_source = kv_sources(c.is_swa, static_cast<int>(shared), "'" + path + "'");
  // The shared layers' MLP is twice as wide.
  if (json_true(j, "use_double_wide_mlp") && shared > 0) {
    c.layer_n_ff.assign(static_cast<size_t>(c.n_layer), c.n_ff);
    for (int il = 0; il < c.n_layer; ++il)
      if (c.layer_reuses_kv(il)) c.layer_n_ff[static_cast<size_t>(il)] = 2 * c.n_ff;
  }
}

// llama.cpp's keys: the sliding-window layers as a list, the local layers'
// head and rotary sizes under *_swa keys (key_length is the global layers'),
// the shared layers' count, the per-layer embedding size. Proportional RoPE
// is the rope_freqs tensor (1e30 for the pairs that do not turn).
void read_gguf(const GGUFFile& f, ModelConfig& c) {
  using L = ModelSizeLimits;
  const std::string a = f.get_string("general.architecture") + ".";
  c.attn_scale = 1.0f;
  const std::string pattern = a + "attention.sliding_window_pattern";
  PAGELLM_CHECK(f.has(pattern), "'{}': {} (the sliding-window layers) is missing", f.path(), pattern);
  const std::vector<int64_t> swa = f.get_int_array(pattern);
  PAGELLM_CHECK(static_cast<int>(swa.size()) == c.n_layer, "'{}': {} has {} entries for {} layers", f.path(), pattern,
                swa.size(), c.n_layer);
  c.is_swa.assign(static_cast<size_t>(c.n_layer), false);
  for (int il = 0; il < c.n_layer; ++il) c.is_swa[static_cast<size_t>(il)] = swa[static_cast<size_t>(il)] != 0;
  // key_length is the global layers' head, *_swa the local layers'.
  const int global_hd = c.head_dim;
  const int hd = gguf_size(f, a + "attention.key_length_swa", global_hd, 1, L::kHeadDim);
  for (const auto& [k, want] : {std::pair{"attention.value_length_swa", hd}, {"attention.value_length", global_hd},
                                {"rope.dimension_count_swa", hd}}) {
    const int v = gguf_size(f, a + k, want, 1, L::kHeadDim);
    PAGELLM_CHECK(v == want, "'{}': {}{} = {} differs from {} (Gemma 4's values and local RoPE span the whole head)",
                  f.path(), a, k, v, want);
  }
  c.head_dim = hd;
  if (global_hd != hd) c.head_dim_global = global_hd;
  // Per-layer KV heads (the global layers' own count) and FFN sizes (the double-wide shared layers).
  if (const GGUFValue* v = f.find(a + "attention.head_count_kv"); v && v->type == GGUFType::ARRAY) {
    const std::vector<int64_t> kv = f.get_int_array(a + "attention.head_count_kv");
    PAGELLM_CHECK(static_cast<int>(kv.size()) == c.n_layer, "'{}': {}attention.head_count_kv has {} entries for {} "
                  "layers", f.path(), a, kv.size(), c.n_layer);
    int local = 0, global = 0;
    for (int il = 0; il < c.n_layer; ++il) {
      int& seen = c.is_swa[static_cast<size_t>(il)] ? local : global;
      const int64_t h = kv[static_cast<size_t>(il)];
      PAGELLM_CHECK(h >= 1 && h <= L::kHeads && (seen == 0 || seen == h), "'{}': {}attention.head_count_kv gives "
                    "layer {} {} KV heads; the layers of one kind must agree", f.path(), a, il, h);
      seen = static_cast<int>(h);
    }
    c.n_head_kv = local > 0 ? local : global;
    if (global > 0 && global != c.n_head_kv) c.n_head_kv_global = global;
  }
  if (const GGUFValue* v = f.find(a + "feed_forward_length"); v && v->type == GGUFType::ARRAY) {
    const std::vector<int64_t> ff = f.get_int_array(a + "feed_forward_length");
    PAGELLM_CHECK(static_cast<int>(ff.size()) == c.n_layer, "'{}': {}feed_forward_length has {} entries for {} "
                  "layers", f.path(), a, ff.size(), c.n_layer);
    c.layer_n_ff.clear();
    for (int64_t x : ff) {
      PAGELLM_CHECK(x >= 1 && x <= L::kFeedForward, "'{}': {}feed_forward_length has {} (1 to {})", f.path(), a, x,
                    L::kFeedForward);
      c.layer_n_ff.push_back(static_cast<int32_t>(x));
    }
    c.n_ff = *std::min_element(c.layer_n_ff.begin(), c.layer_n_ff.end());
    if (std::all_of(c.layer_n_ff.begin(), c.layer_n_ff.end(), [&](int32_t x) { return x == c.n_ff; }))
      c.layer_n_ff.clear();
  }
  // Values from the keys: the global layers have no attn_v (llama.cpp uses K when it is missing).
  for (int il = 0; il < c.n_layer && !c.global_v_is_k; ++il)
    if (!c.is_swa[static_cast<size_t>(il)] && f.find_tensor("blk." + std::to_string(il) + ".attn_k.weight") &&
        !f.find_tensor("blk." + std::to_string(il) + ".attn_v.weight"))
      c.global_v_is_k = true;
  c.n_embd_per_layer = gguf_size(f, a + "embedding_length_per_layer_input", 0, 0, L::kEmbd);
  const int shared = gguf_size(f, a + "attention.shared_kv_layers", 0, 0, c.n_layer);
  c.kv_source = kv_sources(c.is_swa, shared, "'" + f.path() + "'");
  if (c.moe()) c.moe_dense_ffn = true;  // the dense MLP runs beside the experts
}

// rope_freq_factors of proportional RoPE: the share of pairs that turn.
double proportional_factor(const ModelConfig& c) {
  const std::vector<float>& f = c.rope_freq_factors;
  size_t turning = 0;
  while (turning < f.size() && f[turning] == 1.0f) ++turning;
  bool still = true;
  for (size_t i = turning; i < f.size(); ++i) still = still && f[i] == kStillRopePair;
  const int global_hd = c.layer_head_dim(c.n_layer - 1);  // the last layer is global
  PAGELLM_CHECK(!f.empty() && still && c.rope.n_rot == global_hd,
                "cannot write config.json: Gemma 4's global RoPE must be proportional");
  return 2.0 * static_cast<double>(turning) / global_hd;
}

void write_hf(const ModelConfig& c, nlohmann::ordered_json& j) {
  PAGELLM_CHECK(c.attn_scale == 1.0f, "cannot write config.json: Gemma 4's attention is unscaled (scale {})",
                c.attn_scale);
  j["hidden_activation"] = "gelu_pytorch_tanh";
  j["sliding_window"] = c.sliding_window;
  j["layer_types"] = hf_layer_types(c);
  j["final_logit_softcapping"] = c.final_softcap > 0 ? nlohmann::ordered_json(decimal(c.final_softcap)) : nullptr;
  j.erase("rope_theta");
  j["rope_parameters"] = {
      {"full_attention",
       {{"rope_type", "proportional"}, {"partial_rotary_factor", proportional_factor(c)},
        {"rope_theta", decimal(c.rope.freq_base)}}},
      {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", decimal(c.rope_swa.freq_base)}}},
  };
  j["global_head_dim"] = c.max_head_dim();
  // transformers reads num_global_key_value_heads only with attention_k_eq_v.
  PAGELLM_CHECK(c.global_v_is_k || c.n_head_kv_global == 0, "cannot write config.json: Gemma 4's global layers have "
                "their own KV head count only when their values are their keys (attention_k_eq_v)");
  j["attention_k_eq_v"] = c.global_v_is_k;
  if (c.global_v_is_k) j["num_global_key_value_heads"] = c.layer_n_head_kv(c.n_layer - 1);
  j["attention_bias"] = false;
  j["enable_moe_block"] = c.moe();
  if (c.moe()) {
    PAGELLM_CHECK(c.moe_dense_ffn && c.expert_norm_topk && c.n_ff_shexp == 0 && c.n_dense_lead == 0,
                  "cannot write config.json: Gemma 4's MoE layers run the dense MLP beside renormalised experts");
    j["top_k_experts"] = c.n_expert_used;
    for (const char* key : {"num_experts_per_tok", "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers"})
      j.erase(key);
  }
  int shared = 0;
  for (int il = 0; il < c.n_layer; ++il) shared += c.layer_reuses_kv(il) ? 1 : 0;
  bool double_wide = !c.layer_n_ff.empty();
  for (int il = 0; il < c.n_layer && double_wide; ++il)
    PAGELLM_CHECK(c.layer_ff(il) == (c.layer_reuses_kv(il) ? 2 : 1) * c.n_ff, "cannot write config.json: Gemma 4's "
                  "per-layer FFN sizes are the double-wide MLP of the shared layers only");
  j["use_double_wide_mlp"] = double_wide;
  PAGELLM_CHECK(c.kv_source == kv_sources(c.is_swa, shared, "cannot write config.json"),
                "cannot write config.json: the KV sharing is not Gemma 4's (the last layers reading earlier ones)");
  j["num_kv_shared_layers"] = shared;
  j["hidden_size_per_layer_input"] = c.n_embd_per_layer;
  j["vocab_size_per_layer_input"] = c.n_vocab;
}

// The dense MLP and the experts side by side on the attention's output x:
// x += post(post1(mlp(norm(x))) + post2(experts(norm2(x)))), the router
// reading scale * unit_norm(x) / sqrt(hidden).
void moe_block(const LayerPass& p, int il, int64_t n) {
  const ModelConfig& c = p.cfg;
  const FfnWeights& F = p.layers[il].ffn;
  Backend& be = p.be;
  ActivationBuffers& buf = p.buf;
  const int k = c.n_expert_used;
  const int64_t d = c.n_embd;
  be.rms_norm(*buf.x, F.norm.get(), n, d, c.norm_eps, *buf.h);
  glu_ffn(p, *F.gate, *F.up, *F.down, n, p.geo.ff_units(il), *buf.o, il);
  p.all_reduce(*buf.o, n * d);
  be.rms_norm(*buf.o, F.post_norm1.get(), n, d, c.norm_eps, *buf.o);

  be.rms_norm(*buf.x, F.router_in_scale.get(), n, d, c.norm_eps, *buf.h);
  be.matmul(*F.router, *buf.h, n, *buf.router);
  be.scale(*buf.router, n * c.n_expert, 1.0f / std::sqrt(static_cast<float>(d)));
  be.moe_route(*buf.router, n, c.routing(), *buf.ids, *buf.route_w);
  be.rms_norm(*buf.x, F.norm2.get(), n, d, c.norm_eps, *buf.h);
  be.matmul_experts(F.gate_view, *buf.h, n, k, false, *buf.ids, *buf.eg);
  be.matmul_experts(F.up_view, *buf.h, n, k, false, *buf.ids, *buf.eu);
  be.glu(*buf.eg, *buf.eu, n * k * p.geo.n_ff_exp, c.act, *buf.eg);
  be.matmul_experts(F.down_view, *buf.eg, n, k, true, *buf.ids, *buf.ed);
  be.moe_combine(*buf.ed, *buf.route_w, n, k, d, *buf.h);
  p.all_reduce(*buf.h, n * d);
  be.rms_norm(*buf.h, F.post_norm2.get(), n, d, c.norm_eps, *buf.h);

  be.add(*buf.o, *buf.h, n * d);
  be.rms_norm(*buf.o, F.post_norm.get(), n, d, c.norm_eps, *buf.o);
  be.add(*buf.x, *buf.o, n * d);
}

// The file's tensors, each MoE layer's down projections scaled per expert
// by router.per_expert_scale (which then scales each chosen expert's
// output: the router's last step), made in F32 on first request; and
// where a GGUF file fuses each expert's gate and up rows (llama.cpp's
// ffn_gate_up_exps), its halves as ffn_gate_exps / ffn_up_exps.
class ExpertScaleSource : public TensorSource {
 public:
  ExpertScaleSource(const ModelConfig& c, const TensorSource& base) : c_(c), base_(base) {}

  const TensorData* find(const std::string& name) const override {
    if (auto it = made_.find(name); it != made_.end()) return &it->second;
    const TensorData* t = base_.find(name);
    if (!t && c_.moe()) t = gate_up_half(name);
    static const std::string kDown = ".ffn_down_exps.weight";
    if (!t || !c_.moe() || !name.starts_with("blk.") || !name.ends_with(kDown)) return t;
    const TensorData* s = base_.find(name.substr(0, name.size() - kDown.size()) + ".ffn_down_exps.scale");
    if (!s) return t;  // the loader names the missing tensor
    const int64_t E = c_.n_expert, cols = t->cols(), rows = t->rows();
    PAGELLM_CHECK(s->cols() * s->rows() == E && t->shape.size() == 3 && t->shape[2] == E,
                  "'{}' ([{}] values) does not scale the {} experts of '{}'", s->name, s->cols() * s->rows(), E, name);
    std::vector<float> scale(static_cast<size_t>(E));
    dequantize_row_ref(s->type, s->data, scale.data(), E);
    std::vector<float>& out = floats_.emplace_back(static_cast<size_t>(rows * cols));
    const size_t row_bytes = dtype_row_bytes(t->type, cols);
    for (int64_t r = 0; r < rows; ++r) {
      float* row = out.data() + r * cols;
      dequantize_row_ref(t->type, static_cast<const uint8_t*>(t->data) + static_cast<size_t>(r) * row_bytes, row, cols);
      const float f = scale[static_cast<size_t>(r / (rows / E))];
      for (int64_t i = 0; i < cols; ++i) row[i] *= f;
    }
    return &made_.emplace(name, TensorData{name, DType::F32, t->shape, out.data()}).first->second;
  }
  size_t count() const override { return base_.count(); }

 private:
  // Expert e's gate rows, then its up rows, in [cols, 2 * ff, E]: copied half by half.
  const TensorData* gate_up_half(const std::string& name) const {
    static const std::string kGate = ".ffn_gate_exps.weight", kUp = ".ffn_up_exps.weight";
    const bool up = name.ends_with(kUp);
    if (!name.starts_with("blk.") || !(up || name.ends_with(kGate))) return nullptr;
    const std::string fused_name = name.substr(0, name.size() - (up ? kUp : kGate).size()) + ".ffn_gate_up_exps.weight";
    const TensorData* f = base_.find(fused_name);
    if (!f) return nullptr;
    TensorData h = fused_experts_half(*f, up, bytes_.emplace_back(), "'" + fused_name + "'");
    h.name = name;
    return &made_.emplace(name, std::move(h)).first->second;
  }

  const ModelConfig c_;
  const TensorSource& base_;
  mutable std::vector<std::vector<float>> floats_;  // a list: an element's data never moves
  mutable std::vector<std::vector<uint8_t>> bytes_;
  mutable std::unordered_map<std::string, TensorData> made_;
};

std::unique_ptr<TensorSource> derive_tensors(const ModelConfig& c, const TensorSource& src) {
  return std::make_unique<ExpertScaleSource>(c, src);
}

// Attention (no K/V of its own in a shared layer), the FFN, the per-layer
// input's branch, the layer's output scale.
void gemma4_layer_forward(const LayerPass& p, int il, int64_t n) {
  const ModelConfig& c = p.cfg;
  const LayerWeights& L = p.layers[il];
  const AttnWeights& A = L.attn;
  Backend& be = p.be;
  ActivationBuffers& buf = p.buf;
  // Global layers may have their own shape.
  const int hd = c.layer_head_dim(il), n_head = p.geo.n_head, n_head_kv = p.geo.kv_heads(il);
  const bool swa = c.is_swa[il];
  const int cache = c.cache_layer_of(il) - c.cache_layers_before(p.geo.layer_begin);

  be.rms_norm(*buf.x, A.norm.get(), n, c.n_embd, c.norm_eps, *buf.h);
  be.matmul(*A.wq, *buf.h, n, *buf.q);
  lora_add(p, il, LoraTarget::Q, *buf.h, n, *buf.q);
  be.rms_norm(*buf.q, A.q_norm.get(), n * n_head, hd, c.norm_eps, *buf.q);
  const RopeConfig& rope = swa ? c.rope_swa : c.rope;
  be.rope(*buf.q, n_head, hd, rope);
  if (!c.layer_reuses_kv(il)) {
    be.matmul(*A.wk, *buf.h, n, *buf.k);
    lora_add(p, il, LoraTarget::K, *buf.h, n, *buf.k);
    // attention_k_eq_v: the values are the keys before their norm and RoPE.
    if (!c.layer_v_is_k(il)) {
      be.matmul(*A.wv, *buf.h, n, *buf.v);
      lora_add(p, il, LoraTarget::V, *buf.h, n, *buf.v);
    }
    be.rms_norm(c.layer_v_is_k(il) ? *buf.k : *buf.v, nullptr, n * n_head_kv, hd, c.norm_eps, *buf.v);
    be.rms_norm(*buf.k, A.k_norm.get(), n * n_head_kv, hd, c.norm_eps, *buf.k);
    be.store_kv(cache, *buf.k, *buf.v, &rope);
  }
  AttentionConfig ac;
  ac.n_head = n_head;
  ac.n_head_kv = n_head_kv;
  ac.head_dim = hd;
  ac.scale = c.attn_scale;
  ac.sliding_window = swa ? c.sliding_window : 0;
  be.attention(cache, *buf.q, *buf.attn, ac);
  be.matmul(*A.wo, *buf.attn, n, *buf.o);
  lora_add(p, il, LoraTarget::O, *buf.attn, n, *buf.o);
  p.all_reduce(*buf.o, n * c.n_embd);  // row-parallel O: each rank's heads' share
  be.rms_norm(*buf.o, A.post_norm.get(), n, c.n_embd, c.norm_eps, *buf.o);
  be.add(*buf.x, *buf.o, n * c.n_embd);

  if (c.layer_is_moe(il)) moe_block(p, il, n);
  else dense_ffn_block(p, il, n);

  if (c.n_embd_per_layer > 0) {
    // This layer's inputs are rows t * n_layer + il of buf.ple ([n, n_layer,
    // P]). They are sqrt(2) times transformers' (model.cpp), which only the
    // branch's closing norm sees: its epsilon doubles instead.
    const int64_t P = c.n_embd_per_layer;
    std::vector<int32_t> rows(static_cast<size_t>(n));
    for (int64_t t = 0; t < n; ++t) rows[static_cast<size_t>(t)] = static_cast<int32_t>(t * c.n_layer + il);
    be.gather_rows(*buf.ple, P, rows, *buf.ple_layer);
    be.matmul(*L.ple.gate, *buf.x, n, *buf.ple_gate);
    be.glu(*buf.ple_gate, *buf.ple_layer, n * P, c.act, *buf.ple_gate);
    be.matmul(*L.ple.proj, *buf.ple_gate, n, *buf.o);
    be.rms_norm(*buf.o, L.ple.post_norm.get(), n, c.n_embd, 2 * c.norm_eps, *buf.o);
    be.add(*buf.x, *buf.o, n * c.n_embd);
  }
  if (L.out_scale != 1.0f) be.scale(*buf.x, n * c.n_embd, L.out_scale);
}

// tiny-gemma4: six layers, local and global alternating in pairs (s s g s s
// g), the last three reading the K/V of layers 1 (local) and 2 (global);
// a quarter of each global head turning; PLE of 256 per layer; softcapped logits.
void tiny_gemma4(ModelConfig& c) {
  c.is_swa = {true, true, false, true, true, false};
  c.kv_source = kv_sources(c.is_swa, 3, "tiny-gemma4");
  c.n_embd_per_layer = 256;
  c.attn_scale = 1.0f;
  c.rope_swa_base = 10000.0f;
  c.rope.n_rot = c.head_dim;
  c.rope_freq_factors.assign(static_cast<size_t>(c.head_dim / 2), kStillRopePair);
  std::fill_n(c.rope_freq_factors.begin(), c.head_dim / 8, 1.0f);
  c.final_softcap = 30.0f;
}

// tiny-gemma4g: tiny-gemma4 with the released checkpoints' global layers:
// heads of 256 (the local ones 64), one KV head whose values are the keys
// (attention_k_eq_v, as the 31B and 26B-A4B), and the shared layers' MLP
// twice as wide (use_double_wide_mlp, as E2B and E4B). A global layer's K/V
// row (256) is twice a local one's, so the local layers fill half of the
// cache slots they share with it.
void tiny_gemma4g(ModelConfig& c) {
  tiny_gemma4(c);
  c.head_dim_global = 4 * c.head_dim;
  c.n_head_kv_global = 1;
  c.global_v_is_k = true;
  c.rope.n_rot = c.head_dim_global;
  c.rope_freq_factors.assign(static_cast<size_t>(c.head_dim_global / 2), kStillRopePair);
  std::fill_n(c.rope_freq_factors.begin(), c.head_dim_global / 8, 1.0f);
  c.layer_n_ff.assign(static_cast<size_t>(c.n_layer), c.n_ff);
  for (int il = 0; il < c.n_layer; ++il)
    if (c.layer_reuses_kv(il)) c.layer_n_ff[static_cast<size_t>(il)] = 2 * c.n_ff;
}

// tiny-gemma4-31b: the 31B's layout: global layers of their own shape (heads
// of 256 against 64, two KV heads against four, values from the keys), no
// per-layer embeddings and no shared layers, so pipeline stages can cut it.
void tiny_gemma4_31b(ModelConfig& c) {
  tiny_gemma4g(c);
  c.kv_source.clear();
  c.n_embd_per_layer = 0;
  c.n_head_kv_global = 2;
  c.layer_n_ff.clear();
}

// tiny-gemma4moe: the MoE variant (8 experts of 256, 2 per token, beside the
// dense MLP of 512), without per-layer embeddings or shared layers, as the
// 26B-A4B has neither.
void tiny_gemma4moe(ModelConfig& c) {
  tiny_gemma4(c);
  c.kv_source.clear();
  c.n_embd_per_layer = 0;
  c.moe_dense_ffn = true;
}

}  // namespace

ArchInfo gemma4() {
  ArchInfo a = entry(Arch::Gemma4, "gemma4", "gemma4_text",
                     {{"Gemma4ForCausalLM", HfSwa::Pattern}, {"Gemma4ForConditionalGeneration", HfSwa::Pattern}});
  a.qk_norm = true;
  a.post_norms = true;
  a.act = Activation::GeluTanh;
  a.embd_scale_sqrt = true;
  a.swa_pattern = 6;
  a.swa_rope_base = 10000.0f;
  a.gguf_sliding_window = 512;
  a.gguf_layer_sizes = true;
  a.softcaps = true;
  a.moe = true;
  a.moe_norm_topk = true;
  // Gemma4TextConfig's defaults.
  a.hf.vocab_size = 262144;
  a.hf.hidden_size = 2304;
  a.hf.num_hidden_layers = 30;
  a.hf.num_attention_heads = 8;
  a.hf.num_key_value_heads = 4;
  a.hf.intermediate_size = 9216;
  a.hf.head_dim = 256;
  a.hf.max_position_embeddings = 131072;
  a.hf.rope_theta = 1e6f;
  a.hf.tie_word_embeddings = true;
  a.hf.hidden_act = "gelu_pytorch_tanh";
  a.hf.sliding_window = 512;
  a.hf.rope_parameters = R"({"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0})";
  a.globals = gemma4_globals();
  a.layer = gemma4_layer();
  a.read_hf = read_hf;
  a.read_gguf = read_gguf;
  a.write_hf = write_hf;
  a.layer_forward = gemma4_layer_forward;
  a.layer_applies_lora = true;
  a.derive_tensors = derive_tensors;
  a.dummy_shapes = {
      {"tiny-gemma4", 512, 256, 6, 4, 2, 64, 512, 512, 1000000.f, 1e-6f, true, 32, 0, 0, 0, 0, tiny_gemma4},
      {"tiny-gemma4moe", 512, 256, 6, 4, 2, 64, 512, 512, 1000000.f, 1e-6f, true, 32, 8, 2, 256, 0, tiny_gemma4moe},
      {"tiny-gemma4g", 512, 256, 6, 4, 2, 64, 512, 512, 1000000.f, 1e-6f, true, 32, 0, 0, 0, 0, tiny_gemma4g},
      {"tiny-gemma4-31b", 512, 256, 6, 4, 4, 64, 512, 512, 1000000.f, 1e-6f, true, 32, 0, 0, 0, 0, tiny_gemma4_31b},
  };
  return a;
}

}  // namespace pagellm::family
