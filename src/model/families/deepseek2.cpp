// DeepSeek V2 / V3 (and Kimi K2, which is V3-shaped): multi-head latent
// attention (MLA) and Mixture-of-Experts layers with shared experts after
// first_k_dense_replace dense ones. V3 routes by sigmoid scores with a
// choice bias (e_score_correction_bias), group-limited top-k and a routed
// scaling factor; V2 by softmax (greedy or group_limited_greedy).
//
// MLA runs in its absorbed form: the cache holds one vector per token,
// [rope(k_pe), norm(c_kv)], a single KV head shared by all query heads; each
// head's query is [rope(q_pe), W_UK^T q_nope] and its output W_UV o_lat.
// The weights that form takes are derived at load from the checkpoint's
// (derive_tensors below): q_b with each head's rows reordered [rope | nope]
// (the rope op turns leading dims), kv_a split into two zero-padded halves
// (so that one sum assembles the cache vector), and kv_b's per-head blocks
// as the absorbed matrices (F16 unless the checkpoint is F32). DeepSeek's
// RoPE rotates adjacent pairs.
#include <cmath>
#include <cstring>
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

using Mla = ModelConfig::Mla;

int64_t q_rows(const ModelConfig& c) { return static_cast<int64_t>(c.n_head) * c.mla.q_head_dim(); }
Dims q_a_mat(const ModelConfig& c) { return {c.n_embd, c.mla.q_lora_rank}; }
Dims q_a_vec(const ModelConfig& c) { return {c.mla.q_lora_rank}; }
Dims q_b_mat(const ModelConfig& c) { return {c.mla.q_lora_rank, q_rows(c)}; }
Dims q_full_mat(const ModelConfig& c) { return {c.n_embd, q_rows(c)}; }
Dims q_derived_mat(const ModelConfig& c) { return {c.mla.q_lora_rank > 0 ? c.mla.q_lora_rank : c.n_embd, q_rows(c)}; }
Dims kv_a_mat(const ModelConfig& c) { return {c.n_embd, c.mla.latent_dim()}; }
Dims kv_a_vec(const ModelConfig& c) { return {c.mla.kv_lora_rank}; }
Dims kv_b_mat(const ModelConfig& c) {
  return {c.mla.kv_lora_rank, static_cast<int64_t>(c.n_head) * (c.mla.qk_nope_head_dim + c.mla.v_head_dim)};
}
Dims k_b_mat(const ModelConfig& c) { return {c.mla.qk_nope_head_dim, c.mla.kv_lora_rank, c.n_head}; }
Dims v_b_mat(const ModelConfig& c) { return {c.mla.kv_lora_rank, c.mla.v_head_dim, c.n_head}; }
Dims latent_mat(const ModelConfig& c) { return {c.n_embd, c.mla.latent_dim()}; }
Dims latent_vec(const ModelConfig& c) { return {c.mla.latent_dim()}; }
Dims q_absorb(const ModelConfig& c) { return {c.mla.q_head_dim(), c.mla.latent_dim(), c.n_head}; }
Dims o_absorb(const ModelConfig& c) { return {c.mla.latent_dim(), c.mla.v_head_dim, c.n_head}; }
Dims kv_expand(const ModelConfig& c) {
  return {c.mla.latent_dim(), c.mla.q_head_dim() + c.mla.v_head_dim, c.n_head};
}
Dims mla_o_mat(const ModelConfig& c) { return {static_cast<int64_t>(c.n_head) * c.mla.v_head_dim, c.n_embd}; }

TensorSpec derived(TensorSpec t) {
  t.need = Need::Derived;
  return t;
}

TensorSpec derived_experts(const char* g, Dims (*shape)(const ModelConfig&), Slot s) {
  TensorSpec t = experts(g, "", shape, s);
  t.need = Need::Derived;
  return t;
}

