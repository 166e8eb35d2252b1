// matmul(): quantize the activations once, then hand out runs of 8-row
// groups to the pool's threads; the weights stream once per chunk of tokens
// (one chunk for decode), every loaded weight block serving a register tile
// of tokens.
#include "backend/cpu/matmul.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <vector>

#include "backend/cpu/matmul_kernels.h"
#include "backend/cpu/matmul_repack.h"
#include "backend/cpu/quants.h"
#include "backend/cpu/quants_kernels.h"
#include "core/aligned_buffer.h"
#include "core/error.h"

namespace pagellm::cpu {
namespace {

class PreparedWeight final : public MatmulWeight {
 public:
  PreparedWeight(DType type, int64_t rows, int64_t cols, const void* data) {
    type_ = type;
    rows_ = rows;
    cols_ = cols;
    data_ = data;
    // The interleaved layout only pays off with the SIMD kernels; the scalar
    // path reads the original rows.
    const size_t block_bytes = interleaved_block_bytes(type);
    if (block_bytes > 0 && kernel_isa() >= Isa::Avx2) {
      group_bytes_ = block_bytes * static_cast<size_t>(cols / dtype_block_size(type));
      packed_ = allocate_aligned(group_bytes_ * static_cast<size_t>(groups()));
      for (int64_t g = 0; g < groups(); ++g) repack_group_x8(type, data, rows, cols, g, packed_.get() + g * group_bytes_);
    }
  }

  const uint8_t* packed() const { return packed_.get(); }
  size_t group_bytes() const { return group_bytes_; }
  int64_t groups() const { return (rows_ + kGroupRows - 1) / kGroupRows; }

 private:
  AlignedBuffer packed_;  // [groups][nb] interleaved blocks, or null
  size_t group_bytes_ = 0;
};

// Per-thread buffer for the quantized activations; grows, never shrinks.
class Scratch {
 public:
  uint8_t* get(size_t n) {
    if (n > size_) {
      buf_ = allocate_aligned(n);
      size_ = n;
    }
    return buf_.get();
  }

 private:
  AlignedBuffer buf_;
  size_t size_ = 0;
};
thread_local Scratch t_scratch;

// Weight levels are stored unsigned; this is the zero point the kernels take
// out as zero_point * sum(activations).
int zero_point(DType type) {
  switch (type) {
    case DType::Q4_0: return 8;
    case DType::Q5_0: return 16;
    default: return 0;
  }
}

size_t side_bytes_per_block(DType act) {
  switch (act) {
    case DType::Q8_0: return sizeof(ActSideQ8_0);
    case DType::Q8_1: return sizeof(ActSideQ8_1);
    default: return sizeof(ActSideQ8_K);
  }
}

size_t round_up64(size_t n) { return (n + 63) / 64 * 64; }

// Activations of a token chunk should stay in L2 while every row group of
// the thread passes over them.
constexpr size_t kChunkBytes = 256 * 1024;
// Weight bytes per work item: long enough runs for the hardware prefetcher.
constexpr size_t kRunBytes = 64 * 1024;
// Below this many activation values, quantizing on one thread is cheaper
// than waking the others.
constexpr int64_t kParallelQuantizeMin = 64 * 1024;

const PreparedWeight& prepared(const MatmulWeight& w) {
  const auto* p = dynamic_cast<const PreparedWeight*>(&w);
  PAGELLM_CHECK(p != nullptr, "matmul: weight was not made by prepare_matmul_weight");
  return *p;
}

void matmul_float(ThreadPool& pool, const PreparedWeight& w, const float* x, int64_t n, float* y) {
  const int64_t rows = w.rows(), cols = w.cols();
  if (kernel_isa() >= Isa::Avx2) {
    pool.parallel_for(rows, [&](int64_t r0, int64_t r1) { avx2::gemm_float(w.type(), w.data(), r0, r1, cols, x, n, y, rows); });
    return;
  }
  const auto* base = static_cast<const uint8_t*>(w.data());
  const size_t row_bytes = w.row_bytes();
  pool.parallel_for(rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t t = 0; t < n; ++t) y[t * rows + r] = scalar::vec_dot(w.type(), cols, base + r * row_bytes, x + t * cols);
  });
}

}  // namespace

bool matmul_supported(DType type) { return vec_dot_supported(type); }

std::unique_ptr<MatmulWeight> prepare_matmul_weight(DType type, int64_t rows, int64_t cols, const void* data) {
  PAGELLM_CHECK(matmul_supported(type), "matmul: no kernel for weight type {}", dtype_name(type));
  PAGELLM_CHECK(rows > 0 && cols > 0, "matmul: bad weight shape [{}, {}]", rows, cols);
  const int act_block = dtype_block_size(vec_dot_type(type));
  PAGELLM_CHECK(cols % dtype_block_size(type) == 0 && cols % act_block == 0,
                "matmul: {} weight with {} columns: not a multiple of its block size {}", dtype_name(type), cols,
                std::max(dtype_block_size(type), act_block));
  PAGELLM_CHECK(data != nullptr, "matmul: null weight data");
  return std::make_unique<PreparedWeight>(type, rows, cols, data);
}

