// gpt-oss: biased attention with a learned sink logit per head, local and
// global layers alternating, then a MoE FFN whose router and experts all have
// biases and a clamped SwiGLU. Its HF checkpoints stack the experts (x @ W
// layout), interleave gate and up in one tensor, and may ship them as MXFP4.
#include "core/error.h"
#include "model/families/common.h"
#include "model/families/families.h"
#include "model/model_config.h"

namespace pagellm::family {
namespace {

Dims head_count_vec(const ModelConfig& c) { return {c.n_head}; }
Dims expert_count_vec(const ModelConfig& c) { return {c.n_expert}; }
Dims ff_exps_bias(const ModelConfig& c) { return {c.n_ff_exp, c.n_expert}; }
Dims down_exps_bias(const ModelConfig& c) { return {c.n_embd, c.n_expert}; }

std::vector<TensorSpec> layer() {
  std::vector<TensorSpec> l = llama_attention(Transform::None);
  std::vector<TensorSpec> rest = {
          vec("attn_output.bias", "self_attn.o_proj.bias", embd_vec, Slot::OBias, Need::IfQkvBias),
          vec("attn_sinks.weight", "self_attn.sinks", head_count_vec, Slot::AttnSinks),
          // The pre-FFN norm (llama.cpp names it post_attention_norm here).
          vec("post_attention_norm.weight", "post_attention_layernorm.weight", embd_vec, Slot::FfnNorm),
          [] {
            TensorSpec t = mat("ffn_gate_inp.weight", "mlp.router.weight", router_mat, Slot::Router, Need::IfMoe);
            t.keep_f32 = true;
            return t;
          }(),
          vec("ffn_gate_inp.bias", "mlp.router.bias", expert_count_vec, Slot::RouterBias, Need::IfMoe),
          experts("ffn_gate_exps.weight", "mlp.experts.gate_up_proj", ff_exps, Slot::GateExps, Transform::GateUpEven),
          experts("ffn_up_exps.weight", "mlp.experts.gate_up_proj", ff_exps, Slot::UpExps, Transform::GateUpOdd),
          experts("ffn_down_exps.weight", "mlp.experts.down_proj", down_exps, Slot::DownExps, Transform::ExpertsInOut),
          expert_biases("ffn_gate_exps.bias", "mlp.experts.gate_up_proj_bias", ff_exps_bias, Slot::GateExpsBias,
                        Transform::GateUpEven),
          expert_biases("ffn_up_exps.bias", "mlp.experts.gate_up_proj_bias", ff_exps_bias, Slot::UpExpsBias,
                        Transform::GateUpOdd),
          expert_biases("ffn_down_exps.bias", "mlp.experts.down_proj_bias", down_exps_bias, Slot::DownExpsBias)};
  l.insert(l.end(), rest.begin(), rest.end());
  return l;
}

// The experts apply their own clamped SwiGLU whatever hidden_act says; only
// its usual constants are supported.
void read_hf(const nlohmann::json& j, ModelConfig&, const std::string& path) {
  PAGELLM_CHECK(hf_float(j, "swiglu_alpha", 1.702) == 1.702 && hf_float(j, "swiglu_limit", 7.0) == 7.0,
                "'{}': swiglu_alpha {} / swiglu_limit {} are not supported (1.702 / 7.0 are)", path,
                hf_float(j, "swiglu_alpha", 1.702), hf_float(j, "swiglu_limit", 7.0));
}

void write_hf(const ModelConfig& c, nlohmann::ordered_json& j) {
  j["hidden_act"] = "silu";
  j["attention_bias"] = true;
  j["sliding_window"] = c.sliding_window;
  j["layer_types"] = hf_layer_types(c);
  j["pad_token_id"] = nullptr;
}

}  // namespace

ArchInfo gptoss() {
  ArchInfo a = entry(Arch::GptOss, "gpt-oss", "gpt_oss", {{"GptOssForCausalLM", HfSwa::Pattern}});
  a.qkv_bias = true;  // and the output projection's
  a.act = Activation::SwigluOai;
  a.swa_pattern = 2;  // even layers a local window, odd layers global; one RoPE for both
  a.gguf_sliding_window = 128;
  a.attn_sinks = true;
  a.moe = a.moe_only = true;
  a.moe_norm_topk = true;  // softmax over the chosen experts' logits: the same weights
  a.hf_mxfp4_experts = true;
  a.hf_moe_keys = HfMoeKeys::LocalExperts;
  a.hf_moe_name = "gpt-oss";
  // GptOssConfig's defaults.
  a.hf.vocab_size = 201088;
  a.hf.hidden_size = 2880;
  a.hf.intermediate_size = 2880;
  a.hf.num_hidden_layers = 36;
  a.hf.num_attention_heads = 64;
  a.hf.num_key_value_heads = 8;
  a.hf.head_dim = 64;
  a.hf.max_position_embeddings = 131072;
  a.hf.rope_theta = 150000.0f;
  a.hf.rms_norm_eps = 1e-5f;
  a.hf.sliding_window = 128;
  a.hf.rope_parameters =
      R"({"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": false,
          "original_max_position_embeddings": 4096})";
  a.globals = globals(Transform::None);
  a.layer = layer();
  a.read_hf = read_hf;
  a.write_hf = write_hf;
  a.dummy_shapes = {
      // One sliding-window layer and one global, 8 query heads (a query width
      // unlike the hidden size), 2 of 4 experts.
      {"tiny-gptoss", 512, 256, 2, 8, 2, 64, 256, 512, 150000.f, 1e-5f, false, 32, 4, 2, 256, 0, dummy_yarn_x4},
  };
  return a;
}

}  // namespace pagellm::family