std::vector<TensorSpec> layer() {
  constexpr Slot U = Slot::Unused;
  std::vector<TensorSpec> l = {
      vec("attn_norm.weight", "input_layernorm.weight", embd_vec, Slot::AttnNorm),
      mat("attn_q_a.weight", "self_attn.q_a_proj.weight", q_a_mat, Slot::MlaQA, Need::IfQLora),
      vec("attn_q_a_norm.weight", "self_attn.q_a_layernorm.weight", q_a_vec, Slot::MlaQANorm, Need::IfQLora),
      mat("attn_q_b.weight", "self_attn.q_b_proj.weight", q_b_mat, U, Need::IfQLora),
      mat("attn_q.weight", "self_attn.q_proj.weight", q_full_mat, U, Need::IfNoQLora),
      mat("attn_kv_a_mqa.weight", "self_attn.kv_a_proj_with_mqa.weight", kv_a_mat, U),
      vec("attn_kv_a_norm.weight", "self_attn.kv_a_layernorm.weight", kv_a_vec, U),
      // kv_b_proj as llama.cpp's converter splits it; older GGUF files keep it whole.
      mat("attn_k_b.weight", "self_attn.kv_b_proj.weight", k_b_mat, U, Need::IfKvBSplit, Transform::KvBKeys),
      mat("attn_v_b.weight", "self_attn.kv_b_proj.weight", v_b_mat, U, Need::IfKvBSplit, Transform::KvBValues),
      mat("attn_kv_b.weight", "", kv_b_mat, U, Need::IfKvBFused),
      mat("attn_output.weight", "self_attn.o_proj.weight", mla_o_mat, Slot::O),
      // The absorbed form's weights, made from the four above.
      derived(mat("mla_q.weight", "", q_derived_mat, Slot::Q)),
      derived(mat("mla_kv_rope.weight", "", latent_mat, Slot::MlaKvRope)),
      derived(mat("mla_kv_latent.weight", "", latent_mat, Slot::MlaKvLatent)),
      derived(vec("mla_kv_norm.weight", "", latent_vec, Slot::MlaKvNorm)),
      derived_experts("mla_q_absorb.weight", q_absorb, Slot::MlaQAbsorb),
      derived_experts("mla_o_absorb.weight", o_absorb, Slot::MlaOAbsorb),
      derived_experts("mla_kv_expand.weight", kv_expand, Slot::MlaKvExpand),
      vec("ffn_norm.weight", "post_attention_layernorm.weight", embd_vec, Slot::FfnNorm),
  };
  // The FFN: dense in the leading layers, experts after.
  add_deepseek_ffn(l);
  return l;
}

// ---------------------------------------------------------------- derived weights

// The file's tensors plus the absorbed form's, made on first request.
class MlaSource : public TensorSource {
 public:
  MlaSource(const ModelConfig& c, const TensorSource& base) : c_(c), base_(base) {}

  const TensorData* find(const std::string& name) const override {
    if (const TensorData* t = base_.find(name)) return t;
    if (auto it = made_.find(name); it != made_.end()) return &it->second;
    // "blk.<il>.mla_..."
    if (!name.starts_with("blk.")) return nullptr;
    const size_t dot = name.find('.', 4);
    if (dot == std::string::npos) return nullptr;
    int il = 0;
    for (size_t i = 4; i < dot; ++i) {
      if (name[i] < '0' || name[i] > '9' || il > c_.n_layer) return nullptr;
      il = il * 10 + (name[i] - '0');
    }
    if (dot == 4 || il >= c_.n_layer) return nullptr;
    const std::string what = name.substr(dot + 1);
    const std::string blk = name.substr(0, dot + 1);
    TensorData t;
    if (what == "mla_q.weight") t = query(blk);
    else if (what == "mla_kv_rope.weight") t = kv_half(blk, true);
    else if (what == "mla_kv_latent.weight") t = kv_half(blk, false);
    else if (what == "mla_kv_norm.weight") t = kv_norm(blk);
    else if (what == "mla_q_absorb.weight") t = absorb(blk, true);
    else if (what == "mla_o_absorb.weight") t = absorb(blk, false);
    else if (what == "mla_kv_expand.weight") t = expand(blk);
    else return nullptr;
    if (!t.data) return nullptr;  // a tensor it is made from is missing (the loader names that one)
    t.name = name;
    return &made_.emplace(name, std::move(t)).first->second;
  }
  size_t count() const override { return base_.count(); }

 private:
  const TensorData* raw(const std::string& name, const Dims& shape) const {
    const TensorData* t = base_.find(name);
    if (!t) return nullptr;
    PAGELLM_CHECK(t->shape == shape || (shape.size() == 2 && t->shape.size() == 1 && shape[1] == 1 &&
                                        t->shape[0] == shape[0]),
                  "tensor '{}' has the wrong shape for the model's MLA sizes", name);
    return t;
  }
  uint8_t* bytes(size_t n) const { return bytes_.emplace_back(n).data(); }
  float* floats(size_t n) const { return floats_.emplace_back(n).data(); }

