// matmul(): quantize the activations once, then hand out runs of 8-row
// groups to the pool's threads; the weights stream once per chunk of tokens
// (one chunk for decode), every loaded weight block serving a register tile
// of tokens.
#include "backend/cpu/matmul.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "backend/cpu/kernels_neon.h"
#include "backend/cpu/matmul_kernels.h"
#include "backend/cpu/matmul_repack.h"
#include "backend/cpu/quants.h"
#include "backend/cpu/quants_kernels.h"
#include "core/aligned_buffer.h"
#include "core/error.h"

namespace pagellm::cpu {
namespace {

// The interleaved (repacked) kernels exist on x86-64 only; elsewhere every
// quantized weight runs the row path (matmul_unpacked).
bool packed_kernels(Isa isa) {
#if defined(PAGELLM_CPU_X86)
  return isa >= Isa::Avx2;
#else
  (void)isa;
  return false;
#endif
}

// F16 and BF16 weights run the AVX-512 panel kernels at this level (F16:
// AVX-512F + F16C; BF16: vdpbf16ps, where the CPU has AVX512-BF16).
bool float_panels(Isa isa, DType type) {
#if defined(PAGELLM_CPU_X86)
  if (isa < Isa::Avx512 || isa > Isa::Avx512Vnni) return false;
  if (type == DType::F16) return true;
  return type == DType::BF16 && cpu_features().avx512bf16;
#else
  (void)isa;
  (void)type;
  return false;
#endif
}

// Calls fn(begin, end) over [0, n) on up to `threads` threads of its own.
// Load time only: the backend's pool may be running a step on another thread.
void split_over_threads(int64_t n, int threads, size_t bytes, const std::function<void(int64_t, int64_t)>& fn) {
  constexpr size_t kMinBytesPerThread = size_t{4} << 20;  // below this a thread costs more than it saves
  const int64_t most = std::max<int64_t>(1, std::min<int64_t>(threads, n));
  const int64_t nth = std::clamp<int64_t>(static_cast<int64_t>(bytes / kMinBytesPerThread), 1, most);
  if (nth <= 1) return fn(0, n);
  std::vector<std::thread> helpers;
  for (int i = 1; i < nth; ++i) {
    int64_t b = 0, e = 0;
    split_range(n, i, static_cast<int>(nth), 1, b, e);
    helpers.emplace_back(fn, b, e);
  }
  int64_t b = 0, e = 0;
  split_range(n, 0, static_cast<int>(nth), 1, b, e);
  fn(b, e);
  for (auto& t : helpers) t.join();
}

class PreparedWeight final : public MatmulWeight {
 public:
  PreparedWeight(DType type, int64_t rows, int64_t cols, const void* data, const PrepareOptions& o) {
    type_ = type;
    rows_ = rows;
    cols_ = cols;
    data_ = data;
    if (!o.repack) return;
    // The interleaved layout only pays off with the SIMD kernels; the scalar
    // path reads the original rows.
    const size_t block_bytes = interleaved_block_bytes(type);
    if (block_bytes > 0 && packed_kernels(kernel_isa())) {
      group_bytes_ = block_bytes * static_cast<size_t>(cols / dtype_block_size(type));
      packed_bytes_ = group_bytes_ * static_cast<size_t>(groups());
      packed_ = allocate_aligned(packed_bytes_);
      split_over_threads(groups(), o.threads, packed_bytes_, [&](int64_t g0, int64_t g1) {
        for (int64_t g = g0; g < g1; ++g)
          repack_group_x8(type, data, rows, cols, g, packed_.get() + g * group_bytes_);
      });
    }
#if defined(PAGELLM_CPU_X86)
    if (float_panels(kernel_isa(), type)) {
      panel_bytes_ = avx512::float_panel_bytes(type, cols);
      packed_bytes_ = panel_bytes_ * static_cast<size_t>(panels());
      packed_ = allocate_aligned(packed_bytes_);
      split_over_threads(panels(), o.threads, packed_bytes_, [&](int64_t p0, int64_t p1) {
        for (int64_t p = p0; p < p1; ++p)
          avx512::pack_float_panel(type, data, rows, cols, p, packed_.get() + p * panel_bytes_);
      });
    }
#endif
  }

