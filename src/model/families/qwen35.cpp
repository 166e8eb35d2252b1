// Qwen3.5 (dense and MoE) and Qwen3-Next, one family: a hybrid of Gated
// DeltaNet linear-attention layers and gated full-attention layers (by
// default every 4th), each followed by a
// SwiGLU FFN. Norms are zero-centred (x * (1 + w), stored as w in HF
// checkpoints) except each linear head's gated output norm; the full layers'
// q_proj gives [q | gate] per head, q/k are normed per head and rotate a
// part of each head (partial_rotary_factor, halves). The multimodal class's
// text_config is read as the text model; image inputs are not served.
//
// Qwen3-Next is the same model with two of the linear layer's projections
// fused per key head in its checkpoints: in_proj_qkvz ([q | k | v | z] per key
// head) and in_proj_ba ([b | a] per key head). Its GGUF files (llama.cpp's
// qwen3next) keep attn_qkv / attn_gate as Qwen3.5's (the converter regroups
// in_proj_qkvz) and ssm_ba as the checkpoint has it, with the value heads
// grouped by key head rather than tiled; its experts are stored one per
// matrix, as Qwen2-MoE's.
#include "core/error.h"
#include "format/gguf.h"
#include "model/blocks.h"
#include "model/families/common.h"
#include "model/families/families.h"
#include "model/model_config.h"