  // q_b (q_proj) with each head's rows [nope | rope] reordered [rope | nope], in its type.
  TensorData query(const std::string& blk) const {
    const Mla& m = c_.mla;
    const TensorData* q = m.q_lora_rank > 0 ? raw(blk + "attn_q_b.weight", q_b_mat(c_))
                                            : raw(blk + "attn_q.weight", q_full_mat(c_));
    if (!q) return {};
    const size_t row = dtype_row_bytes(q->type, q->cols());
    const int64_t hd = m.q_head_dim(), nope = m.qk_nope_head_dim, rope = m.qk_rope_head_dim;
    uint8_t* out = bytes(row * static_cast<size_t>(q->rows()));
    const auto* in = static_cast<const uint8_t*>(q->data);
    for (int64_t h = 0; h < c_.n_head; ++h) {
      std::memcpy(out + (h * hd) * row, in + (h * hd + nope) * row, rope * row);
      std::memcpy(out + (h * hd + rope) * row, in + (h * hd) * row, nope * row);
    }
    return TensorData{"", q->type, {q->cols(), q->rows()}, out};
  }

  // kv_a's rows are [c_kv (D) | k_pe (R)]; the rope half is [k_pe | 0], the latent half [0 | c_kv].
  TensorData kv_half(const std::string& blk, bool rope_half) const {
    const Mla& m = c_.mla;
    const TensorData* a = raw(blk + "attn_kv_a_mqa.weight", kv_a_mat(c_));
    if (!a) return {};
    const size_t row = dtype_row_bytes(a->type, a->cols());
    const int64_t R = m.qk_rope_head_dim, D = m.kv_lora_rank;
    uint8_t* out = bytes(row * static_cast<size_t>(R + D));  // zero bytes are zeros in every type
    const auto* in = static_cast<const uint8_t*>(a->data);
    if (rope_half) std::memcpy(out, in + D * row, R * row);
    else std::memcpy(out + R * row, in, D * row);
    return TensorData{"", a->type, {a->cols(), R + D}, out};
  }

  TensorData kv_norm(const std::string& blk) const {
    const Mla& m = c_.mla;
    const TensorData* w = raw(blk + "attn_kv_a_norm.weight", kv_a_vec(c_));
    if (!w) return {};
    const int64_t R = m.qk_rope_head_dim, D = m.kv_lora_rank;
    float* out = floats(static_cast<size_t>(R + D));
    std::vector<float> values(static_cast<size_t>(D));
    dequantize_row_ref(w->type, w->data, values.data(), D);
    const float scale = mla_kv_norm_weight_scale(m);
    for (int64_t d = 0; d < D; ++d) out[R + d] = values[d] * scale;
    return TensorData{"", DType::F32, {R + D}, out};
  }

  // kv_b's per-head halves in float: W_UK [H, nope, D] (keys) or W_UV
  // [H, v, D] (values), from kv_b's rows (one tensor) or attn_k_b (W_UK^T:
  // D rows of nope per head) and attn_v_b (W_UV). Empty when the tensor is
  // missing (the loader names it); `type` is its type.
  std::vector<float> kv_b_half(const std::string& blk, bool keys, DType& type) const {
    const Mla& m = c_.mla;
    const int64_t D = m.kv_lora_rank, nope = m.qk_nope_head_dim, v = m.v_head_dim, H = c_.n_head;
    const TensorData* b = m.kv_b_fused ? raw(blk + "attn_kv_b.weight", kv_b_mat(c_))
                          : keys       ? raw(blk + "attn_k_b.weight", k_b_mat(c_))
                                       : raw(blk + "attn_v_b.weight", v_b_mat(c_));
    if (!b) return {};
    type = b->type;
    std::vector<float> w(static_cast<size_t>(b->cols()));
    auto row = [&](int64_t r) {
      const size_t bytes = dtype_row_bytes(b->type, b->cols());
      dequantize_row_ref(b->type, static_cast<const uint8_t*>(b->data) + static_cast<size_t>(r) * bytes, w.data(),
                         b->cols());
      return w.data();
    };
    const int64_t n = keys ? nope : v;
    std::vector<float> out(static_cast<size_t>(H * n * D));
    for (int64_t h = 0; h < H; ++h) {
      float* oh = out.data() + h * n * D;
      if (m.kv_b_fused) {
        for (int64_t i = 0; i < n; ++i)
          std::memcpy(oh + i * D, row(h * (nope + v) + (keys ? 0 : nope) + i), static_cast<size_t>(D) * sizeof(float));
      } else if (keys) {
        for (int64_t d = 0; d < D; ++d) {
          const float* ukt = row(h * D + d);
          for (int64_t j = 0; j < nope; ++j) oh[j * D + d] = ukt[j];
        }
      } else {
        for (int64_t i = 0; i < v; ++i) std::memcpy(oh + i * D, row(h * v + i), static_cast<size_t>(D) * sizeof(float));
      }
    }
    return out;
  }

