// Phi-3 / Phi-3.5 / Phi-4-mini: Llama's layer with q/k/v fused into one
// matrix and gate/up into another (gate rows first), in both formats; the
// loader splits them. Partial rotary dimensions, LongRoPE, and a window on
// every layer or none.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/families/common.h"
#include "model/families/families.h"

namespace pagellm::family {
namespace {

Dims qkv_mat(const ModelConfig& c) { return {c.n_embd, int64_t{c.n_head + 2 * c.n_head_kv} * c.head_dim}; }
Dims gate_up_mat(const ModelConfig& c) { return {c.n_embd, int64_t{2} * c.n_ff}; }
std::vector<int64_t> qkv_rows(const ModelConfig& c) {
  return {int64_t{c.n_head} * c.head_dim, int64_t{c.n_head_kv} * c.head_dim, int64_t{c.n_head_kv} * c.head_dim};
}
std::vector<int64_t> gate_up_rows(const ModelConfig& c) { return {c.n_ff, c.n_ff}; }

std::vector<TensorSpec> layer() {
  return {vec("attn_norm.weight", "input_layernorm.weight", embd_vec, Slot::AttnNorm),
          TensorSpec{"attn_qkv.weight", "self_attn.qkv_proj.weight", qkv_mat, Need::Required, Transform::None,
                     {Slot::Q, Slot::K, Slot::V}, qkv_rows, true},
          mat("attn_output.weight", "self_attn.o_proj.weight", o_mat, Slot::O),
          vec("ffn_norm.weight", "post_attention_layernorm.weight", embd_vec, Slot::FfnNorm),
          TensorSpec{"ffn_up.weight", "mlp.gate_up_proj.weight", gate_up_mat, Need::Required, Transform::None,
                     {Slot::Gate, Slot::Up}, gate_up_rows, true},
          mat("ffn_down.weight", "mlp.down_proj.weight", down_mat, Slot::Down)};
}

void write_hf(const ModelConfig& c, nlohmann::ordered_json& j) {
  j["hidden_act"] = "silu";
  j["pad_token_id"] = nullptr;  // Phi3Config's default (32000) is past a small vocabulary
  const double f = static_cast<double>(c.rope.n_rot) / c.head_dim;
  PAGELLM_CHECK(static_cast<int>(c.head_dim * f) == c.rope.n_rot,
                "cannot write config.json: {} rotary dims of {} is no partial_rotary_factor", c.rope.n_rot,
                c.head_dim);
  if (c.rope.n_rot != c.head_dim) j["partial_rotary_factor"] = f;
  const bool any_swa = any_sliding_layer(c);
  PAGELLM_CHECK(!any_swa || std::all_of(c.is_swa.begin(), c.is_swa.end(), [](bool b) { return b; }),
                "cannot write config.json: Phi-3 windows every layer or none");
  j["sliding_window"] = any_swa ? nlohmann::ordered_json(c.sliding_window) : nullptr;
}

void half_rotary(ModelConfig& c) { c.rope.n_rot = 32; }  // partial_rotary_factor 0.5, as Phi-4-mini has 0.75

// LongRoPE past an original context of 32 (so the 40-token fixtures take the
// long factors), with transformers' attention factor for 512 / 32.
void longrope(ModelConfig& c) {
  c.rope.n_rot = 32;
  c.rope.n_ctx_orig = 32;
  for (int i = 0; i < c.rope.n_rot / 2; ++i) {
    c.rope_factors_short.push_back(1.0f + 0.05f * static_cast<float>(i));
    c.rope_factors_long.push_back(1.0f + 0.9f * static_cast<float>(i));
  }
  c.rope.attn_factor = static_cast<float>(std::sqrt(1.0 + std::log(512.0 / 32.0) / std::log(32.0)));
}

}  // namespace

ArchInfo phi3() {
  ArchInfo a = entry(Arch::Phi3, "phi3", "phi3", {{"Phi3ForCausalLM", HfSwa::EveryLayer}});
  a.swa_every_layer = true;
  a.partial_rotary = true;
  // Phi3Config's defaults.
  a.hf.vocab_size = 32064;
  a.hf.hidden_size = 3072;
  a.hf.intermediate_size = 8192;
  a.hf.num_hidden_layers = 32;
  a.hf.num_attention_heads = 32;
  a.hf.max_position_embeddings = 4096;
  a.hf.rms_norm_eps = 1e-5f;
  a.globals = globals(Transform::None);
  a.layer = layer();
  a.write_hf = write_hf;
  a.dummy_shapes = {
      {"tiny-phi3", 512, 256, 2, 4, 2, 64, 512, 512, 10000.f, 1e-5f, false, 32, 0, 0, 0, 0, half_rotary},
      // No window: llama.cpp ignores Phi-3's sliding window (its phi3 graph
      // turns SWA off), so only a windowless Phi-3 compares with it.
      {"tiny-phi3-longrope", 512, 256, 2, 4, 2, 64, 512, 512, 10000.f, 1e-5f, false, 0, 0, 0, 0, 0, longrope},
  };
  return a;
}

}  // namespace pagellm::family
