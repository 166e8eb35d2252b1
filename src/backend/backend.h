// The one seam between the engine and the hardware. Model code describes a
// forward pass as a sequence of these ops; a backend (CPU now, CUDA or a vendor
// accelerator later) implements them over memory it owns. Activation pointers
// passed to ops are backend memory (from alloc()); model code never reads them
// directly, only the logits after copy_to_host().
//
// Per-step metadata (token ids, positions, KV slots, block tables) is handed
// over once with set_batch(), as a device backend would upload it once per step;
// embed, rope, store_kv and attention use it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"

namespace pagellm {

// A host tensor to upload (usually a view into the mmapped model file).
struct TensorData {
  std::string name;
  DType type = DType::F32;
  std::vector<int64_t> shape;  // ne[0] first: shape[0] is the row length
  const void* data = nullptr;
  int64_t cols() const { return shape.empty() ? 1 : shape[0]; }
  int64_t rows() const {
    int64_t r = 1;
    for (size_t k = 1; k < shape.size(); ++k) r *= shape[k];
    return r;
  }
};

// A weight as the backend holds it: a matrix [rows = out features, cols = in
// features] or a vector (rows == 1) such as a norm weight or a bias.
class Weight {
 public:
  virtual ~Weight() = default;
  DType type = DType::F32;
  int64_t rows = 0, cols = 0;
  std::string name;
};

enum class Activation { Silu, GeluTanh };

struct RopeConfig {
  int n_rot = 0;             // leading dims of each head that rotate (== head_dim usually)
  float freq_base = 10000;
  float freq_scale = 1.0f;   // 1 / linear scaling factor
  bool neox = false;         // rotate (i, i + n_rot/2) pairs; else adjacent (2i, 2i+1) pairs
  const Weight* freq_factors = nullptr;  // [n_rot / 2] divisors (Llama 3.1 style), optional
};

struct AttentionConfig {
  int n_head = 0, n_head_kv = 0, head_dim = 0;
  float scale = 1.0f;        // applied to q.k
  int sliding_window = 0;    // > 0: a query at position p sees keys at p - window < j <= p
  float softcap = 0.0f;      // > 0: scores = softcap * tanh(scores / softcap)
};

struct KVCacheSpec {
  int n_layers = 0, n_kv_heads = 0, head_dim = 0;
  int block_size = 16;
  int num_blocks = 0;        // including block 0 (reserved padding block)
  DType dtype = DType::F16;  // F32 or F16
  // Bytes for one block across all layers, K and V (kv/kv_sizing.h's formula).
  size_t bytes_per_block() const;
};

// One sequence's slice of a step's batch. Its tokens are rows
// [q_start, q_start + q_len) of every activation; they sit at positions
// [ctx_len - q_len, ctx_len) and the cache holds ctx_len tokens after store_kv.
struct SeqInfo {
  int32_t q_start = 0, q_len = 0, ctx_len = 0;
  std::vector<int32_t> block_table;  // physical block of each logical block
};

struct BatchInfo {
  std::vector<int32_t> token_ids;     // [n_tokens]
  std::vector<int32_t> positions;     // [n_tokens]
  std::vector<int64_t> slot_mapping;  // [n_tokens] block * block_size + offset
  std::vector<SeqInfo> seqs;
  int64_t n_tokens() const { return static_cast<int64_t>(token_ids.size()); }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual std::string describe() const = 0;  // kernels / threads, for logs

  // Memory. Buffers live until the backend is destroyed or released.
  virtual float* alloc(size_t n_floats) = 0;
  virtual void release(float* p) = 0;
  virtual void copy_to_host(const float* src, float* dst, size_t n) = 0;
  virtual void copy_from_host(const float* src, float* dst, size_t n) = 0;

  // Weights. Vectors (norms, biases) are converted to F32.
  virtual std::unique_ptr<Weight> upload(const TensorData& t) = 0;
  virtual bool supports(DType t) const = 0;

  // KV cache: [num_blocks][n_kv_heads][block_size][head_dim] per layer, K and V.
  virtual void allocate_kv_cache(const KVCacheSpec& cfg) = 0;
  virtual const KVCacheSpec& kv_cache_config() const = 0;
  virtual void copy_blocks(const std::vector<std::pair<int32_t, int32_t>>& src_dst) = 0;
  // Swap-to-host preemption, for accelerators with separate memory.
  virtual bool supports_swap() const { return false; }

  virtual void set_batch(const BatchInfo& batch) = 0;

  // Ops. `n` is a row count; matrices are row-major [n, cols].
  virtual void embed(const Weight& table, float scale, float* out) = 0;  // out[n_tokens, table.cols]
  virtual void matmul(const Weight& w, const float* x, int64_t n, float* y) = 0;  // y[n, w.rows]
  virtual void add_bias(float* y, const Weight& bias, int64_t n) = 0;
  // y[r] = x[r] / rms(x[r]) * w (w may be null); rows of length dim; y may alias x.
  virtual void rms_norm(const float* x, const Weight* w, int64_t n_rows, int64_t dim, float eps, float* y) = 0;
  // In place on x[n_tokens, n_heads * head_dim] at the batch positions.
  virtual void rope(float* x, int n_heads, int head_dim, const RopeConfig& cfg) = 0;
  // Writes k, v [n_tokens, n_kv_heads * head_dim] into the cache at the batch
  // slots. With k_rope, k is rotated (in place) at the batch positions as it
  // is written: one pass instead of a rope op followed by a copy.
  virtual void store_kv(int layer, float* k, const float* v, const RopeConfig* k_rope = nullptr) = 0;
  // Causal paged attention of q [n_tokens, n_head * head_dim] over each
  // sequence's cache -> out [n_tokens, n_head * head_dim].
  virtual void attention(int layer, const float* q, float* out, const AttentionConfig& cfg) = 0;
  // out = act(gate) * up, elementwise over n values.
  virtual void glu(const float* gate, const float* up, int64_t n, Activation act, float* out) = 0;
  virtual void add(float* y, const float* x, int64_t n) = 0;  // y += x
  // out[i] = x[rows[i]] for rows of length dim.
  virtual void gather_rows(const float* x, int64_t dim, const std::vector<int32_t>& rows, float* out) = 0;

  // Optional per-op timing (the --profile breakdown).
  virtual void set_profiling(bool on) { (void)on; }
  virtual std::string profile_report() const { return {}; }
};

struct CpuBackendOptions {
  int threads = 0;           // <= 0: all cores
  // Multiply in float against dequantized weights instead of quantizing
  // activations to 8 bits: slower, but the result is the exact function of
  // the stored weights (8-bit activations add noise that a long greedy
  // continuation can amplify into a different token).
  bool exact_matmul = false;
};

// The CPU backend, the default.
std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& options);
inline std::unique_ptr<Backend> make_cpu_backend(int n_threads) {
  CpuBackendOptions o;
  o.threads = n_threads;
  return make_cpu_backend(o);
}

}  // namespace pagellm