  // The absorbed form's per-head matrices, from W_UK and W_UV (kv_b_half).
  TensorData absorb(const std::string& blk, bool query_side) const {
    const Mla& m = c_.mla;
    const int64_t R = m.qk_rope_head_dim, D = m.kv_lora_rank, nope = m.qk_nope_head_dim, v = m.v_head_dim;
    const int64_t L = R + D, H = c_.n_head;
    DType type = DType::F32;
    const std::vector<float> half = kv_b_half(blk, query_side, type);
    if (half.empty()) return {};
    if (query_side) {
      // [L rows, R + nope cols] per head: the rope part passes through, the
      // latent rows are W_UK^T: out[R + d][R + j] = W_UK[j][d].
      const int64_t cols = R + nope;
      std::vector<float> out(static_cast<size_t>(H * L * cols));
      for (int64_t h = 0; h < H; ++h) {
        float* mh = out.data() + h * L * cols;
        const float* uk = half.data() + h * nope * D;
        for (int64_t r = 0; r < R; ++r) mh[r * cols + r] = 1.0f;
        for (int64_t j = 0; j < nope; ++j)
          for (int64_t d = 0; d < D; ++d) mh[(R + d) * cols + R + j] = uk[j * D + d];
      }
      return held_as(std::move(out), {cols, L, H}, type);
    }
    // [v rows, L cols] per head: zero rope columns, then W_UV.
    std::vector<float> out(static_cast<size_t>(H * v * L));
    for (int64_t hi = 0; hi < H * v; ++hi)
      std::memcpy(out.data() + hi * L + R, half.data() + hi * D, static_cast<size_t>(D) * sizeof(float));
    return held_as(std::move(out), {L, v, H}, type);
  }

  // The expanded form's per head [R + nope + v rows, L cols]: the rope part
  // passes through, then W_UK's rows (the key's nope part) and W_UV's (the
  // value), both on the c_kv columns.
  TensorData expand(const std::string& blk) const {
    const Mla& m = c_.mla;
    const int64_t R = m.qk_rope_head_dim, D = m.kv_lora_rank, nope = m.qk_nope_head_dim, v = m.v_head_dim;
    const int64_t L = R + D, H = c_.n_head, rows = R + nope + v;
    DType type = DType::F32, v_type = DType::F32;  // held as the keys' tensor (kv_b or attn_k_b)
    const std::vector<float> uk = kv_b_half(blk, true, type), uv = kv_b_half(blk, false, v_type);
    if (uk.empty() || uv.empty()) return {};
    std::vector<float> out(static_cast<size_t>(H * rows * L));
    for (int64_t h = 0; h < H; ++h) {
      float* mh = out.data() + h * rows * L;
      for (int64_t r = 0; r < R; ++r) mh[r * L + r] = 1.0f;
      for (int64_t i = 0; i < nope + v; ++i) {
        const float* src = i < nope ? uk.data() + (h * nope + i) * D : uv.data() + (h * v + i - nope) * D;
        std::memcpy(mh + (R + i) * L + R, src, static_cast<size_t>(D) * sizeof(float));
      }
    }
    return held_as(std::move(out), {L, rows, H}, type);
  }

  // The absorbed matrices stay F32 for an F32 checkpoint and are F16 for any
  // other: half the bytes each decode step reads. They only rearrange kv_b's
  // values, so F16 holds BF16 and F16 ones exactly (in F16's range) and a
  // quantized one's to 2^-12, far inside its quantization step.
  TensorData held_as(std::vector<float> values, Dims shape, DType source) const {
    if (source == DType::F32) {
      floats_.push_back(std::move(values));
      return TensorData{"", DType::F32, std::move(shape), floats_.back().data()};
    }
    uint8_t* half = bytes(values.size() * sizeof(uint16_t));
    quantize_row_ref(DType::F16, values.data(), half, static_cast<int64_t>(values.size()));
    return TensorData{"", DType::F16, std::move(shape), half};
  }