  const uint8_t* packed() const { return packed_.get(); }
  size_t group_bytes() const { return group_bytes_; }
  int64_t groups() const { return (rows_ + kGroupRows - 1) / kGroupRows; }
  // F16 / BF16 weights packed for the AVX-512 panel kernels (packed() then
  // holds [panels][panel_bytes]), or 0.
  size_t panel_bytes() const { return panel_bytes_; }
  int64_t panels() const;

 private:
  AlignedBuffer packed_;  // [groups][nb] interleaved blocks, [panels] float panels, or null
  size_t group_bytes_ = 0;
  size_t panel_bytes_ = 0;
};

#if defined(PAGELLM_CPU_X86)
int64_t PreparedWeight::panels() const { return (rows_ + avx512::kFloatPanelRows - 1) / avx512::kFloatPanelRows; }
#else
int64_t PreparedWeight::panels() const { return 0; }
#endif

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

#if defined(PAGELLM_CPU_X86)
// Weight levels are stored unsigned; this is the zero point the kernels take
// out as zero_point * sum(activations). The VNNI kernels make signed levels
// (Q8_0's, and IQ4_NL's and MXFP4's table values) unsigned by adding 128.
int zero_point(DType type, bool vnni) {
  switch (type) {
    case DType::Q4_0: return 8;
    case DType::Q5_0: return 16;
    case DType::Q8_0:
    case DType::IQ4_NL:
    case DType::MXFP4: return vnni ? 128 : 0;
    default: return 0;
  }
}

// Row groups per call of the AVX-512 VNNI kernels for this type at this
// level; 0: the AVX2 kernels run it.
int vnni_groups(Isa isa, DType type) { return isa >= Isa::Avx512Vnni ? avx512::gemm_group_count(type) : 0; }

size_t side_bytes_per_block(DType act) {
  switch (act) {
    case DType::Q8_0: return sizeof(ActSideQ8_0);
    case DType::Q8_1: return sizeof(ActSideQ8_1);
    default: return sizeof(ActSideQ8_K);
  }
}

#endif  // PAGELLM_CPU_X86

size_t round_up64(size_t n) { return (n + 63) / 64 * 64; }
// How far ahead of the row being multiplied the row path prefetches weights.
constexpr size_t kPrefetchBytes = 4096;

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

#if defined(PAGELLM_CPU_X86)
// F16 / BF16 panels: activations packed in token tiles (rounded to bf16 for
// BF16), in chunks of tiles that stay in L2 while the panels pass; work
// items are (chunk, panel).
void matmul_panels(ThreadPool& pool, const PreparedWeight& w, const float* x, int64_t n, float* y) {
  const int64_t rows = w.rows(), cols = w.cols(), panels = w.panels();
  constexpr int64_t kT = avx512::kFloatTileTokens;
  const int64_t units = avx512::float_act_units(w.type(), cols), tiles = (n + kT - 1) / kT;
  auto* acts = reinterpret_cast<uint32_t*>(t_scratch.get(static_cast<size_t>(n * units) * sizeof(uint32_t)));
  auto pack = [&](int64_t j0, int64_t j1) { avx512::pack_float_acts(w.type(), x, cols, n, j0, j1, acts); };
  if (tiles > 1 && n * cols >= kParallelQuantizeMin) pool.parallel_for(tiles, pack);
  else pack(0, tiles);
  // Chunks of at most ~2 x kChunkBytes (Zen 4's L2 is 1 MiB), of equal size:
  // each chunk streams every panel once, so a short last chunk would cost a
  // whole extra pass over the weights.
  const int64_t tile_bytes = kT * units * static_cast<int64_t>(sizeof(uint32_t));
  const int64_t max_tiles = std::max<int64_t>(1, static_cast<int64_t>(2 * kChunkBytes) / tile_bytes);
  const int64_t chunks = (tiles + max_tiles - 1) / max_tiles;
  const int64_t chunk = kT * ((tiles + chunks - 1) / chunks);
  pool.parallel_for(chunks * panels, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t0 = (i / panels) * chunk, nt = std::min(chunk, n - t0), p = i % panels;
      if (nt <= 0) continue;
      const int64_t r0 = p * avx512::kFloatPanelRows;
      const int nrows = static_cast<int>(std::min<int64_t>(avx512::kFloatPanelRows, rows - r0));
      avx512::gemm_float_panel(w.type(), w.packed() + p * w.panel_bytes(), cols, acts + t0 * units, nt,
                               y + t0 * rows + r0, rows, nrows);
    }
  });
}
#endif

