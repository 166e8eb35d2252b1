#include "model/families/common.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <string_view>

#include "core/error.h"
#include "format/gguf.h"

namespace pagellm::family {
namespace {

Dims rope_vec(const ModelConfig& c) { return {c.rope.n_rot / 2}; }
Dims ff_shexp(const ModelConfig& c) { return {c.n_embd, c.n_ff_shexp}; }
Dims down_shexp(const ModelConfig& c) { return {c.n_ff_shexp, c.n_embd}; }
Dims shexp_gate_mat(const ModelConfig& c) { return {c.n_embd, 1}; }
Dims expert_vec(const ModelConfig& c) { return {c.n_expert}; }

}  // namespace

void add_shared_expert(std::vector<TensorSpec>& l) {
  // The gate is one row, [n_embd, 1] as llama.cpp's converter writes it (a
  // vector [n_embd] is read the same).
  l.push_back(mat("ffn_gate_inp_shexp.weight", "mlp.shared_expert_gate.weight", shexp_gate_mat, Slot::ShexpGate,
                  Need::IfSharedExpert));
  l.back().keep_f32 = true;
  l.push_back(mat("ffn_gate_shexp.weight", "mlp.shared_expert.gate_proj.weight", ff_shexp, Slot::GateShexp,
                  Need::IfSharedExpert));
  l.push_back(mat("ffn_up_shexp.weight", "mlp.shared_expert.up_proj.weight", ff_shexp, Slot::UpShexp,
                  Need::IfSharedExpert));
  l.push_back(mat("ffn_down_shexp.weight", "mlp.shared_expert.down_proj.weight", down_shexp, Slot::DownShexp,
                  Need::IfSharedExpert));
}

void add_deepseek_ffn(std::vector<TensorSpec>& l) {
  l.push_back(mat("ffn_gate.weight", "mlp.gate_proj.weight", ff_mat, Slot::Gate, Need::IfDense));
  l.push_back(mat("ffn_up.weight", "mlp.up_proj.weight", ff_mat, Slot::Up, Need::IfDense));
  l.push_back(mat("ffn_down.weight", "mlp.down_proj.weight", down_mat, Slot::Down, Need::IfDense));
  l.push_back(mat("ffn_gate_inp.weight", "mlp.gate.weight", router_mat, Slot::Router, Need::IfMoe));
  l.back().keep_f32 = true;
  l.push_back(vec("exp_probs_b.bias", "mlp.gate.e_score_correction_bias", expert_vec, Slot::RouterChoiceBias,
                  Need::IfChoiceBias));
  l.push_back(experts("ffn_gate_exps.weight", "mlp.experts.{}.gate_proj.weight", ff_exps, Slot::GateExps));
  l.push_back(experts("ffn_up_exps.weight", "mlp.experts.{}.up_proj.weight", ff_exps, Slot::UpExps));
  l.push_back(experts("ffn_down_exps.weight", "mlp.experts.{}.down_proj.weight", down_exps, Slot::DownExps));
  l.push_back(mat("ffn_gate_shexp.weight", "mlp.shared_experts.gate_proj.weight", ff_shexp, Slot::GateShexp,
                  Need::IfSharedExpert));
  l.push_back(mat("ffn_up_shexp.weight", "mlp.shared_experts.up_proj.weight", ff_shexp, Slot::UpShexp,
                  Need::IfSharedExpert));
  l.push_back(mat("ffn_down_shexp.weight", "mlp.shared_experts.down_proj.weight", down_shexp, Slot::DownShexp,
                  Need::IfSharedExpert));
}

namespace {

// The FFN of a Llama-style layer: dense, or (with experts in the config) a
// router and experts, HF names as Mixtral's (moe_hf: "block_sparse_moe") or
// Qwen-MoE's ("mlp", with a shared expert behind a sigmoid gate).
void add_ffn(std::vector<TensorSpec>& l, const char* moe_hf) {
  l.push_back(mat("ffn_gate.weight", "mlp.gate_proj.weight", ff_mat, Slot::Gate, Need::IfDense));
  l.push_back(mat("ffn_up.weight", "mlp.up_proj.weight", ff_mat, Slot::Up, Need::IfDense));
  l.push_back(mat("ffn_down.weight", "mlp.down_proj.weight", down_mat, Slot::Down, Need::IfDense));
  if (!moe_hf) return;
  const bool mixtral = std::string_view(moe_hf) == "block_sparse_moe";
  l.push_back(mat("ffn_gate_inp.weight", mixtral ? "block_sparse_moe.gate.weight" : "mlp.gate.weight", router_mat,
                  Slot::Router, Need::IfMoe));
  l.back().keep_f32 = true;
  l.push_back(experts("ffn_gate_exps.weight", mixtral ? "block_sparse_moe.experts.{}.w1.weight" : "mlp.experts.{}.gate_proj.weight",
                      ff_exps, Slot::GateExps));
  l.push_back(experts("ffn_up_exps.weight", mixtral ? "block_sparse_moe.experts.{}.w3.weight" : "mlp.experts.{}.up_proj.weight",
                      ff_exps, Slot::UpExps));
  l.push_back(experts("ffn_down_exps.weight", mixtral ? "block_sparse_moe.experts.{}.w2.weight" : "mlp.experts.{}.down_proj.weight",
                      down_exps, Slot::DownExps));
  if (!mixtral) add_shared_expert(l);
}

}  // namespace

Dims embd_vec(const ModelConfig& c) { return {c.n_embd}; }
Dims head_vec(const ModelConfig& c) { return {c.head_dim}; }
Dims vocab_mat(const ModelConfig& c) { return {c.n_embd, c.n_vocab}; }
Dims q_mat(const ModelConfig& c) { return {c.n_embd, int64_t{c.n_head} * c.head_dim}; }
Dims kv_mat(const ModelConfig& c) { return {c.n_embd, int64_t{c.n_head_kv} * c.head_dim}; }
Dims o_mat(const ModelConfig& c) { return {int64_t{c.n_head} * c.head_dim, c.n_embd}; }
Dims q_vec(const ModelConfig& c) { return {int64_t{c.n_head} * c.head_dim}; }
Dims kv_vec(const ModelConfig& c) { return {int64_t{c.n_head_kv} * c.head_dim}; }
Dims ff_mat(const ModelConfig& c) { return {c.n_embd, c.n_ff}; }
Dims down_mat(const ModelConfig& c) { return {c.n_ff, c.n_embd}; }
Dims router_mat(const ModelConfig& c) { return {c.n_embd, c.n_expert}; }
Dims ff_exps(const ModelConfig& c) { return {c.n_embd, c.n_ff_exp, c.n_expert}; }
Dims down_exps(const ModelConfig& c) { return {c.n_ff_exp, c.n_embd, c.n_expert}; }

TensorSpec vec(const char* g, const char* h, Dims (*shape)(const ModelConfig&), Slot s, Need need,
               Transform tr) {
  return TensorSpec{g, h, shape, need, tr, {s}, nullptr, false};
}
TensorSpec mat(const char* g, const char* h, Dims (*shape)(const ModelConfig&), Slot s, Need need,
               Transform tr) {
  return TensorSpec{g, h, shape, need, tr, {s}, nullptr, true};
}

TensorSpec experts(const char* g, const char* h, Dims (*shape)(const ModelConfig&), Slot s,
                   Transform tr) {
  TensorSpec t = mat(g, h, shape, s, Need::IfMoe, tr);
  t.experts = true;
  return t;
}

TensorSpec expert_biases(const char* g, const char* h, Dims (*shape)(const ModelConfig&), Slot s,
                         Transform tr) {
  TensorSpec t = vec(g, h, shape, s, Need::IfMoe, tr);
  t.experts = true;
  return t;
}

std::vector<TensorSpec> globals(Transform norm) {
  return {mat("token_embd.weight", "model.embed_tokens.weight", vocab_mat, Slot::TokEmbd),
          vec("output_norm.weight", "model.norm.weight", embd_vec, Slot::OutputNorm, Need::Required, norm),
          mat("output.weight", "lm_head.weight", vocab_mat, Slot::Output, Need::Optional),
          vec("rope_freqs.weight", "", rope_vec, Slot::RopeFreqs, Need::Optional),
          vec("rope_factors_short.weight", "", rope_vec, Slot::RopeFactorsShort, Need::Optional),
          vec("rope_factors_long.weight", "", rope_vec, Slot::RopeFactorsLong, Need::Optional)};
}

std::vector<TensorSpec> llama_attention(Transform qk) {
  return {vec("attn_norm.weight", "input_layernorm.weight", embd_vec, Slot::AttnNorm),
          mat("attn_q.weight", "self_attn.q_proj.weight", q_mat, Slot::Q, Need::Required, qk),
          mat("attn_k.weight", "self_attn.k_proj.weight", kv_mat, Slot::K, Need::Required, qk),
          mat("attn_v.weight", "self_attn.v_proj.weight", kv_mat, Slot::V),
          mat("attn_output.weight", "self_attn.o_proj.weight", o_mat, Slot::O),
          vec("attn_q.bias", "self_attn.q_proj.bias", q_vec, Slot::QBias, Need::IfQkvBias),
          vec("attn_k.bias", "self_attn.k_proj.bias", kv_vec, Slot::KBias, Need::IfQkvBias),
          vec("attn_v.bias", "self_attn.v_proj.bias", kv_vec, Slot::VBias, Need::IfQkvBias)};
}

std::vector<TensorSpec> llama_layer(Transform qk, bool qk_norm, const char* moe_hf) {
  std::vector<TensorSpec> l = llama_attention(qk);
  if (qk_norm) {
    l.push_back(vec("attn_q_norm.weight", "self_attn.q_norm.weight", head_vec, Slot::QNorm, Need::IfQkNorm));
    l.push_back(vec("attn_k_norm.weight", "self_attn.k_norm.weight", head_vec, Slot::KNorm, Need::IfQkNorm));
  }
  l.push_back(vec("ffn_norm.weight", "post_attention_layernorm.weight", embd_vec, Slot::FfnNorm));
  add_ffn(l, moe_hf);
  return l;
}

std::vector<TensorSpec> gemma_layer(bool qk_norm) {
  const Transform n = Transform::NormPlusOne;
  std::vector<TensorSpec> l = {
      vec("attn_norm.weight", "input_layernorm.weight", embd_vec, Slot::AttnNorm, Need::Required, n),
      mat("attn_q.weight", "self_attn.q_proj.weight", q_mat, Slot::Q),
      mat("attn_k.weight", "self_attn.k_proj.weight", kv_mat, Slot::K),
      mat("attn_v.weight", "self_attn.v_proj.weight", kv_mat, Slot::V),
      mat("attn_output.weight", "self_attn.o_proj.weight", o_mat, Slot::O),
  };
  if (qk_norm) {
    l.push_back(vec("attn_q_norm.weight", "self_attn.q_norm.weight", head_vec, Slot::QNorm, Need::IfQkNorm, n));
    l.push_back(vec("attn_k_norm.weight", "self_attn.k_norm.weight", head_vec, Slot::KNorm, Need::IfQkNorm, n));
  }
  l.push_back(vec("post_attention_norm.weight", "post_attention_layernorm.weight", embd_vec, Slot::PostAttnNorm,
                  Need::IfPostNorms, n));
  l.push_back(vec("ffn_norm.weight", "pre_feedforward_layernorm.weight", embd_vec, Slot::FfnNorm, Need::Required, n));
  l.push_back(vec("post_ffw_norm.weight", "post_feedforward_layernorm.weight", embd_vec, Slot::PostFfnNorm,
                  Need::IfPostNorms, n));
  l.push_back(mat("ffn_gate.weight", "mlp.gate_proj.weight", ff_mat, Slot::Gate));
  l.push_back(mat("ffn_up.weight", "mlp.up_proj.weight", ff_mat, Slot::Up));
  l.push_back(mat("ffn_down.weight", "mlp.down_proj.weight", down_mat, Slot::Down));
  return l;
}

ArchInfo entry(Arch arch, const char* gguf, const char* model_type, std::vector<HfClass> classes) {
  ArchInfo a;
  a.arch = arch;
  a.gguf_name = gguf;
  a.hf_model_type = model_type;
  a.hf_classes = std::move(classes);
  return a;
}

double decimal(float f) { return std::stod(fmt::format("{}", f)); }

std::vector<std::string> hf_layer_types(const ModelConfig& c) {
  std::vector<std::string> types;
  for (int il = 0; il < c.n_layer; ++il) types.push_back(c.is_swa[il] ? "sliding_attention" : "full_attention");
  return types;
}

bool any_sliding_layer(const ModelConfig& c) {
  return std::any_of(c.is_swa.begin(), c.is_swa.end(), [](bool b) { return b; });
}

int hf_size(const nlohmann::json& j, const char* key, int def, int64_t min, int64_t max, const std::string& path) {
  const double v = hf_float(j, key, def);
  PAGELLM_CHECK(v >= static_cast<double>(min) && v <= static_cast<double>(max) && v == std::floor(v),
                "'{}': invalid {} {}", path, key, v);
  return static_cast<int>(v);
}

double hf_partial_rotary(const nlohmann::json& j, double def, const std::string& path) {
  double f = def;
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object())
    f = hf_float(j["rope_parameters"], "partial_rotary_factor", f);
  f = hf_float(j, "partial_rotary_factor", f);
  PAGELLM_CHECK(f > 0 && f <= 1, "'{}': invalid partial_rotary_factor {}", path, f);
  return f;
}

