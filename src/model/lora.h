// LoRA adapters on a loaded model: the adapter files (PEFT folders and
// llama.cpp's GGUF LoRA files) read into host matrices, and the device slots
// a forward pass reads them from. A pass adds, for each token row x of a
// targeted projection W, scale * B (A x) of its sequence's adapter, grouped
// by adapter (Backend::matmul_experts: each slot's A and B stream once for
// all its rows), so one step mixes sequences of several adapters and of the
// base model without merging weights.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace pagellm {

class Model;

// The projections an adapter may target: the attention's q/k/v/o and a
// dense FFN's gate/up/down (a layer's experts are not targets); QGate is the
// output-gate half of a gated q_proj (Qwen3.5: [q | gate] per head).
enum class LoraTarget : uint8_t { Q, K, V, O, Gate, Up, Down, QGate };
inline constexpr int kLoraTargets = 8;
const char* lora_target_name(LoraTarget t);  // PEFT's module name: "q_proj", ...

// One adapter in host memory, F32.
struct LoraAdapter {
  std::string path;
  int32_t rank = 0;
  float alpha = 0;
  float scale = 0;  // alpha / rank, or alpha / sqrt(rank) with rsLoRA
  // Per layer and target: A [rank, in] and B [out, rank] (row-major), B
  // multiplied by scale; both empty where the adapter leaves the projection.
  struct Pair {
    std::vector<float> a, b;
  };
  std::vector<std::array<Pair, kLoraTargets>> layers;
  std::vector<std::string> target_modules;  // as the adapter names them (for reports)
  size_t bytes() const;
};

// Reads a PEFT folder (adapter_config.json + adapter_model.safetensors) or a
// GGUF LoRA file (general.type "adapter", as llama.cpp's
// convert_lora_to_gguf.py writes it) for `model`: every tensor must name a
// target of one of its layers with the base weight's shape, and the rank be at
// most max_rank. Llama's Q/K rows are brought to the base model's layout.
// Throws Error naming the file and what does not fit.
LoraAdapter read_lora_adapter(const std::string& path, const Model& model, int32_t max_rank);

// What one pass reads: per layer and target, the A and B weights of every
// slot (index = slot; slot 0 is the base model's, all zeros), and each
// token row's slot. Null in LayerPass when no row of the pass has an adapter.
struct LoraPass {
  struct Layer {
    std::array<std::vector<const Weight*>, kLoraTargets> a, b;  // empty: the layer has no such target
  };
  std::vector<Layer> layers;
  int32_t rank = 0;
  const Buffer* row_slots = nullptr;  // I32 [n_tokens]
};

// The device side: max_loras slots of rank max_rank (each adapter's rank
// padded with zeros), uploaded on the backend next to the model's weights,
// as F32, F16 or BF16 (half the bytes a step streams per adapter).
class LoraSlots {
 public:
  // shapes[il][t]: the targeted weight's (rows, cols), or (0, 0) where layer
  // il has no such projection.
  using Shapes = std::vector<std::array<std::pair<int64_t, int64_t>, kLoraTargets>>;
  LoraSlots(Backend& backend, Shapes shapes, int32_t max_loras, int32_t max_rank, DType dtype);
  DType dtype() const { return dtype_; }
  int32_t max_loras() const { return max_loras_; }
  int32_t max_rank() const { return rank_; }
  // Slot 1..max_loras takes the adapter's matrices (null: zeros).
  void set(int32_t slot, const LoraAdapter* adapter);
  const LoraPass& pass() const { return pass_; }
  void set_row_slots(const Buffer* ids) { pass_.row_slots = ids; }
  size_t bytes() const { return bytes_; }  // backend memory of all slots
  int64_t max_out() const;                 // the most rows of any target (the pass's scratch width)

 private:
  void upload(int32_t slot, int il, int t, const std::vector<float>& a, const std::vector<float>& b);

  Backend& backend_;
  Shapes shapes_;
  int32_t max_loras_, rank_;
  DType dtype_;
  // [slot][il][t]: host matrices in dtype_ (the backend may borrow them) and their weights.
  struct Held {
    std::vector<uint8_t> a, b;
    std::unique_ptr<Weight> wa, wb;
  };
  std::vector<std::vector<std::array<Held, kLoraTargets>>> held_;
  LoraPass pass_;
  size_t bytes_ = 0;
};

}  // namespace pagellm