void matmul_float(ThreadPool& pool, const PreparedWeight& w, const float* x, int64_t n, float* y) {
  const int64_t rows = w.rows(), cols = w.cols();
#if defined(PAGELLM_CPU_X86)
  // Weights prepared at another level keep their rows: the AVX2 tiles below.
  if (w.panel_bytes() > 0 && float_panels(kernel_isa(), w.type())) return matmul_panels(pool, w, x, n, y);
  if (kernel_isa() >= Isa::Avx2) {
    pool.parallel_for(rows, [&](int64_t r0, int64_t r1) { avx2::gemm_float(w.type(), w.data(), r0, r1, cols, x, n, y, rows); });
    return;
  }
#endif
  const auto* base = static_cast<const uint8_t*>(w.data());
  const size_t row_bytes = w.row_bytes();
  pool.parallel_for(rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t t = 0; t < n; ++t) y[t * rows + r] = scalar::vec_dot(w.type(), cols, base + r * row_bytes, x + t * cols);
  });
}

}  // namespace

bool matmul_supported(DType type) { return vec_dot_supported(type); }

std::unique_ptr<MatmulWeight> prepare_matmul_weight(DType type, int64_t rows, int64_t cols, const void* data,
                                                    const PrepareOptions& options) {
  PAGELLM_CHECK(matmul_supported(type), "matmul: no kernel for weight type {}", dtype_name(type));
  PAGELLM_CHECK(rows > 0 && cols > 0, "matmul: bad weight shape [{}, {}]", rows, cols);
  const int act_block = dtype_block_size(vec_dot_type(type));
  PAGELLM_CHECK(cols % dtype_block_size(type) == 0 && cols % act_block == 0,
                "matmul: {} weight with {} columns: not a multiple of its block size {}", dtype_name(type), cols,
                std::max(dtype_block_size(type), act_block));
  PAGELLM_CHECK(data != nullptr, "matmul: null weight data");
  return std::make_unique<PreparedWeight>(type, rows, cols, data, options);
}

void matmul_float_many(ThreadPool& pool, const MatmulProblem* problems, size_t count) {
  int64_t total = 0;
  for (size_t i = 0; i < count; ++i) {
    PAGELLM_CHECK(!dtype_is_quantized(problems[i].w->type()), "matmul_float_many: a {} weight",
                  dtype_name(problems[i].w->type()));
    total += problems[i].w->rows();
  }
  if (total == 0) return;
  pool.parallel_for(total, [&](int64_t b, int64_t e) {
    int64_t first = 0;  // global index of problem i's row 0
    for (size_t i = 0; i < count && first < e; first += problems[i].w->rows(), ++i) {
      const MatmulProblem& p = problems[i];
      const int64_t rows = p.w->rows(), cols = p.w->cols();
      const int64_t r0 = std::max<int64_t>(b - first, 0), r1 = std::min<int64_t>(e - first, rows);
      if (r0 >= r1 || p.n == 0) continue;
#if defined(PAGELLM_CPU_X86)
      if (kernel_isa() >= Isa::Avx2) {
        avx2::gemm_float(p.w->type(), p.w->data(), r0, r1, cols, p.x, p.n, p.y, rows);
        continue;
      }
#endif
      const auto* base = static_cast<const uint8_t*>(p.w->data());
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t t = 0; t < p.n; ++t)
          p.y[t * rows + r] = scalar::vec_dot(p.w->type(), cols, base + r * p.w->row_bytes(), p.x + t * cols);
    }
  });
}

