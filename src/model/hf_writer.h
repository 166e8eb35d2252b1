// Writes a model as a Hugging Face folder (config.json + safetensors), the
// inverse of the HF loading path: tests write dummy models this way and check
// that transformers and we compute the same function from the same folder.
//
// Conventions (what makes the folder load back to the same tensors):
// - Names are HF's (model.layers.N.self_attn.q_proj.weight, ...), shapes are
//   row-major [out, in] (GGUF ne order reversed).
// - Llama Q/K stored as GGUF files store them (permuted for adjacent-pair
//   RoPE, cfg.rope.neox == false) are un-permuted to HF's rotate-half layout,
//   so the folder computes the same function as the GGUF model.
// - Gemma norm weights are written as (w - 1): Gemma's RMSNorm multiplies by
//   (1 + w), and the loader adds the 1 back as GGUF conversion does.
// - Every tensor is stored in one type (F32, F16 or BF16), norms and biases
//   included, as real checkpoints are; F16/BF16 round to nearest even.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "core/dtype.h"
#include "model/dummy.h"
#include "model/model_config.h"
#include "model/tensor_source.h"

namespace pagellm {

class ThreadPool;

struct HFWriteOptions {
  DType dtype = DType::F32;  // F32, F16 or BF16
  int shards = 1;            // > 1: model-0000k-of-0000n.safetensors + model.safetensors.index.json
};

// config.json for cfg (architectures, sizes, RoPE, Gemma 3 sliding layers, ...)
// in the field names Hub checkpoints use (rope_theta, rope_local_base_freq).
// tied: the output matrix is the token embedding (no lm_head.weight).
nlohmann::ordered_json hf_config_json(const ModelConfig& cfg, bool tied, DType dtype);

// Writes every tensor of `src` (by GGUF name, any type we can dequantize)
// that the model uses. Creates `dir`; replaces an earlier config.json and
// safetensors files there. Throws Error for configs HF cannot express.
void write_hf_folder(const std::string& dir, const ModelConfig& cfg, const TensorSource& src,
                     const HFWriteOptions& opts);

// The dummy model of `spec` (as write_dummy_gguf makes it, synthetic
// vocabulary size) as a Hugging Face folder; spec.wtype must be F32, F16 or BF16.
void write_dummy_hf(const std::string& dir, const DummySpec& spec, int shards, ThreadPool& pool);

}  // namespace pagellm