void read_hf_deepseek_moe(const nlohmann::json& j, ModelConfig& c, const std::string& path, DeepseekMoeDefaults def) {
  PAGELLM_CHECK(c.moe(), "'{}': n_routed_experts is missing", path);
  c.n_dense_lead = hf_size(j, "first_k_dense_replace", def.first_dense, 0, c.n_layer, path);
  const int shared = hf_size(j, "n_shared_experts", def.shared, 0, 64, path);
  c.n_ff_shexp = shared * c.n_ff_exp;
  c.expert_weights_scale = static_cast<float>(hf_float(j, "routed_scaling_factor", def.scale));
}

void read_hf_sigmoid_router(const nlohmann::json& j, ModelConfig& c, const std::string& path, int n_group,
                            int topk_group) {
  c.expert_scoring = RouterScoring::Sigmoid;
  c.expert_choice_bias = true;
  c.expert_group_score = GroupScore::Top2Sum;
  c.expert_groups = hf_size(j, "n_group", n_group, 1, c.n_expert, path);
  c.expert_groups_used = hf_size(j, "topk_group", topk_group, 1, c.expert_groups, path);
}

void write_hf_deepseek_moe(const ModelConfig& c, nlohmann::ordered_json& j) {
  PAGELLM_CHECK(c.moe(), "cannot write config.json: the family's layers after the leading dense ones have experts");
  PAGELLM_CHECK(c.n_ff_shexp % c.n_ff_exp == 0, "cannot write config.json: shared experts of {} units are no whole "
                "number of experts of {}", c.n_ff_shexp, c.n_ff_exp);
  for (const char* key : {"num_experts", "shared_expert_intermediate_size", "decoder_sparse_step", "mlp_only_layers"})
    j.erase(key);
  j["n_routed_experts"] = c.n_expert;
  j["num_experts_per_tok"] = c.n_expert_used;
  j["moe_intermediate_size"] = c.n_ff_exp;
  j["n_shared_experts"] = c.n_ff_shexp / c.n_ff_exp;
  j["first_k_dense_replace"] = c.n_dense_lead;
  j["routed_scaling_factor"] = decimal(c.expert_weights_scale);
  j["norm_topk_prob"] = c.expert_norm_topk;
  j["n_group"] = c.expert_groups;
  j["topk_group"] = c.expert_groups_used;
}