  const ModelConfig c_;
  const TensorSource& base_;
  // Lists of vectors: an element's data never moves once made.
  mutable std::vector<std::vector<uint8_t>> bytes_;
  mutable std::vector<std::vector<float>> floats_;
  mutable std::unordered_map<std::string, TensorData> made_;
};

std::unique_ptr<TensorSource> derive_tensors(const ModelConfig& c, const TensorSource& src) {
  return std::make_unique<MlaSource>(c, src);
}

void deepseek_layer(const LayerPass& p, int il, int64_t n) {
  mla_attention_block(p, il, n);
  if (p.cfg.layer_is_moe(il)) moe_ffn_block(p, il, n);
  else dense_ffn_block(p, il, n);
}

// ---------------------------------------------------------------- config.json

double yarn_mscale(double factor, double m) { return factor <= 1 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; }

// 1 / sqrt(qk head dim), times mscale(factor, mscale_all_dim)^2 with YaRN
// (transformers' yarn_apply_mscale).
float attention_scale(const nlohmann::json& j, Mla& m) {
  double scale = 1.0 / std::sqrt(static_cast<double>(m.q_head_dim()));
  const nlohmann::json* rp = nullptr;
  for (const char* key : {"rope_scaling", "rope_parameters"})
    if (j.contains(key) && j[key].is_object()) rp = &j[key];
  if (rp) {
    std::string type = "default";
    for (const char* key : {"type", "rope_type"})
      if (rp->contains(key) && (*rp)[key].is_string()) type = (*rp)[key].get<std::string>();
    const double all_dim = hf_float(*rp, "mscale_all_dim", 0);
    m.yarn_mscale = static_cast<float>(hf_float(*rp, "mscale", 0));
    m.yarn_mscale_all_dim = static_cast<float>(all_dim);
    if (type != "default" && all_dim != 0) {
      const double f = yarn_mscale(hf_float(*rp, "factor", 1), all_dim);
      scale *= f * f;
    }
  }
  return static_cast<float>(scale);
}

void read_hf(const nlohmann::json& j, ModelConfig& c, const std::string& path) {
  using L = ModelSizeLimits;
  const std::string cls = j["architectures"][0].get<std::string>();
  const bool v3 = cls == "DeepseekV3ForCausalLM";
  if (!v3)  // the family's HfDefaults are V3's
    for (const char* key : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                            "num_attention_heads", "moe_intermediate_size", "n_routed_experts"})
      PAGELLM_CHECK(j.contains(key) && j[key].is_number(), "'{}': {} must state {}", path, cls, key);
  Mla& m = c.mla;
  m.q_lora_rank = j.contains("q_lora_rank") && j["q_lora_rank"].is_null()
                      ? 0
                      : hf_size(j, "q_lora_rank", 1536, 1, L::kEmbd, path);
  m.kv_lora_rank = hf_size(j, "kv_lora_rank", 512, 1, L::kHeadDim, path);
  m.qk_nope_head_dim = hf_size(j, "qk_nope_head_dim", 128, 1, L::kHeadDim, path);
  m.qk_rope_head_dim = hf_size(j, "qk_rope_head_dim", 64, 2, L::kHeadDim, path);
  m.v_head_dim = hf_size(j, "v_head_dim", 128, 1, L::kHeadDim, path);
  PAGELLM_CHECK(m.latent_dim() <= L::kHeadDim, "'{}': kv_lora_rank + qk_rope_head_dim {} is over {}", path,
                m.latent_dim(), L::kHeadDim);
  // The cache: one latent KV head.
  c.head_dim = static_cast<int>(m.latent_dim());
  c.n_head_kv = 1;
  c.rope.n_rot = m.qk_rope_head_dim;
  const bool interleave = !v3 || !j.contains("rope_interleave") || !j["rope_interleave"].is_boolean() ||
                          j["rope_interleave"].get<bool>();
  c.rope_pairs_adjacent = interleave;
  c.attn_scale = attention_scale(j, m);

  PAGELLM_CHECK(c.moe(), "'{}': {} needs n_routed_experts", path, cls);
  read_hf_deepseek_moe(j, c, path, v3 ? DeepseekMoeDefaults{3, 1, 2.5} : DeepseekMoeDefaults{0, 2, 1.0});
  const std::string method = j.contains("topk_method") && j["topk_method"].is_string()
                                 ? j["topk_method"].get<std::string>()
                                 : (v3 ? "noaux_tc" : "greedy");
  if (v3) {
    PAGELLM_CHECK(method == "noaux_tc", "'{}': topk_method '{}' is not supported for {} (noaux_tc is)", path, method,
                  cls);
    read_hf_sigmoid_router(j, c, path, 8, 4);
  } else {
    // transformers' V2 router never renormalises (DeepSeek's own code does
    // when norm_topk_prob is set): refuse the case where they differ. V2's
    // default is false (the family default is V3's).
    if (!j.contains("norm_topk_prob") || !j["norm_topk_prob"].is_boolean()) c.expert_norm_topk = false;
    PAGELLM_CHECK(!c.expert_norm_topk, "'{}': norm_topk_prob true is not supported for {}", path, cls);
    c.expert_scoring = RouterScoring::Softmax;
    if (method == "group_limited_greedy") {
      c.expert_groups = hf_size(j, "n_group", 1, 1, c.n_expert, path);
      c.expert_groups_used = hf_size(j, "topk_group", 1, 1, c.expert_groups, path);
      c.expert_group_score = GroupScore::Max;
    } else {
      PAGELLM_CHECK(method == "greedy", "'{}': topk_method '{}' is not supported for {} (greedy and "
                    "group_limited_greedy are)", path, method, cls);
    }
  }
}

