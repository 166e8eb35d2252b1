// Matrix products of float activations with (quantized) weight matrices, the
// hot loop of every forward pass. y[n, rows] = x[n, cols] * W^T, where W is
// [rows = output features, cols = input features], one row per output.
//
// Weights may be repacked at preparation into a layout that streams well.
// Activations are quantized on the fly to 8 bits per block (Q8_0 / Q8_1 / Q8_K,
// matching the weight type) and multiplied with integer dot products; F16 /
// BF16 / F32 weights use float FMAs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/dtype.h"
#include "core/thread_pool.h"

namespace pagellm::cpu {

class MatmulWeight {
 public:
  virtual ~MatmulWeight() = default;
  DType type() const { return type_; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  // The original (GGUF-layout) row-major data, as passed to prepare.
  const void* data() const { return data_; }
  size_t row_bytes() const { return dtype_row_bytes(type_, cols_); }
  // Bytes of the repacked copy this weight owns (0: the kernels read data()).
  size_t packed_bytes() const { return packed_bytes_; }

 protected:
  DType type_ = DType::F32;
  int64_t rows_ = 0, cols_ = 0;
  const void* data_ = nullptr;
  size_t packed_bytes_ = 0;
};

struct PrepareOptions {
  // Build the SIMD kernels' layout (row-interleaved blocks, F16 / BF16
  // panels): a second copy of the weight. Off, every product reads the
  // file's rows: less memory and a faster load, slower prompts.
  bool repack = true;
  // Threads that build the copy (a 2 GB F16 model took ~3 s on one).
  int threads = 1;
};

// `data` is borrowed (usually the mmap of the model file) and must outlive the
// weight; a repacked copy, if any, is owned by the returned object. Throws
// Error for types without a kernel.
std::unique_ptr<MatmulWeight> prepare_matmul_weight(DType type, int64_t rows, int64_t cols, const void* data,
                                                    const PrepareOptions& options = {});
bool matmul_supported(DType type);

// y[n, w.rows()] = x[n, w.cols()] * W^T, split over the pool's threads. No
// allocation after warm-up (scratch grows once and is reused).
void matmul(ThreadPool& pool, const MatmulWeight& w, const float* x, int64_t n, float* y);

// Several independent products in one parallel region (a step's routed
// experts): one wake-up of the pool instead of one per product.
struct MatmulProblem {
  const MatmulWeight* w = nullptr;
  const float* x = nullptr;  // [n, w->cols()]
  int64_t n = 0;
  float* y = nullptr;        // [n, w->rows()]
};
void matmul_many(ThreadPool& pool, const MatmulProblem* problems, size_t count);
// Small products of float weights (F32, F16, BF16; the LoRA adapters' A and
// B) in ONE parallel region over all their rows, each row's dot products in
// the weights' row order (no panels, no packing): many tiny products cost one
// fork instead of one each.
void matmul_float_many(ThreadPool& pool, const MatmulProblem* problems, size_t count);

// Reference: dequantize_row_ref + double-precision dot products, one thread.
void matmul_ref(const MatmulWeight& w, const float* x, int64_t n, float* y);

}  // namespace pagellm::cpu
