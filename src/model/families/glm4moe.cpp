// GLM-4.5 / GLM-4.5-Air / GLM-4.6: Llama-style GQA attention with q/k/v
// biases, optional per-head q/k norms (use_qk_norm) and RoPE on the first
// part of each head (partial_rotary_factor, halves), then DeepSeek V3's MoE:
// first_k_dense_replace dense layers, after them a sigmoid router with a
// choice bias, group-limited top-k and routed_scaling_factor, plus shared
// experts. The layer is the shared decoder layer.
//
// The multi-token-prediction block(s) (num_nextn_predict_layers) that the
// checkpoints append as extra layers are not run: the HF source ignores
// them, and a GGUF file's are skipped by nextn_predict_layers (model_config.cpp).
#include "core/error.h"
#include "format/gguf.h"
#include "model/families/common.h"
#include "model/families/families.h"
#include "model/model_config.h"

namespace pagellm::family {
namespace {

std::vector<TensorSpec> layer() {
  std::vector<TensorSpec> l = llama_attention(Transform::None);
  l.push_back(vec("attn_q_norm.weight", "self_attn.q_norm.weight", head_vec, Slot::QNorm, Need::IfQkNorm));
  l.push_back(vec("attn_k_norm.weight", "self_attn.k_norm.weight", head_vec, Slot::KNorm, Need::IfQkNorm));
  // llama.cpp names the FFN's norm post_attention_norm here.
  l.push_back(vec("post_attention_norm.weight", "post_attention_layernorm.weight", embd_vec, Slot::FfnNorm));
  add_deepseek_ffn(l);
  return l;
}

void read_hf(const nlohmann::json& j, ModelConfig& c, const std::string& path) {
  // Every released GLM-4.5 / 4.6 has q/k/v biases; the family requires them.
  PAGELLM_CHECK(j.contains("attention_bias") && j["attention_bias"].is_boolean() && j["attention_bias"].get<bool>(),
                "'{}': Glm4MoeForCausalLM without attention_bias (q/k/v biases) is not supported", path);
  PAGELLM_CHECK(!j.contains("use_qk_norm") || j["use_qk_norm"].is_null() || j["use_qk_norm"].is_boolean(),
                "'{}': use_qk_norm must be true or false", path);
  c.qk_norm = j.contains("use_qk_norm") && j["use_qk_norm"].is_boolean() && j["use_qk_norm"].get<bool>();
  // Glm4MoeConfig's defaults: half of each head rotates.
  c.rope.n_rot = static_cast<int>(static_cast<double>(c.head_dim) * hf_partial_rotary(j, 0.5, path));
  read_hf_deepseek_moe(j, c, path, DeepseekMoeDefaults{1, 1, 1.0});
  read_hf_sigmoid_router(j, c, path, 1, 1);
}

void read_gguf(const GGUFFile& f, ModelConfig& c) {
  c.qk_norm = f.find_tensor("blk.0.attn_q_norm.weight") != nullptr;  // GLM-4.5 has them, 4.5-Air not
  read_gguf_deepseek_moe(f, c, RouterScoring::Sigmoid);
  PAGELLM_CHECK(c.expert_choice_bias, "'{}': glm4moe needs the router's choice bias (exp_probs_b.bias)", f.path());
}

void write_hf(const ModelConfig& c, nlohmann::ordered_json& j) {
  PAGELLM_CHECK(c.expert_scoring == RouterScoring::Sigmoid && c.expert_choice_bias &&
                    c.expert_group_score == GroupScore::Top2Sum,
                "cannot write config.json: GLM-4.5 routes by sigmoid scores with a choice bias, groups ranked by "
                "their top two");
  write_hf_deepseek_moe(c, j);
  j["hidden_act"] = "silu";
  j["attention_bias"] = true;
  j["use_qk_norm"] = c.qk_norm;
  j["num_nextn_predict_layers"] = 0;  // the dummies have no MTP block
  const double f = static_cast<double>(c.rope.n_rot) / c.head_dim;
  PAGELLM_CHECK(static_cast<int>(c.head_dim * f) == c.rope.n_rot,
                "cannot write config.json: {} rotary dims of {} is no partial_rotary_factor", c.rope.n_rot, c.head_dim);
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", decimal(c.rope.freq_base)},
                          {"partial_rotary_factor", f}};
}

// tiny-glm4moe: GLM-4.5's layout: a dense first layer, then 16 experts in 4
// groups of which 2 compete, 4 chosen, one shared expert, q/k norms, heads
// of 128 (more than hidden / heads, as GLM-4.5's), half of each rotating.
void tiny_glm(ModelConfig& c) {
  c.qk_norm = true;
  c.rope.n_rot = c.head_dim / 2;
  c.n_dense_lead = 1;
  c.expert_scoring = RouterScoring::Sigmoid;
  c.expert_choice_bias = true;
  c.expert_norm_topk = true;
  c.expert_weights_scale = 2.5f;
  c.expert_groups = 4;
  c.expert_groups_used = 2;
}

}  // namespace

ArchInfo glm4moe() {
  ArchInfo a = entry(Arch::Glm4Moe, "glm4moe", "glm4_moe", {{"Glm4MoeForCausalLM"}});
  a.qkv_bias = true;
  a.moe = a.moe_only = true;
  a.moe_norm_topk = true;  // Glm4MoeConfig's norm_topk_prob default
  a.partial_rotary = true;
  // Glm4MoeConfig's defaults.
  a.hf.vocab_size = 151552;
  a.hf.hidden_size = 4096;
  a.hf.intermediate_size = 10944;
  a.hf.num_hidden_layers = 46;
  a.hf.num_attention_heads = 96;
  a.hf.num_key_value_heads = 8;
  a.hf.max_position_embeddings = 131072;
  a.hf.rms_norm_eps = 1e-5f;
  a.globals = globals(Transform::None);
  a.layer = layer();
  a.read_hf = read_hf;
  a.read_gguf = read_gguf;
  a.write_hf = write_hf;
  //  name, vocab, embd, layers, heads, kv heads, head_dim, ff, ctx, rope base, eps, tied, swa,
  //  experts, used, ff_exp, ff_shexp
  a.dummy_shapes = {
      {"tiny-glm4moe", 512, 256, 3, 4, 2, 128, 512, 512, 1000000.f, 1e-5f, false, 0, 16, 4, 256, 256, tiny_glm},
  };
  return a;
}

}  // namespace pagellm::family