// llama.cpp's deepseek2 keys. The cache is one latent head (key_length
// kv_lora_rank + rope, value_length kv_lora_rank); the per-head sizes are
// the *_mla keys, absent from files converted before the kv_b split, where
// key/value_length are the expanded heads' and kv_b is one tensor.
void read_gguf(const GGUFFile& f, ModelConfig& c) {
  using L = ModelSizeLimits;
  const std::string a = f.get_string("general.architecture") + ".";
  Mla& m = c.mla;
  m.q_lora_rank = gguf_size(f, a + "attention.q_lora_rank", 0, 0, L::kEmbd);
  m.kv_lora_rank = gguf_size(f, a + "attention.kv_lora_rank", std::nullopt, 1, L::kHeadDim);
  m.qk_rope_head_dim = c.rope.n_rot;
  m.kv_b_fused = !f.has(a + "attention.key_length_mla");
  const int k_len = m.kv_b_fused ? gguf_size(f, a + "attention.key_length", std::nullopt, 2, L::kHeadDim)
                                 : gguf_size(f, a + "attention.key_length_mla", std::nullopt, 2, L::kHeadDim);
  PAGELLM_CHECK(k_len > m.qk_rope_head_dim, "'{}': key length {} leaves no non-rotated part beside {} rotated",
                f.path(), k_len, m.qk_rope_head_dim);
  m.qk_nope_head_dim = k_len - m.qk_rope_head_dim;
  m.v_head_dim = m.kv_b_fused ? gguf_size(f, a + "attention.value_length", std::nullopt, 1, L::kHeadDim)
                              : gguf_size(f, a + "attention.value_length_mla", std::nullopt, 1, L::kHeadDim);
  PAGELLM_CHECK(m.latent_dim() <= L::kHeadDim, "'{}': kv_lora_rank + rope dimensions {} is over {}", f.path(),
                m.latent_dim(), L::kHeadDim);
  c.head_dim = static_cast<int>(m.latent_dim());
  c.n_head_kv = 1;
  c.rope_pairs_adjacent = true;

  // Files without a gating function are DeepSeek V2's (softmax), as llama.cpp reads them.
  read_gguf_deepseek_moe(f, c, RouterScoring::Softmax);
  c.expert_norm_topk = f.get_bool(a + "expert_weights_norm", false);
  // V2's grouped softmax routing ranks a group by its best expert (DeepSeek's
  // and transformers' rule); V3's sigmoid routing by its best two.
  if (c.expert_scoring == RouterScoring::Softmax) c.expert_group_score = GroupScore::Max;

  // The attention scale: 1 / sqrt(q head dim), times mscale(factor,
  // mscale_all_dim)^2 under YaRN. GGUF keeps only mscale_all_dim (the log
  // multiplier, times 0.1), so mscale is taken to equal it, as llama.cpp
  // does: the RoPE's cos / sin are then unscaled (DeepSeek V3, Kimi K2 and
  // V2-Lite state them equal).
  double scale = 1.0 / std::sqrt(static_cast<double>(m.q_head_dim()));
  if (c.rope.ext_factor > 0) {
    const double factor = 1.0 / c.rope.freq_scale;
    const double all_dim = f.get_float(a + "rope.scaling.yarn_log_multiplier", 0.0) / 0.1;
    PAGELLM_CHECK(all_dim >= 0 && std::isfinite(all_dim), "'{}': invalid {}", f.path(),
                  a + "rope.scaling.yarn_log_multiplier");
    const double attn = c.rope.attn_factor, mscale = attn * yarn_mscale(factor, all_dim);
    m.yarn_mscale = m.yarn_mscale_all_dim = static_cast<float>(all_dim);
    c.rope.attn_factor = static_cast<float>(attn / yarn_mscale(factor, 1.0));
    scale *= mscale * mscale;
  } else {
    PAGELLM_CHECK(f.get_float(a + "rope.scaling.yarn_log_multiplier", 0.0) == 0.0,
                  "'{}': {} without YaRN scaling", f.path(), a + "rope.scaling.yarn_log_multiplier");
  }
  c.attn_scale = static_cast<float>(scale);
}