void read_gguf_deepseek_moe(const GGUFFile& f, ModelConfig& c, RouterScoring default_scoring) {
  const std::string a = f.get_string("general.architecture") + ".";
  PAGELLM_CHECK(c.moe(), "'{}': {}expert_count is missing", f.path(), a);
  c.n_dense_lead = gguf_size(f, a + "leading_dense_block_count", 0, 0, c.n_layer);
  // The shared experts' size: stated, else expert_shared_count experts' worth.
  if (c.n_ff_shexp == 0)
    c.n_ff_shexp = gguf_size(f, a + "expert_shared_count", 0, 0, 64) * c.n_ff_exp;
  c.expert_weights_scale = static_cast<float>(f.get_float(a + "expert_weights_scale", 1.0));
  // llama.cpp's llama_expert_gating_func_type: 0 none (the family's own), 1 softmax, 2 sigmoid.
  const int64_t gating = gguf_size(f, a + "expert_gating_func", 0, 0, 4);
  PAGELLM_CHECK(gating <= 2, "'{}': {}expert_gating_func {} is not supported (softmax and sigmoid are)", f.path(), a,
                gating);
  c.expert_scoring = gating == 0 ? default_scoring : gating == 1 ? RouterScoring::Softmax : RouterScoring::Sigmoid;
  c.expert_groups = gguf_size(f, a + "expert_group_count", 1, 1, c.n_expert);
  c.expert_groups_used = gguf_size(f, a + "expert_group_used_count", c.expert_groups, 1, c.expert_groups);
  c.expert_group_score = GroupScore::Top2Sum;
  c.expert_choice_bias = c.n_dense_lead < c.n_layer &&
                         f.find_tensor("blk." + std::to_string(c.n_dense_lead) + ".exp_probs_b.bias") != nullptr;
}