namespace pagellm::family {
namespace {

Dims lin_qkv_mat(const ModelConfig& c) { return {c.n_embd, c.linear.conv_dim()}; }
Dims lin_value_mat(const ModelConfig& c) { return {c.n_embd, c.linear.value_dim()}; }
Dims lin_head_mat(const ModelConfig& c) { return {c.n_embd, c.linear.n_v_heads}; }
Dims lin_head_vec(const ModelConfig& c) { return {c.linear.n_v_heads}; }
Dims lin_conv_taps(const ModelConfig& c) { return {c.linear.conv_kernel, c.linear.conv_dim()}; }
Dims lin_norm_vec(const ModelConfig& c) { return {c.linear.head_v_dim}; }
Dims lin_out_mat(const ModelConfig& c) { return {c.linear.value_dim(), c.n_embd}; }
Dims q_gate_mat(const ModelConfig& c) { return {c.n_embd, 2 * static_cast<int64_t>(c.n_head) * c.head_dim}; }
std::vector<int64_t> q_gate_parts(const ModelConfig& c) {
  const int64_t rows = static_cast<int64_t>(c.n_head) * c.head_dim;
  return {rows, rows};
}

Dims lin_ba_mat(const ModelConfig& c) { return {c.n_embd, 2 * static_cast<int64_t>(c.linear.n_v_heads)}; }
std::vector<int64_t> ba_parts(const ModelConfig& c) { return {c.linear.n_v_heads, c.linear.n_v_heads}; }
int key_heads(const ModelConfig& c) { return c.linear.n_k_heads; }

// q_proj as GGUF keeps it: [q | gate] per head, loaded as two weights.
TensorSpec query_and_gate() {
  TensorSpec t = mat("attn_q.weight", "self_attn.q_proj.weight", q_gate_mat, Slot::Q, Need::IfAttnLayer);
  t.slots = {Slot::Q, Slot::QGate};
  t.split_rows = q_gate_parts;
  t.split_per_head = true;
  return t;
}

TensorSpec value_heads(TensorSpec t, VHeads v) {
  t.vheads = v;
  return t;
}

// Qwen3-Next's in_proj_ba: per key head the b rows of its value heads, then
// their a rows; loaded as two weights (value heads in grouped order).
TensorSpec beta_and_alpha() {
  TensorSpec t = mat("ssm_ba.weight", "linear_attn.in_proj_ba.weight", lin_ba_mat, Slot::LinBeta, Need::IfLinearLayer);
  t.slots = {Slot::LinBeta, Slot::LinAlpha};
  t.split_rows = ba_parts;
  t.split_per_head = true;
  t.split_heads = key_heads;
  return t;
}

// Attention or Gated DeltaNet, and the FFN norm; the FFN follows. fused:
// Qwen3-Next's in_proj_qkvz / in_proj_ba in place of Qwen3.5's four.
std::vector<TensorSpec> mixer(bool fused = false) {
  constexpr Need A = Need::IfAttnLayer, L = Need::IfLinearLayer;
  constexpr Transform P1 = Transform::NormPlusOne;
  constexpr VHeads R = VHeads::Rows;
  std::vector<TensorSpec> l = {
      vec("attn_norm.weight", "input_layernorm.weight", embd_vec, Slot::AttnNorm, Need::Required, P1),
      // Full attention: q_proj's halves per head are the query and the output gate.
      query_and_gate(),
      mat("attn_k.weight", "self_attn.k_proj.weight", kv_mat, Slot::K, A),
      mat("attn_v.weight", "self_attn.v_proj.weight", kv_mat, Slot::V, A),
      mat("attn_output.weight", "self_attn.o_proj.weight", o_mat, Slot::O, A),
      vec("attn_q_norm.weight", "self_attn.q_norm.weight", head_vec, Slot::QNorm, A, P1),
      vec("attn_k_norm.weight", "self_attn.k_norm.weight", head_vec, Slot::KNorm, A, P1),
  };
  // Gated DeltaNet, as llama.cpp's converter lays it out (Qwen3.5's value
  // heads tiled in GGUF files when there are more value than key heads).
  if (fused) {
    l.push_back(mat("attn_qkv.weight", "linear_attn.in_proj_qkvz.weight", lin_qkv_mat, Slot::LinQkv, L,
                    Transform::QkvzQkv));
    l.push_back(mat("attn_gate.weight", "linear_attn.in_proj_qkvz.weight", lin_value_mat, Slot::LinZ, L,
                    Transform::QkvzZ));
    l.push_back(beta_and_alpha());
  } else {
    l.push_back(value_heads(mat("attn_qkv.weight", "linear_attn.in_proj_qkv.weight", lin_qkv_mat, Slot::LinQkv, L), R));
    l.push_back(value_heads(mat("attn_gate.weight", "linear_attn.in_proj_z.weight", lin_value_mat, Slot::LinZ, L), R));
    l.push_back(value_heads(mat("ssm_beta.weight", "linear_attn.in_proj_b.weight", lin_head_mat, Slot::LinBeta, L), R));
    l.push_back(
        value_heads(mat("ssm_alpha.weight", "linear_attn.in_proj_a.weight", lin_head_mat, Slot::LinAlpha, L), R));
  }
  for (TensorSpec t : {
           value_heads(vec("ssm_conv1d.weight", "linear_attn.conv1d.weight", lin_conv_taps, Slot::LinConv, L,
                           Transform::ConvTaps), R),
           value_heads(vec("ssm_a", "linear_attn.A_log", lin_head_vec, Slot::LinA, L, Transform::NegExp), R),
           value_heads(vec("ssm_dt.bias", "linear_attn.dt_bias", lin_head_vec, Slot::LinDtBias, L), R),
           vec("ssm_norm.weight", "linear_attn.norm.weight", lin_norm_vec, Slot::LinNorm, L),
           value_heads(mat("ssm_out.weight", "linear_attn.out_proj.weight", lin_out_mat, Slot::LinOut, L),
                       VHeads::Cols),
           // The FFN's norm (llama.cpp names it post_attention_norm here).
           vec("post_attention_norm.weight", "post_attention_layernorm.weight", embd_vec, Slot::FfnNorm,
               Need::Required, P1),
       })
    l.push_back(t);
  return l;
}

std::vector<TensorSpec> dense_layer() {
  std::vector<TensorSpec> l = mixer();
  l.push_back(mat("ffn_gate.weight", "mlp.gate_proj.weight", ff_mat, Slot::Gate));
  l.push_back(mat("ffn_up.weight", "mlp.up_proj.weight", ff_mat, Slot::Up));
  l.push_back(mat("ffn_down.weight", "mlp.down_proj.weight", down_mat, Slot::Down));
  return l;
}

// Qwen3.5-MoE: a softmax router over experts stored fused (transformers 5's
// [n_expert, 2 * ff, in] gate_up_proj and [n_expert, out, in] down_proj),
// plus a shared expert behind a sigmoid gate.
std::vector<TensorSpec> moe_layer() {
  std::vector<TensorSpec> l = mixer();
  l.push_back(mat("ffn_gate_inp.weight", "mlp.gate.weight", router_mat, Slot::Router, Need::IfMoe));
  l.back().keep_f32 = true;
  l.push_back(experts("ffn_gate_exps.weight", "mlp.experts.gate_up_proj", ff_exps, Slot::GateExps,
                      Transform::GateUpFirstHalf));
  l.push_back(experts("ffn_up_exps.weight", "mlp.experts.gate_up_proj", ff_exps, Slot::UpExps,
                      Transform::GateUpSecondHalf));
  l.push_back(experts("ffn_down_exps.weight", "mlp.experts.down_proj", down_exps, Slot::DownExps));
  add_shared_expert(l);
  return l;
}

// Qwen3-Next: the same mixer, fused, and Qwen2-MoE's experts (a softmax
// router, one matrix per expert, a shared expert behind a sigmoid gate).
std::vector<TensorSpec> next_layer() {
  std::vector<TensorSpec> l = mixer(true);
  l.push_back(mat("ffn_gate_inp.weight", "mlp.gate.weight", router_mat, Slot::Router, Need::IfMoe));
  l.back().keep_f32 = true;
  l.push_back(experts("ffn_gate_exps.weight", "mlp.experts.{}.gate_proj.weight", ff_exps, Slot::GateExps));
  l.push_back(experts("ffn_up_exps.weight", "mlp.experts.{}.up_proj.weight", ff_exps, Slot::UpExps));
  l.push_back(experts("ffn_down_exps.weight", "mlp.experts.{}.down_proj.weight", down_exps, Slot::DownExps));
  add_shared_expert(l);
  return l;
}

// Layer kinds from layer_types, else every full_attention_interval-th layer
// full (transformers' default 4).
std::vector<bool> linear_layers(const nlohmann::json& j, int n_layer, const std::string& path) {
  std::vector<bool> linear(static_cast<size_t>(n_layer));
  if (j.contains("layer_types") && !j["layer_types"].is_null()) {
    const nlohmann::json& t = j["layer_types"];
    PAGELLM_CHECK(t.is_array() && static_cast<int>(t.size()) == n_layer,
                  "'{}': layer_types must list one type per layer ({})", path, n_layer);
    for (int il = 0; il < n_layer; ++il) {
      const std::string s = t[il].is_string() ? t[il].get<std::string>() : t[il].dump();
      PAGELLM_CHECK(s == "linear_attention" || s == "full_attention", "'{}': unknown layer type '{}'", path, s);
      linear[il] = s == "linear_attention";
    }
    return linear;
  }
  const double every = hf_float(j, "full_attention_interval", 4);
  PAGELLM_CHECK(every >= 1 && every <= n_layer && every == static_cast<int>(every),
                "'{}': invalid full_attention_interval {}", path, every);
  for (int il = 0; il < n_layer; ++il) linear[il] = (il + 1) % static_cast<int>(every) != 0;
  return linear;
}

int linear_size(const nlohmann::json& j, const char* key, int def, int max, const std::string& path) {
  const double v = hf_float(j, key, def);
  PAGELLM_CHECK(v >= 1 && v <= max && v == static_cast<int>(v), "'{}': invalid {} {}", path, key, v);
  return static_cast<int>(v);
}

void read_hf(const nlohmann::json& j, ModelConfig& c, const std::string& path) {
  using L = ModelSizeLimits;
  // Qwen3.5-MoE has no dense FFN, and its config no intermediate_size.
  if (c.moe() && !j.contains("intermediate_size")) c.n_ff = c.n_ff_exp;
  c.is_linear = linear_layers(j, c.n_layer, path);
  c.linear.n_k_heads = linear_size(j, "linear_num_key_heads", 16, L::kHeads, path);
  c.linear.n_v_heads = linear_size(j, "linear_num_value_heads", 32, L::kHeads, path);
  c.linear.head_k_dim = linear_size(j, "linear_key_head_dim", 128, L::kHeadDim, path);
  c.linear.head_v_dim = linear_size(j, "linear_value_head_dim", 128, L::kHeadDim, path);
  c.linear.conv_kernel = linear_size(j, "linear_conv_kernel_dim", 4, 64, path);
  // transformers' default partial_rotary_factor is 0.25.
  const double f = hf_partial_rotary(j, 0.25, path);
  c.rope.n_rot = static_cast<int>(static_cast<double>(c.head_dim) * f);
  PAGELLM_CHECK(!(j.contains("attn_output_gate") && j["attn_output_gate"].is_boolean() &&
                  !j["attn_output_gate"].get<bool>()),
                "'{}': attn_output_gate false is not supported (Qwen3.5's attention is gated)", path);
}

// llama.cpp's keys: the SSM sizes (state_size is the key head size,
// inner_size all value heads), the recurrent layers or the full-attention
// interval. Its converter tiles Qwen3.5's value heads, not Qwen3-Next's.
void read_gguf_linear(const GGUFFile& f, ModelConfig& c, bool v_heads_tiled) {
  using L = ModelSizeLimits;
  const std::string a = f.get_string("general.architecture") + ".";
  auto size = [&](const char* key, int64_t max) { return gguf_size(f, a + key, std::nullopt, 1, max); };
  c.linear.conv_kernel = size("ssm.conv_kernel", 64);
  c.linear.head_k_dim = size("ssm.state_size", L::kHeadDim);
  c.linear.n_k_heads = size("ssm.group_count", L::kHeads);
  c.linear.n_v_heads = size("ssm.time_step_rank", L::kHeads);
  const int inner = size("ssm.inner_size", L::kHeads * L::kHeadDim);
  PAGELLM_CHECK(inner % c.linear.n_v_heads == 0 && inner / c.linear.n_v_heads <= L::kHeadDim,
                "'{}': {}ssm.inner_size {} is not {} value heads of a valid size", f.path(), a, inner,
                c.linear.n_v_heads);
  c.linear.head_v_dim = inner / c.linear.n_v_heads;
  c.linear.v_heads_tiled = v_heads_tiled;
  c.is_linear.assign(static_cast<size_t>(c.n_layer), false);
  if (f.has(a + "attention.recurrent_layers")) {
    const std::vector<int64_t> r = f.get_int_array(a + "attention.recurrent_layers");
    PAGELLM_CHECK(static_cast<int>(r.size()) >= c.n_layer, "'{}': {}attention.recurrent_layers has {} entries for {} "
                  "layers", f.path(), a, r.size(), c.n_layer);
    for (int il = 0; il < c.n_layer; ++il) c.is_linear[il] = r[il] != 0;
  } else {
    const int every = gguf_size(f, a + "full_attention_interval", 4, 1, c.n_layer);
    for (int il = 0; il < c.n_layer; ++il) c.is_linear[il] = (il + 1) % every != 0;
  }
}

void read_gguf(const GGUFFile& f, ModelConfig& c) { read_gguf_linear(f, c, true); }
void read_gguf_next(const GGUFFile& f, ModelConfig& c) {
  read_gguf_linear(f, c, false);
  // Early converters kept in_proj_qkvz fused, per key head, as ssm_in.
  for (int il = 0; il < c.n_layer; ++il)
    PAGELLM_CHECK(!f.find_tensor("blk." + std::to_string(il) + ".ssm_in.weight"),
                  "'{}': a qwen3next file with the fused ssm_in tensor (an early llama.cpp conversion) is not "
                  "supported; convert the model again (attn_qkv and attn_gate)", f.path());
}

void write_hf_common(const ModelConfig& c, nlohmann::ordered_json& j) {
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  std::vector<std::string> types;
  for (int il = 0; il < c.n_layer; ++il) types.push_back(c.layer_is_linear(il) ? "linear_attention" : "full_attention");
  j["layer_types"] = types;
  j["linear_num_key_heads"] = c.linear.n_k_heads;
  j["linear_num_value_heads"] = c.linear.n_v_heads;
  j["linear_key_head_dim"] = c.linear.head_k_dim;
  j["linear_value_head_dim"] = c.linear.head_v_dim;
  j["linear_conv_kernel_dim"] = c.linear.conv_kernel;
  const double f = static_cast<double>(c.rope.n_rot) / c.head_dim;
  PAGELLM_CHECK(static_cast<int>(c.head_dim * f) == c.rope.n_rot,
                "cannot write config.json: {} rotary dims of {} is no partial_rotary_factor", c.rope.n_rot, c.head_dim);
  j["partial_rotary_factor"] = f;
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", decimal(c.rope.freq_base)},
                          {"partial_rotary_factor", f}};
}

void write_hf(const ModelConfig& c, nlohmann::ordered_json& j) {
  write_hf_common(c, j);
  if (c.moe()) {
    // Qwen3_5MoeTextConfig has no dense FFN size and always renormalises.
    PAGELLM_CHECK(c.expert_norm_topk, "cannot write config.json: Qwen3.5-MoE always renormalises its experts' weights");
    for (const char* key : {"intermediate_size", "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers"}) j.erase(key);
  }
}

// Qwen3NextConfig states the experts as Qwen2-MoE's (the shared writer's keys).
void write_hf_next(const ModelConfig& c, nlohmann::ordered_json& j) {
  PAGELLM_CHECK(!c.linear.v_heads_tiled || c.linear.n_k_heads == c.linear.n_v_heads,
                "cannot write config.json: Qwen3-Next's value heads are grouped by key head, not tiled");
  write_hf_common(c, j);
}

// tiny-qwen35: linear and full layers alternating, 2 key / 4 value heads
// (each key head serves two value heads; tiled, as in a converted GGUF), a
// quarter of each head rotating.
void tiny_hybrid(ModelConfig& c) {
  c.is_linear.assign(static_cast<size_t>(c.n_layer), false);
  for (int il = 0; il < c.n_layer; ++il) c.is_linear[il] = il % 2 == 0;
  c.linear = {2, 4, 64, 64, 4, true};  // llama.cpp needs equal key and value head sizes
  c.rope.n_rot = c.head_dim / 4;
}

// tiny-qwen35moe: the same, with 8 experts of which 2 per token and a shared expert.
void tiny_hybrid_moe(ModelConfig& c) {
  tiny_hybrid(c);
  c.expert_norm_topk = true;
}

// qwen35moe-a3b-12l: a Qwen3.5-35B-A3B-like layer (2048 wide; 16 key / 32
// value linear heads of 128; 16 query / 2 KV heads of 256, a quarter rotating;
// 256 experts of 512, 8 routed, one shared), every 4th layer full attention,
// 12 layers: a benchmark shape.
void a3b_hybrid_moe(ModelConfig& c) {
  c.is_linear.assign(static_cast<size_t>(c.n_layer), false);
  for (int il = 0; il < c.n_layer; ++il) c.is_linear[il] = il % 4 != 3;
  c.linear = {16, 32, 128, 128, 4, true};
  c.rope.n_rot = c.head_dim / 4;
  c.expert_norm_topk = true;
}

// tiny-qwen3next: tiny-qwen35moe's layers with Qwen3-Next's fused
// projections; its value heads stay grouped by key head (llama.cpp's
// qwen3next), each key head serving two.
void tiny_next(ModelConfig& c) {
  tiny_hybrid_moe(c);
  c.linear.v_heads_tiled = false;
}

ArchInfo common_entry(ArchInfo a) {
  a.qk_norm = true;
  a.attn_out_gate = true;
  a.partial_rotary = true;
  a.hf.vocab_size = 248320;
  a.hf.num_attention_heads = 16;
  a.hf.head_dim = 256;
  a.hf.max_position_embeddings = 32768;
  a.hf.rms_norm_eps = 1e-6f;
  a.globals = globals(Transform::NormPlusOne);
  a.read_hf = read_hf;
  a.read_gguf = read_gguf;
  a.write_hf = write_hf;
  a.layer_forward = hybrid_decoder_layer;
  return a;
}

}  // namespace

