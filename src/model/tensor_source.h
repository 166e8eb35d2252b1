// Where a model's weights come from, by GGUF tensor name ("blk.3.attn_q.weight").
// GGUF files map directly; Hugging Face safetensors folders are renamed (and
// Gemma norm weights shifted by one, as GGUF conversion does) so that one
// forward pass serves both.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/model_config.h"

namespace pagellm {

class GGUFFile;

class TensorSource {
 public:
  virtual ~TensorSource() = default;
  // Tensor by GGUF name, or nullptr when absent.
  virtual const TensorData* find(const std::string& name) const = 0;
  virtual size_t count() const = 0;
};

// Experts that fuse gate and up rows ([cols, 2 * ff, n_expert]: each
// expert's gate rows, then its up rows): every expert's first (gate) or
// second (up) half, copied in its type into `owned`. Throws Error naming
// `what` when the shape is not that.
TensorData fused_experts_half(const TensorData& fused, bool second, std::vector<uint8_t>& owned,
                              const std::string& what);

std::unique_ptr<TensorSource> gguf_tensor_source(const GGUFFile& file);
// A folder with config.json and model.safetensors or model.safetensors.index.json.
std::unique_ptr<TensorSource> hf_tensor_source(const std::string& dir, const ModelConfig& cfg);

}  // namespace pagellm