void matmul(ThreadPool& pool, const MatmulWeight& weight, const float* x, int64_t n, float* y) {
  const PreparedWeight& w = prepared(weight);
  PAGELLM_CHECK(n >= 0, "matmul: negative token count {}", n);
  if (n == 0) return;
  const DType type = w.type();
  if (!dtype_is_quantized(type)) return matmul_float(pool, w, x, n, y);

  const int64_t rows = w.rows(), cols = w.cols();
  const bool avx2 = kernel_isa() >= Isa::Avx2;
  const bool packed = avx2 && w.packed() != nullptr;
  const DType act = vec_dot_type(type);
  const int64_t act_blocks = cols / dtype_block_size(act);
  const size_t block_stride = round_up64(dtype_row_bytes(act, cols));
  const size_t side_stride = packed ? round_up64(static_cast<size_t>(act_blocks) * side_bytes_per_block(act)) : 0;

  // [n][block_stride] activation blocks, then [n][side_stride] extras.
  uint8_t* scratch = t_scratch.get(static_cast<size_t>(n) * (block_stride + side_stride));
  uint8_t* side = scratch + static_cast<size_t>(n) * block_stride;
  const ActRows a{scratch, block_stride, side, side_stride};
  const int offset = zero_point(type);
  auto quantize_tokens = [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      uint8_t* blocks = scratch + t * block_stride;
      if (packed) avx2::quantize_act_row(act, offset, x + t * cols, cols, blocks, side + t * side_stride);
      else quantize_row(act, x + t * cols, blocks, cols);
    }
  };
  if (n > 1 && n * cols >= kParallelQuantizeMin) pool.parallel_for(n, quantize_tokens);
  else quantize_tokens(0, n);

  if (!packed) {
    const auto* base = static_cast<const uint8_t*>(w.data());
    const size_t row_bytes = w.row_bytes();
    pool.parallel_for(rows, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const uint8_t* wr = base + r * row_bytes;
        for (int64_t t = 0; t < n; ++t) {
          const uint8_t* at = a.blocks + t * block_stride;
          y[t * rows + r] = avx2 ? avx2::vec_dot(type, cols, wr, at) : scalar::vec_dot(type, cols, wr, at);
        }
      }
    });
    return;
  }

  // Work items: (token chunk, run of row groups), handed out in order from a
  // shared counter, so a thread that the OS preempts does not hold up the
  // others (this machine is shared), and threads working at the same time
  // share the token chunk's activations in L3.
  const int64_t groups = w.groups();
  const int64_t nb = cols / dtype_block_size(type);
  int64_t chunk = static_cast<int64_t>(kChunkBytes / (block_stride + side_stride));
  chunk = std::max<int64_t>(avx2::kTileTokens, chunk / avx2::kTileTokens * avx2::kTileTokens);
  const int64_t token_chunks = (n + chunk - 1) / chunk;
  int64_t run = std::max<int64_t>(1, static_cast<int64_t>(kRunBytes / w.group_bytes()));
  run = std::min(run, std::max<int64_t>(1, groups / (4 * pool.size())));  // enough items to balance
  const int64_t runs = (groups + run - 1) / run;
  std::atomic<int64_t> next{0};
  pool.run_dynamic([&](int, int) {
    for (int64_t item = next.fetch_add(1, std::memory_order_relaxed); item < token_chunks * runs;
         item = next.fetch_add(1, std::memory_order_relaxed)) {
      const int64_t t0 = (item / runs) * chunk, nt = std::min(chunk, n - t0);
      const int64_t g0 = (item % runs) * run, g1 = std::min(groups, g0 + run);
      for (int64_t g = g0; g < g1; ++g) {
        const int nrows = static_cast<int>(std::min<int64_t>(kGroupRows, rows - g * kGroupRows));
        avx2::gemm_x8(type, w.packed() + g * w.group_bytes(), nb, a, t0, nt, y + t0 * rows + g * kGroupRows, rows,
                      nrows);
      }
    }
  });
}

void matmul_ref(const MatmulWeight& w, const float* x, int64_t n, float* y) {
  const int64_t rows = w.rows(), cols = w.cols();
  const auto* base = static_cast<const uint8_t*>(w.data());
  std::vector<float> row(static_cast<size_t>(cols));  // [cols]
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_row_ref(w.type(), base + r * w.row_bytes(), row.data(), cols);
    for (int64_t t = 0; t < n; ++t) {
      const float* xt = x + t * cols;
      double s = 0;
      for (int64_t k = 0; k < cols; ++k) s += static_cast<double>(row[k]) * static_cast<double>(xt[k]);
      y[t * rows + r] = static_cast<float>(s);
    }
  }
}

}  // namespace pagellm::cpu
