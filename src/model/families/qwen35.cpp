// Qwen3.5 (dense): a hybrid of Gated DeltaNet linear-attention layers and
// gated full-attention layers (by default every 4th), each followed by a
// SwiGLU FFN. Norms are zero-centred (x * (1 + w), stored as w in HF
// checkpoints) except each linear head's gated output norm; the full layers'
// q_proj gives [q | gate] per head, q/k are normed per head and rotate a
// part of each head (partial_rotary_factor, halves). The multimodal class's
// text_config is read as the text model; image inputs are not served.
#include "core/error.h"
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
Dims lin_conv_vec(const ModelConfig& c) { return {c.linear.conv_dim() * c.linear.conv_kernel}; }
Dims lin_norm_vec(const ModelConfig& c) { return {c.linear.head_v_dim}; }
Dims lin_out_mat(const ModelConfig& c) { return {c.linear.value_dim(), c.n_embd}; }

std::vector<TensorSpec> layer() {
  constexpr Need A = Need::IfAttnLayer, L = Need::IfLinearLayer;
  constexpr Transform P1 = Transform::NormPlusOne;
  return {
      vec("attn_norm.weight", "input_layernorm.weight", embd_vec, Slot::AttnNorm, Need::Required, P1),
      // Full attention: q_proj's halves per head are the query and the output gate.
      mat("attn_q.weight", "self_attn.q_proj.weight", q_mat, Slot::Q, A, Transform::HeadFirstHalf),
      mat("attn_q_gate.weight", "self_attn.q_proj.weight", q_mat, Slot::QGate, A, Transform::HeadSecondHalf),
      mat("attn_k.weight", "self_attn.k_proj.weight", kv_mat, Slot::K, A),
      mat("attn_v.weight", "self_attn.v_proj.weight", kv_mat, Slot::V, A),
      mat("attn_output.weight", "self_attn.o_proj.weight", o_mat, Slot::O, A),
      vec("attn_q_norm.weight", "self_attn.q_norm.weight", head_vec, Slot::QNorm, A, P1),
      vec("attn_k_norm.weight", "self_attn.k_norm.weight", head_vec, Slot::KNorm, A, P1),
      // Gated DeltaNet.
      mat("attn_qkv.weight", "linear_attn.in_proj_qkv.weight", lin_qkv_mat, Slot::LinQkv, L),
      mat("attn_gate.weight", "linear_attn.in_proj_z.weight", lin_value_mat, Slot::LinZ, L),
      mat("ssm_beta.weight", "linear_attn.in_proj_b.weight", lin_head_mat, Slot::LinBeta, L),
      mat("ssm_alpha.weight", "linear_attn.in_proj_a.weight", lin_head_mat, Slot::LinAlpha, L),
      vec("ssm_conv1d.weight", "linear_attn.conv1d.weight", lin_conv_vec, Slot::LinConv, L, Transform::ConvTaps),
      // A_log itself (llama.cpp's converter stores -exp(A_log) as ssm_a).
      vec("ssm_a_log", "linear_attn.A_log", lin_head_vec, Slot::LinALog, L),
      vec("ssm_dt.bias", "linear_attn.dt_bias", lin_head_vec, Slot::LinDtBias, L),
      vec("ssm_norm.weight", "linear_attn.norm.weight", lin_norm_vec, Slot::LinNorm, L),
      mat("ssm_out.weight", "linear_attn.out_proj.weight", lin_out_mat, Slot::LinOut, L),
      // The FFN (llama.cpp names its norm post_attention_norm here).
      vec("post_attention_norm.weight", "post_attention_layernorm.weight", embd_vec, Slot::FfnNorm, Need::Required,
          P1),
      mat("ffn_gate.weight", "mlp.gate_proj.weight", ff_mat, Slot::Gate),
      mat("ffn_up.weight", "mlp.up_proj.weight", ff_mat, Slot::Up),
      mat("ffn_down.weight", "mlp.down_proj.weight", down_mat, Slot::Down),
  };
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
  c.is_linear = linear_layers(j, c.n_layer, path);
  c.linear.n_k_heads = linear_size(j, "linear_num_key_heads", 16, L::kHeads, path);
  c.linear.n_v_heads = linear_size(j, "linear_num_value_heads", 32, L::kHeads, path);
  c.linear.head_k_dim = linear_size(j, "linear_key_head_dim", 128, L::kHeadDim, path);
  c.linear.head_v_dim = linear_size(j, "linear_value_head_dim", 128, L::kHeadDim, path);
  c.linear.conv_kernel = linear_size(j, "linear_conv_kernel_dim", 4, 64, path);
  // partial_rotary_factor: top level or in rope_parameters; transformers' default 0.25.
  double f = 0.25;
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object())
    f = hf_float(j["rope_parameters"], "partial_rotary_factor", f);
  f = hf_float(j, "partial_rotary_factor", f);
  PAGELLM_CHECK(f > 0 && f <= 1, "'{}': invalid partial_rotary_factor {}", path, f);
  c.rope.n_rot = static_cast<int>(static_cast<double>(c.head_dim) * f);
  PAGELLM_CHECK(!(j.contains("attn_output_gate") && j["attn_output_gate"].is_boolean() &&
                  !j["attn_output_gate"].get<bool>()),
                "'{}': attn_output_gate false is not supported (Qwen3.5's attention is gated)", path);
}

// llama.cpp's converter reorders the value heads (tiled for ggml's
// broadcast) and stores -exp(A_log); pagellm reads Qwen3.5 as transformers
// lays it out.
void read_gguf(const GGUFFile&, ModelConfig&) {
  fail("GGUF qwen35 files are not supported yet (llama.cpp's converter reorders their value heads); load the "
       "Hugging Face folder of the model instead");
}

void write_hf(const ModelConfig& c, nlohmann::ordered_json& j) {
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

// tiny-qwen35: linear and full layers alternating, 2 key / 4 value heads
// (each key head serves two value heads), a quarter of each head rotating.
void tiny_hybrid(ModelConfig& c) {
  c.is_linear.assign(static_cast<size_t>(c.n_layer), false);
  for (int il = 0; il < c.n_layer; ++il) c.is_linear[il] = il % 2 == 0;
  c.linear = {2, 4, 32, 64, 4};
  c.rope.n_rot = c.head_dim / 4;
}

}  // namespace

ArchInfo qwen35() {
  ArchInfo a = entry(Arch::Qwen35, "qwen35", "qwen3_5_text",
                     {{"Qwen3_5ForCausalLM"}, {"Qwen3_5ForConditionalGeneration"}});
  a.qk_norm = true;
  a.attn_out_gate = true;
  a.partial_rotary = true;
  // Qwen3_5TextConfig's defaults.
  a.hf.vocab_size = 248320;
  a.hf.hidden_size = 4096;
  a.hf.intermediate_size = 12288;
  a.hf.num_hidden_layers = 32;
  a.hf.num_attention_heads = 16;
  a.hf.num_key_value_heads = 4;
  a.hf.head_dim = 256;
  a.hf.max_position_embeddings = 32768;
  a.hf.rms_norm_eps = 1e-6f;
  a.globals = globals(Transform::NormPlusOne);
  a.layer = layer();
  a.read_hf = read_hf;
  a.read_gguf = read_gguf;
  a.write_hf = write_hf;
  a.layer_forward = hybrid_decoder_layer;
  a.dummy_shapes = {
      {"tiny-qwen35", 512, 256, 4, 4, 2, 64, 512, 512, 10000000.f, 1e-6f, false, 0, 0, 0, 0, 0, tiny_hybrid},
  };
  return a;
}

}  // namespace pagellm::family
