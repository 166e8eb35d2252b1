// The pieces family files share: tensor shapes, table-entry builders, the
// Llama- and Gemma-style layer tables, and config.json helpers for writers.
// A family that fits the shared blocks is a few lines of these.
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "model/arch.h"

namespace pagellm {
class GGUFFile;
}

namespace pagellm::family {

// Shapes in ne order ([cols, rows]) from the config.
Dims embd_vec(const ModelConfig& c);
Dims head_vec(const ModelConfig& c);
Dims vocab_mat(const ModelConfig& c);
Dims q_mat(const ModelConfig& c);
Dims kv_mat(const ModelConfig& c);
Dims o_mat(const ModelConfig& c);
Dims q_vec(const ModelConfig& c);
Dims kv_vec(const ModelConfig& c);
Dims ff_mat(const ModelConfig& c);
Dims down_mat(const ModelConfig& c);
Dims router_mat(const ModelConfig& c);
Dims ff_exps(const ModelConfig& c);
Dims down_exps(const ModelConfig& c);

// Qwen-MoE's shared expert (gate_proj / up_proj / down_proj) and its sigmoid
// gate, present when the config has one.
void add_shared_expert(std::vector<TensorSpec>& l);

// DeepSeek-style experts (DeepSeek V2 / V3, GLM-4.5): a dense FFN in the
// leading first_k_dense_replace layers, then a router (with V3's choice bias,
// e_score_correction_bias), routed experts one matrix each, and plain shared
// experts ("mlp.shared_experts", no gate).
void add_deepseek_ffn(std::vector<TensorSpec>& l);

// A vector (norm weight, bias) and a weight matrix, loaded into one slot.
TensorSpec vec(const char* g, const char* h, Dims (*shape)(const ModelConfig&), Slot s, Need need = Need::Required,
               Transform tr = Transform::None);
TensorSpec mat(const char* g, const char* h, Dims (*shape)(const ModelConfig&), Slot s, Need need = Need::Required,
               Transform tr = Transform::None);
// One matrix per expert (required with experts), and one bias vector per expert.
TensorSpec experts(const char* g, const char* h, Dims (*shape)(const ModelConfig&), Slot s,
                   Transform tr = Transform::None);
TensorSpec expert_biases(const char* g, const char* h, Dims (*shape)(const ModelConfig&), Slot s,
                         Transform tr = Transform::None);

// token_embd, output_norm (with `norm`'s transform), output (absent: tied),
// and RoPE factors (GGUF only; HF configs state them, the HF source serves
// them under these names).
std::vector<TensorSpec> globals(Transform norm);
// The attention block of a Llama-style layer: a norm, q/k/v/o, q/k/v biases.
std::vector<TensorSpec> llama_attention(Transform qk);
// A Llama-style layer (Llama, Qwen 2 / 3): one norm before attention, one
// before the FFN, optional q/k norms; the FFN dense, or with moe_hf
// ("block_sparse_moe": Mixtral's names; "mlp": Qwen-MoE's, with a shared
// expert) a router and experts when the config has experts.
std::vector<TensorSpec> llama_layer(Transform qk, bool qk_norm, const char* moe_hf = nullptr);
// A Gemma-style layer: norms before and after both attention and FFN, all
// stored as (w - 1) in HF checkpoints.
std::vector<TensorSpec> gemma_layer(bool qk_norm);

ArchInfo entry(Arch arch, const char* gguf, const char* model_type, std::vector<HfClass> classes);

// config.json writers: a float as the shortest decimal that reads back to
// it ("1e-06", not 9.999999974752427e-07), as a person would write it.
double decimal(float f);
// layer_types: "sliding_attention" / "full_attention" per layer.
std::vector<std::string> hf_layer_types(const ModelConfig& c);
bool any_sliding_layer(const ModelConfig& c);
// Dummy shapes' YaRN x4 over an original context of 128: with 32 pairs, some
// keep their frequency, some are interpolated, some sit on the ramp between.
void dummy_yarn_x4(ModelConfig& c);

// An integer config.json field in [min, max], `def` when absent or null.
int hf_size(const nlohmann::json& j, const char* key, int def, int64_t min, int64_t max, const std::string& path);
// partial_rotary_factor, top level or in rope_parameters (the top level
// wins), `def` when neither states it; in (0, 1].
double hf_partial_rotary(const nlohmann::json& j, double def, const std::string& path);

// DeepSeek-style MoE fields of a config.json: first_k_dense_replace dense
// layers, n_shared_experts shared experts of moe_intermediate_size units
// each, routed_scaling_factor; `def` holds the class's defaults.
struct DeepseekMoeDefaults {
  int first_dense, shared;
  double scale;
};
void read_hf_deepseek_moe(const nlohmann::json& j, ModelConfig& c, const std::string& path, DeepseekMoeDefaults def);
// DeepSeek V3's router (topk_method noaux_tc, GLM-4.5's too): sigmoid
// scores, a choice bias, the experts of the topk_group best of n_group groups.
void read_hf_sigmoid_router(const nlohmann::json& j, ModelConfig& c, const std::string& path, int n_group,
                            int topk_group);
// Both, as DeepseekV3Config / Glm4MoeConfig name them (replacing the
// Qwen-MoE keys the shared writer put there).
void write_hf_deepseek_moe(const ModelConfig& c, nlohmann::ordered_json& j);
// llama.cpp's keys for the same: leading_dense_block_count,
// expert_shared_count, expert_weights_scale, expert_gating_func,
// expert_group_count / expert_group_used_count; the choice bias when the
// first MoE layer has exp_probs_b. `default_scoring`: when no gating function is stated.
void read_gguf_deepseek_moe(const GGUFFile& f, ModelConfig& c, RouterScoring default_scoring);

// Gemma 2 / 3's fields: activation, query_pre_attn_scalar, sliding layers,
// softcaps (and Gemma 3's rope_local_base_freq when local_rope_base).
void write_hf_gemma(const ModelConfig& c, nlohmann::ordered_json& j, bool local_rope_base);

}  // namespace pagellm::family