void matmul(ThreadPool& pool, const MatmulWeight& weight, const float* x, int64_t n, float* y) {
  const MatmulProblem p{&weight, x, n, y};
  matmul_many(pool, &p, 1);
}

namespace {

#if defined(PAGELLM_CPU_X86)
// One problem of matmul_many, with its activations quantized and its share
// of the work items.
struct Plan {
  const PreparedWeight* w = nullptr;
  const float* x = nullptr;
  float* y = nullptr;
  int64_t n = 0;
  DType act = DType::F32;
  size_t block_stride = 0, side_stride = 0;
  uint8_t* scratch = nullptr;  // [n][block_stride] blocks, then [n][side_stride] extras
  uint8_t* tiles = nullptr;    // whole tiles of 8 tokens (ActRows::tiles), or null
  size_t tile_stride = 0;
  int64_t chunk = 0, run = 0, runs = 0, items = 0, first_item = 0;
  int vnni_groups = 0;  // row groups per avx512::gemm_groups call (0: the AVX2 kernels)
};

// A thread's own run of work items (matmul_many, one token chunk); others
// take from it once theirs is done.
struct alignas(64) Segment {
  std::atomic<int64_t> next{0};
  int64_t end = 0;
};

// Token t's quantized blocks and side values into lane t % 8 of its tile.
void copy_to_tile(const Plan& p, int64_t t, const uint8_t* blocks, const uint8_t* side) {
  const int64_t nb = p.w->cols() / dtype_block_size(p.act);
  const size_t block_bytes = p.act == DType::Q8_1 ? sizeof(BlockQ8_1) : sizeof(BlockQ8_0);
  const size_t qs_at = p.act == DType::Q8_1 ? offsetof(BlockQ8_1, qs) : offsetof(BlockQ8_0, qs);
  const int lane = static_cast<int>(t % kActTileTokens);
  uint8_t* tile = p.tiles + static_cast<size_t>(t / kActTileTokens) * p.tile_stride;
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* dst = tile + b * kActTileBlockBytes;
    const uint8_t* qs = blocks + b * block_bytes + qs_at;
    for (int i = 0; i < 8; ++i) std::memcpy(dst + i * 32 + lane * 4, qs + 4 * i, 4);
    std::memcpy(dst + 256 + lane * 8, side + b * 8, 8);
  }
}

void quantize_plan(const Plan& p, int64_t t0, int64_t t1) {
  const int64_t cols = p.w->cols();
  const int offset = zero_point(p.w->type(), p.vnni_groups > 0);
  uint8_t* side = p.scratch + static_cast<size_t>(p.n) * p.block_stride;
  const int64_t tiled = p.tiles ? p.n / kActTileTokens * kActTileTokens : 0;
  for (int64_t t = t0; t < t1; ++t) {
    uint8_t* row = p.scratch + t * p.block_stride;
    avx2::quantize_act_row(p.act, offset, p.x + t * cols, cols, row, side + t * p.side_stride);
    if (t < tiled) copy_to_tile(p, t, row, side + t * p.side_stride);
  }
}