ArchInfo qwen35() {
  ArchInfo a = common_entry(entry(Arch::Qwen35, "qwen35", "qwen3_5_text",
                                  {{"Qwen3_5ForCausalLM"}, {"Qwen3_5ForConditionalGeneration"}}));
  // Qwen3_5TextConfig's defaults.
  a.hf.hidden_size = 4096;
  a.hf.intermediate_size = 12288;
  a.hf.num_hidden_layers = 32;
  a.hf.num_key_value_heads = 4;
  a.layer = dense_layer();
  a.dummy_shapes = {
      {"tiny-qwen35", 512, 256, 4, 4, 2, 64, 512, 512, 10000000.f, 1e-6f, false, 0, 0, 0, 0, 0, tiny_hybrid},
  };
  return a;
}

ArchInfo qwen35moe() {
  ArchInfo a = common_entry(entry(Arch::Qwen35Moe, "qwen35moe", "qwen3_5_moe_text",
                                  {{"Qwen3_5MoeForCausalLM"}, {"Qwen3_5MoeForConditionalGeneration"}}));
  a.moe = a.moe_only = true;
  a.moe_norm_topk = true;  // Qwen3_5MoeTopKRouter always renormalises the chosen weights
  // Qwen3_5MoeTextConfig's defaults (no dense FFN: n_ff is the expert size).
  a.hf.hidden_size = 2048;
  a.hf.intermediate_size = 512;
  a.hf.num_hidden_layers = 40;
  a.hf.num_key_value_heads = 2;
  a.layer = moe_layer();
  a.dummy_shapes = {
      {"tiny-qwen35moe", 512, 256, 4, 4, 2, 64, 256, 512, 10000000.f, 1e-6f, false, 0, 8, 2, 256, 256,
       tiny_hybrid_moe},
      {"qwen35moe-a3b-12l", 248320, 2048, 12, 16, 2, 256, 512, 32768, 10000000.f, 1e-6f, false, 0, 256, 8, 512, 512,
       a3b_hybrid_moe},
  };
  return a;
}

ArchInfo qwen3next() {
  ArchInfo a = common_entry(entry(Arch::Qwen3Next, "qwen3next", "qwen3_next", {{"Qwen3NextForCausalLM"}}));
  a.moe = a.moe_only = true;
  a.moe_norm_topk = true;  // Qwen3NextConfig's norm_topk_prob default
  // Qwen3NextConfig's defaults.
  a.hf.vocab_size = 151936;
  a.hf.hidden_size = 2048;
  a.hf.intermediate_size = 5632;
  a.hf.num_hidden_layers = 48;
  a.hf.num_key_value_heads = 2;
  a.layer = next_layer();
  a.read_gguf = read_gguf_next;
  a.write_hf = write_hf_next;
  a.dummy_shapes = {
      {"tiny-qwen3next", 512, 256, 4, 4, 2, 64, 256, 512, 10000000.f, 1e-6f, false, 0, 8, 2, 256, 256, tiny_next},
  };
  return a;
}

}  // namespace pagellm::family