void write_hf(const ModelConfig& c, nlohmann::ordered_json& j) {
  const Mla& m = c.mla;
  const bool v3 = c.expert_scoring == RouterScoring::Sigmoid;
  PAGELLM_CHECK(c.is_mla(), "cannot write config.json: a DeepSeek model needs MLA");
  write_hf_deepseek_moe(c, j);
  j["architectures"] = nlohmann::ordered_json::array({v3 ? "DeepseekV3ForCausalLM" : "DeepseekV2ForCausalLM"});
  j["model_type"] = v3 ? "deepseek_v3" : "deepseek_v2";
  j["num_key_value_heads"] = c.n_head;  // transformers expands the latent to every head
  j["head_dim"] = m.qk_rope_head_dim;
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  if (m.q_lora_rank > 0) j["q_lora_rank"] = m.q_lora_rank;
  else j["q_lora_rank"] = nullptr;
  j["kv_lora_rank"] = m.kv_lora_rank;
  j["qk_nope_head_dim"] = m.qk_nope_head_dim;
  j["qk_rope_head_dim"] = m.qk_rope_head_dim;
  j["v_head_dim"] = m.v_head_dim;
  if (v3) {
    PAGELLM_CHECK(c.expert_choice_bias && c.expert_group_score == GroupScore::Top2Sum,
                  "cannot write config.json: DeepSeek V3 routing has a choice bias and ranks groups by their top two");
    j["topk_method"] = "noaux_tc";
    j["scoring_func"] = "sigmoid";  // DeepSeek's configs state it; llama.cpp's converter reads it
    j["rope_interleave"] = true;
  } else {
    PAGELLM_CHECK(!c.expert_choice_bias && !c.expert_norm_topk, "cannot write config.json: DeepSeek V2 routing has "
                  "no choice bias and does not renormalise");
    j["topk_method"] = c.expert_groups > 1 ? "group_limited_greedy" : "greedy";
    j["scoring_func"] = "softmax";
  }
  PAGELLM_CHECK(c.rope_pairs_adjacent, "cannot write config.json: DeepSeek's RoPE rotates adjacent pairs");
  if (c.rope.ext_factor > 0) {
    PAGELLM_CHECK(m.yarn_mscale > 0 && m.yarn_mscale_all_dim > 0, "cannot write config.json: YaRN without mscale");
    j["rope_scaling"] = {{"type", "yarn"},
                         {"factor", decimal(1.0f / c.rope.freq_scale)},
                         {"original_max_position_embeddings", c.rope.n_ctx_orig},
                         {"beta_fast", decimal(c.rope.beta_fast)},
                         {"beta_slow", decimal(c.rope.beta_slow)},
                         {"mscale", decimal(m.yarn_mscale)},
                         {"mscale_all_dim", decimal(m.yarn_mscale_all_dim)}};
  }
}

// ---------------------------------------------------------------- dummies

void tiny_mla(ModelConfig& c, int q_lora) {
  c.mla = {q_lora, 256, 64, 32, 64};
  c.head_dim = static_cast<int>(c.mla.latent_dim());
  c.n_head_kv = 1;
  c.rope.n_rot = c.mla.qk_rope_head_dim;
  c.rope_pairs_adjacent = true;
  c.attn_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.mla.q_head_dim())));
  c.n_dense_lead = 1;
}

