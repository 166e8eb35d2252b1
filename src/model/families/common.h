// The pieces family files share: tensor shapes, table-entry builders, the
// Llama- and Gemma-style layer tables, and config.json helpers for writers.
// A family that fits the shared blocks is a few lines of these.
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "model/arch.h"

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

// Gemma 2 / 3's fields: activation, query_pre_attn_scalar, sliding layers,
// softcaps (and Gemma 3's rope_local_base_freq when local_rope_base).
void write_hf_gemma(const ModelConfig& c, nlohmann::ordered_json& j, bool local_rope_base);

}  // namespace pagellm::family