void run_item(const Plan& p, int64_t item) {
  const PreparedWeight& w = *p.w;
  const int64_t rows = w.rows(), groups = w.groups();
  const int64_t nb = w.cols() / dtype_block_size(w.type());
  const ActRows a{p.scratch, p.block_stride, p.scratch + static_cast<size_t>(p.n) * p.block_stride, p.side_stride,
                  p.tiles, p.tile_stride};
  const int64_t t0 = (item / p.runs) * p.chunk, nt = std::min(p.chunk, p.n - t0);
  const int64_t g0 = (item % p.runs) * p.run, g1 = std::min(groups, g0 + p.run);
  int64_t g = g0;
  // One-token chunks (decode, bound by memory) stream one group at a time:
  // the two-group kernel's two weight streams measured slower there. Types
  // without a VNNI decode kernel take the AVX2 loop at the end.
  if (p.vnni_groups > 0 && nt == 1 && avx512::has_gemv_x8(w.type())) {
    for (; g < g1; ++g) {
      const int nrows = static_cast<int>(std::min<int64_t>(kGroupRows, rows - g * kGroupRows));
      avx512::gemv_x8(w.type(), w.packed() + g * w.group_bytes(), nb, a, t0, p.y + t0 * rows + g * kGroupRows, nrows);
    }
    return;
  }
  // Runs start at multiples of the call's groups; a run's last groups take
  // the two-group kernel, an odd last group the AVX2 one (the same bits).
  if (nt > 1) {
    for (int k = p.vnni_groups; k >= 2; k /= 2) {
      for (; g + k <= g1; g += k) {
        const int nrows = static_cast<int>(std::min<int64_t>(k * kGroupRows, rows - g * kGroupRows));
        avx512::gemm_groups(w.type(), w.packed() + g * w.group_bytes(), w.group_bytes(), k, nb, a, t0, nt,
                            p.y + t0 * rows + g * kGroupRows, rows, nrows);
      }
    }
  }
  for (; g < g1; ++g) {
    const int nrows = static_cast<int>(std::min<int64_t>(kGroupRows, rows - g * kGroupRows));
    avx2::gemm_x8(w.type(), w.packed() + g * w.group_bytes(), nb, a, t0, nt, p.y + t0 * rows + g * kGroupRows, rows,
                  nrows);
  }
}

#endif  // PAGELLM_CPU_X86

// The unpacked paths (float weights, scalar kernels, aarch64): one problem at a time.
void matmul_unpacked(ThreadPool& pool, const PreparedWeight& w, const float* x, int64_t n, float* y) {
  const DType type = w.type();
  if (!dtype_is_quantized(type)) return matmul_float(pool, w, x, n, y);
  const int64_t rows = w.rows(), cols = w.cols();
  const Isa isa = kernel_isa();
  const VecDotFn dot = vec_dot_kernel(isa, type);
  const DType act = vec_dot_type(type);
  const size_t block_stride = round_up64(dtype_row_bytes(act, cols));
  uint8_t* scratch = t_scratch.get(static_cast<size_t>(n) * block_stride);
  auto quantize_tokens = [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) quantize_row(act, x + t * cols, scratch + t * block_stride, cols);
  };
  if (n > 1 && n * cols >= kParallelQuantizeMin) pool.parallel_for(n, quantize_tokens);
  else quantize_tokens(0, n);
  const auto* base = static_cast<const uint8_t*>(w.data());
  const size_t row_bytes = w.row_bytes();
  const uint8_t* end = base + static_cast<size_t>(rows) * row_bytes;
#if defined(PAGELLM_CPU_ARM)
  // i8mm: rows in pairs times tokens in pairs (2x2 tiles, the bits of the row dots).
  if (n > 1 && isa >= Isa::NeonI8mm && neon_i8mm::has_gemm_2x2(type)) {
    pool.parallel_for((rows + 1) / 2, [&](int64_t p0, int64_t p1) {
      for (int64_t r = 2 * p0; r < std::min(rows, 2 * p1); r += 2) {
        const uint8_t* w0 = base + r * row_bytes;
        if (r + 1 == rows) {
          for (int64_t t = 0; t < n; ++t) y[t * rows + r] = dot(type, cols, w0, scratch + t * block_stride);
          continue;
        }
        const uint8_t* w1 = w0 + row_bytes;
        int64_t t = 0;
        for (; t + 2 <= n; t += 2) {
          float out[4];
          neon_i8mm::gemm_2x2(type, cols, w0, w1, scratch + t * block_stride, scratch + (t + 1) * block_stride, out);
          y[t * rows + r] = out[0];
          y[(t + 1) * rows + r] = out[1];
          y[t * rows + r + 1] = out[2];
          y[(t + 1) * rows + r + 1] = out[3];
        }
        for (; t < n; ++t) {
          y[t * rows + r] = dot(type, cols, w0, scratch + t * block_stride);
          y[t * rows + r + 1] = dot(type, cols, w1, scratch + t * block_stride);
        }
      }
    });
    return;
  }