// tiny-deepseek3: q-LoRA, 4 groups of 4 experts with 2 competing, a choice
// bias, one shared expert, a dense first layer, YaRN x4 with mscale (cos /
// sin and the attention scale both change).
void tiny_v3(ModelConfig& c) {
  tiny_mla(c, 256);
  c.expert_scoring = RouterScoring::Sigmoid;
  c.expert_choice_bias = true;
  c.expert_norm_topk = true;
  c.expert_weights_scale = 2.5f;
  c.expert_groups = 4;
  c.expert_groups_used = 2;
  const double factor = 4, m = 0.8, m_all = 0.8;  // equal, as in V3, Kimi K2 and V2-Lite (GGUF keeps one)
  c.rope.freq_scale = static_cast<float>(1 / factor);
  c.rope.ext_factor = 1.0f;
  c.rope.n_ctx_orig = 128;
  c.rope.attn_factor = static_cast<float>(yarn_mscale(factor, m) / yarn_mscale(factor, m_all) / yarn_mscale(factor, 1));
  c.mla.yarn_mscale = static_cast<float>(m);
  c.mla.yarn_mscale_all_dim = static_cast<float>(m_all);
  const double s = yarn_mscale(factor, m_all);
  c.attn_scale = static_cast<float>(s * s / std::sqrt(static_cast<double>(c.mla.q_head_dim())));
}

// tiny-deepseek2: V2-Lite's shape: no q-LoRA, softmax greedy routing, two shared experts.
void tiny_v2(ModelConfig& c) {
  tiny_mla(c, 0);
  c.expert_scoring = RouterScoring::Softmax;
  c.expert_norm_topk = false;
}

// deepseek2-lite-9l: DeepSeek-V2-Lite's sizes (kv_lora 512, 64 experts of
// 1408 with 6 routed and 2 shared, a dense first layer of 10944), 9 of its 27
// layers: a benchmark shape (every layer costs the same, so tokens/s scale by 3).
void v2_lite(ModelConfig& c) {
  c.mla = {0, 512, 128, 64, 128};
  c.head_dim = static_cast<int>(c.mla.latent_dim());
  c.n_head_kv = 1;
  c.rope.n_rot = c.mla.qk_rope_head_dim;
  c.rope_pairs_adjacent = true;
  c.attn_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.mla.q_head_dim())));
  c.n_dense_lead = 1;
  c.expert_scoring = RouterScoring::Softmax;
  c.expert_norm_topk = false;
}

}  // namespace

ArchInfo deepseek2() {
  ArchInfo a = entry(Arch::Deepseek2, "deepseek2", "deepseek_v3",
                     {{"DeepseekV3ForCausalLM"}, {"DeepseekV2ForCausalLM"}});
  a.moe = a.moe_only = true;
  a.moe_norm_topk = true;  // V3's default (V2's reader refuses it)
  a.partial_rotary = true;  // only the rope part of a query head rotates
  // DeepseekV3Config's defaults.
  a.hf.vocab_size = 129280;
  a.hf.hidden_size = 7168;
  a.hf.intermediate_size = 18432;
  a.hf.num_hidden_layers = 61;
  a.hf.num_attention_heads = 128;
  a.hf.head_dim = 64;
  a.hf.max_position_embeddings = 4096;
  a.hf.rms_norm_eps = 1e-6f;
  a.globals = globals(Transform::None);
  a.layer = layer();
  a.read_hf = read_hf;
  a.read_gguf = read_gguf;
  a.write_hf = write_hf;
  a.gguf_mla = true;
  a.layer_forward = deepseek_layer;
  a.derive_tensors = derive_tensors;
  //  name, vocab, embd, layers, heads, kv heads, head_dim (latent), ff, ctx, rope base, eps, tied, swa,
  //  experts, used, ff_exp, ff_shexp
  a.dummy_shapes = {
      {"tiny-deepseek3", 512, 256, 3, 4, 1, 288, 512, 512, 10000.f, 1e-6f, false, 0, 16, 4, 256, 256, tiny_v3},
      {"tiny-deepseek2", 512, 256, 3, 4, 1, 288, 512, 512, 10000.f, 1e-6f, false, 0, 8, 2, 256, 512, tiny_v2},
      {"deepseek2-lite-9l", 102400, 2048, 9, 16, 1, 576, 10944, 32768, 10000.f, 1e-6f, false, 0, 64, 6, 1408, 2816,
       v2_lite},
  };
  return a;
}

}  // namespace pagellm::family