void dummy_yarn_x4(ModelConfig& c) {
  c.rope.freq_scale = 0.25f;
  c.rope.ext_factor = 1.0f;
  c.rope.n_ctx_orig = 128;
}

void write_hf_gemma(const ModelConfig& c, nlohmann::ordered_json& j, bool local_rope_base) {
  j["hidden_activation"] = "gelu_pytorch_tanh";
  // Attention scale is query_pre_attn_scalar^-0.5 (an integer in configs).
  const long scalar = std::lround(1.0 / (static_cast<double>(c.attn_scale) * c.attn_scale));
  PAGELLM_CHECK(scalar > 0 && 1.0f / std::sqrt(static_cast<float>(scalar)) == c.attn_scale,
                "cannot write config.json: attention scale {} is not 1/sqrt(integer)", c.attn_scale);
  j["query_pre_attn_scalar"] = scalar;
  j["sliding_window"] = c.sliding_window;
  j["layer_types"] = hf_layer_types(c);
  if (local_rope_base) j["rope_local_base_freq"] = decimal(c.rope_swa.freq_base);
  j["final_logit_softcapping"] = c.final_softcap > 0 ? nlohmann::ordered_json(decimal(c.final_softcap)) : nullptr;
  j["attn_logit_softcapping"] = c.attn_softcap > 0 ? nlohmann::ordered_json(decimal(c.attn_softcap)) : nullptr;
}

}  // namespace pagellm::family