#endif
  pool.parallel_for(rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* wr = base + r * row_bytes;
      // The weight stream, prefetched kPrefetchBytes ahead as the interleaved
      // kernels do: decode reads every row once, and the hardware
      // prefetcher alone leaves the row kernels waiting on DRAM.
      for (const uint8_t* p = wr + kPrefetchBytes; p < wr + kPrefetchBytes + row_bytes && p < end; p += 64)
        __builtin_prefetch(p);
      for (int64_t t = 0; t < n; ++t) {
        const uint8_t* at = scratch + t * block_stride;
        y[t * rows + r] = dot(type, cols, wr, at);
      }
    }
  });
}

}  // namespace

void matmul_many(ThreadPool& pool, const MatmulProblem* problems, size_t count) {
#if !defined(PAGELLM_CPU_X86)
  // No packed kernels here: every problem runs the row path, one by one.
  for (size_t i = 0; i < count; ++i) {
    const MatmulProblem& pr = problems[i];
    const PreparedWeight& w = prepared(*pr.w);
    PAGELLM_CHECK(pr.n >= 0, "matmul: negative token count {}", pr.n);
    if (pr.n > 0) matmul_unpacked(pool, w, pr.x, pr.n, pr.y);
  }
#else
  // Problems the packed kernels run share one parallel region; the rest go one by one.
  thread_local std::vector<Plan> t_plans;  // reused: no allocation per product after warm-up
  std::vector<Plan>& plans = t_plans;
  plans.clear();
  size_t scratch_bytes = 0;
  int64_t total_values = 0;
  const Isa isa = kernel_isa();
  for (size_t i = 0; i < count; ++i) {
    const MatmulProblem& pr = problems[i];
    const PreparedWeight& w = prepared(*pr.w);
    PAGELLM_CHECK(pr.n >= 0, "matmul: negative token count {}", pr.n);
    if (pr.n == 0) continue;
    const bool packed = packed_kernels(isa) && w.packed() != nullptr && dtype_is_quantized(w.type());
    if (!packed) {
      matmul_unpacked(pool, w, pr.x, pr.n, pr.y);
      continue;
    }
    Plan p;
    p.w = &w;
    p.x = pr.x;
    p.y = pr.y;
    p.n = pr.n;
    p.act = vec_dot_type(w.type());
    p.vnni_groups = vnni_groups(isa, w.type());
    const int64_t act_blocks = w.cols() / dtype_block_size(p.act);
    p.block_stride = round_up64(dtype_row_bytes(p.act, w.cols()));
    p.side_stride = round_up64(static_cast<size_t>(act_blocks) * side_bytes_per_block(p.act));
    scratch_bytes += static_cast<size_t>(p.n) * (p.block_stride + p.side_stride);
    if (p.vnni_groups > 0 && p.n >= kActTileTokens && avx512::gemm_reads_act_tiles(w.type())) {
      p.tile_stride = static_cast<size_t>(act_blocks) * kActTileBlockBytes;
      scratch_bytes += static_cast<size_t>(p.n / kActTileTokens) * p.tile_stride;
    }
    total_values += p.n * w.cols();
    plans.push_back(p);
  }
  if (plans.empty()) return;
  uint8_t* scratch = t_scratch.get(scratch_bytes);
  for (Plan& p : plans) {
    p.scratch = scratch;
    scratch += static_cast<size_t>(p.n) * (p.block_stride + p.side_stride);
    if (p.tile_stride > 0) {
      p.tiles = scratch;
      scratch += static_cast<size_t>(p.n / kActTileTokens) * p.tile_stride;
    }
  }
  // Quantize every problem's activations first, in parallel over all their
  // tokens when there are many (plans[i].first_item holds the first token here).
  int64_t total_tokens = 0;
  for (Plan& p : plans) {
    p.first_item = total_tokens;
    total_tokens += p.n;
  }
  if (total_tokens > 1 && total_values >= kParallelQuantizeMin) {
    pool.parallel_for(total_tokens, [&](int64_t b, int64_t e) {
      size_t pi = 0;
      while (plans[pi].first_item + plans[pi].n <= b) ++pi;
      for (int64_t t = b; t < e;) {
        const Plan& p = plans[pi];
        const int64_t t1 = std::min(e, p.first_item + p.n);
        quantize_plan(p, t - p.first_item, t1 - p.first_item);
        t = t1;
        ++pi;
      }
    });
  } else {
    for (const Plan& p : plans) quantize_plan(p, 0, p.n);
  }

  // Work items: (problem, token chunk, run of row groups), handed out in
  // order from a shared counter, so a thread that the OS preempts does not
  // hold up the others (this machine is shared), and threads working at the
  // same time share the token chunk's activations in L3.
  int64_t total_groups = 0;
  for (const Plan& p : plans) total_groups += p.w->groups();
  int64_t items = 0;
  for (Plan& p : plans) {
    const int64_t groups = p.w->groups();
    // Chunks of equal size in whole tiles of the widest kernels (8 tokens): a
    // short last chunk would stream the weights again for few tokens.
    const int64_t max_chunk = std::max<int64_t>(1, static_cast<int64_t>(kChunkBytes / (p.block_stride + p.side_stride)));
    const int64_t chunks = (p.n + max_chunk - 1) / max_chunk;
    constexpr int64_t kTile = kActTileTokens;
    p.chunk = std::max<int64_t>(kTile, ((p.n + chunks - 1) / chunks + kTile - 1) / kTile * kTile);
    p.run = std::max<int64_t>(1, static_cast<int64_t>(kRunBytes / p.w->group_bytes()));
    p.run = std::min(p.run, std::max<int64_t>(1, total_groups / (4 * pool.size())));  // enough items to balance
    if (p.vnni_groups > 0) p.run = (p.run + p.vnni_groups - 1) / p.vnni_groups * p.vnni_groups;  // whole calls
    p.runs = (groups + p.run - 1) / p.run;
    p.items = ((p.n + p.chunk - 1) / p.chunk) * p.runs;
    p.first_item = items;
    items += p.items;
  }
  bool one_chunk = true;
  for (const Plan& p : plans) one_chunk = one_chunk && p.n <= p.chunk;
  if (!one_chunk) {
    std::atomic<int64_t> next{0};
    pool.run_dynamic([&](int, int) {
      size_t pi = 0;
      for (int64_t item = next.fetch_add(1, std::memory_order_relaxed); item < items;
           item = next.fetch_add(1, std::memory_order_relaxed)) {
        while (item >= plans[pi].first_item + plans[pi].items) ++pi;  // items only grow
        run_item(plans[pi], item - plans[pi].first_item);
      }
    });
    return;
  }
  // One token chunk (decode, bound by memory): thread i owns the i-th
  // contiguous segment of the items and takes them in order, so its weight
  // reads form one long stream that the prefetches (running ahead past the
  // item's end) and the hardware prefetcher follow. A thread that finishes
  // its segment takes items from the others' (the shared machine may preempt
  // one). Handing out items from one shared counter made each thread's
  // stream jump every run, restarting the prefetch cold each time.
  const int nth = pool.size();
  thread_local std::vector<Segment> t_segments;
  std::vector<Segment>& segs = t_segments;
  if (static_cast<int>(segs.size()) < nth) segs = std::vector<Segment>(static_cast<size_t>(nth));
  for (int i = 0; i < nth; ++i) {
    segs[i].next.store(items * i / nth, std::memory_order_relaxed);
    segs[i].end = items * (i + 1) / nth;
  }
  pool.run_dynamic([&](int ith, int) {
    for (int k = 0; k < nth; ++k) {
      Segment& sg = segs[(ith + k) % nth];
      size_t pi = 0;
      for (int64_t item = sg.next.fetch_add(1, std::memory_order_relaxed); item < sg.end;
           item = sg.next.fetch_add(1, std::memory_order_relaxed)) {
        while (item >= plans[pi].first_item + plans[pi].items) ++pi;
        run_item(plans[pi], item - plans[pi].first_item);
      }
    }
  });
#endif  // PAGELLM_CPU_X86
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
