// AVX-512 GEMM tiles for F16 and BF16 weights over 32-row panels
// (matmul_kernels.h).
//
// BF16: a panel holds [ceil(cols / 2)][32 rows][2] bf16, so one column pair
// of 16 rows is one vector; the activations are rounded to bf16 once per call
// and vdpbf16ps multiplies a row vector by a broadcast activation pair (two
// products summed into each f32 lane). F16: a panel holds [cols][32 rows] f16;
// F16C widens 16 rows to f32 and a 512-bit FMA takes a broadcast activation.
// A tile of up to kFloatTileTokens tokens shares every weight load.
//
// Each f32 lane is one (row, token) sum over the columns in one fixed order,
// whatever the tile, chunk or thread: a token's output never depends on the
// rest of its batch.
// GCC 12 warns about the intentionally undefined source operands inside the
// AVX-512 intrinsics' own headers (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/cpu/matmul_kernels.h"
#include "core/error.h"

namespace pagellm::cpu::avx512 {
namespace {

constexpr int kRows = kFloatPanelRows;

// No register pins here (unlike matmul_avx512.cpp): an asm operand on an
// element of the accumulator arrays sends the whole array to the stack.
inline void dpbf16(__m512& acc, __m512i w, __m512i x) { acc = _mm512_dpbf16_ps(acc, (__m512bh)w, (__m512bh)x); }
inline void fmadd(__m512& acc, __m512 a, __m512 b) { acc = _mm512_fmadd_ps(a, b, acc); }

template <int T>
void store_tile(const __m512 (&acc0)[T], const __m512 (&acc1)[T], float* y, int64_t ldy, int nrows) {
  if (nrows == kRows) {
    for (int t = 0; t < T; ++t) {
      _mm512_storeu_ps(y + t * ldy, acc0[t]);
      _mm512_storeu_ps(y + t * ldy + 16, acc1[t]);
    }
    return;
  }
  const __mmask16 m0 = static_cast<__mmask16>(nrows >= 16 ? 0xffff : (1u << nrows) - 1);
  const __mmask16 m1 = static_cast<__mmask16>(nrows <= 16 ? 0 : (1u << (nrows - 16)) - 1);
  for (int t = 0; t < T; ++t) {
    _mm512_mask_storeu_ps(y + t * ldy, m0, acc0[t]);
    _mm512_mask_storeu_ps(y + t * ldy + 16, m1, acc1[t]);
  }
}

// T tokens (a tile of bf16 pairs, [pairs][T]) times one BF16 panel.
template <int T>
void bf16_tile(const uint16_t* panel, int64_t pairs, const uint32_t* x, float* y, int64_t ldy, int nrows) {
  __m512 acc0[T], acc1[T];
  for (int t = 0; t < T; ++t) acc0[t] = acc1[t] = _mm512_setzero_ps();
  for (int64_t kp = 0; kp < pairs; ++kp) {
    const uint16_t* wp = panel + kp * 2 * kRows;
    // Decode streams the panels once: fetch ahead as the quantized kernels do.
    if constexpr (T == 1) _mm_prefetch(reinterpret_cast<const char*>(wp + 2048), _MM_HINT_T0);
    const __m512i w0 = _mm512_loadu_si512(wp);
    const __m512i w1 = _mm512_loadu_si512(wp + 32);
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      const __m512i xb = _mm512_set1_epi32(static_cast<int32_t>(x[kp * T + t]));
      dpbf16(acc0[t], w0, xb);
      dpbf16(acc1[t], w1, xb);
    }
  }
  store_tile<T>(acc0, acc1, y, ldy, nrows);
}

// T tokens (a tile of f32 values, [cols][T]) times one F16 panel.
template <int T>
void f16_tile(const uint16_t* panel, int64_t cols, const float* x, float* y, int64_t ldy, int nrows) {
  __m512 acc0[T], acc1[T];
  for (int t = 0; t < T; ++t) acc0[t] = acc1[t] = _mm512_setzero_ps();
  for (int64_t k = 0; k < cols; ++k) {
    const uint16_t* wp = panel + k * kRows;
    if constexpr (T == 1) _mm_prefetch(reinterpret_cast<const char*>(wp + 2048), _MM_HINT_T0);
    const __m512 w0 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp)));
    const __m512 w1 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp + 16)));
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      const __m512 xb = _mm512_set1_ps(x[k * T + t]);
      fmadd(acc0[t], w0, xb);
      fmadd(acc1[t], w1, xb);
    }
  }
  store_tile<T>(acc0, acc1, y, ldy, nrows);
}

// Full tiles of kFloatTileTokens, then one tile of the rest; tile j's
// activations start at x + j * kFloatTileTokens * len.
template <template <int> class Tile, typename X>
void run_tiles(const uint16_t* panel, int64_t len, const X* x, int64_t nt, float* y, int64_t ldy, int nrows) {
  constexpr int kT = kFloatTileTokens;
  int64_t t = 0;
  for (; t + kT <= nt; t += kT) Tile<kT>::run(panel, len, x + t * len, y + t * ldy, ldy, nrows);
  const X* xr = x + t * len;
  float* yr = y + t * ldy;
  switch (nt - t) {
    case 0: return;
    case 1: return Tile<1>::run(panel, len, xr, yr, ldy, nrows);
    case 2: return Tile<2>::run(panel, len, xr, yr, ldy, nrows);
    case 3: return Tile<3>::run(panel, len, xr, yr, ldy, nrows);
    case 4: return Tile<4>::run(panel, len, xr, yr, ldy, nrows);
    case 5: return Tile<5>::run(panel, len, xr, yr, ldy, nrows);
    case 6: return Tile<6>::run(panel, len, xr, yr, ldy, nrows);
    case 7: return Tile<7>::run(panel, len, xr, yr, ldy, nrows);
    case 8: return Tile<8>::run(panel, len, xr, yr, ldy, nrows);
    case 9: return Tile<9>::run(panel, len, xr, yr, ldy, nrows);
    case 10: return Tile<10>::run(panel, len, xr, yr, ldy, nrows);
    case 11: return Tile<11>::run(panel, len, xr, yr, ldy, nrows);
    default: fail("float panel: bad tile of {} tokens", nt - t);
  }
}
static_assert(kFloatTileTokens == 12, "run_tiles spells out the remainder tiles 1-11");

template <int T>
struct Bf16Tile {
  static void run(const uint16_t* p, int64_t pairs, const uint32_t* x, float* y, int64_t ldy, int nr) {
    bf16_tile<T>(p, pairs, x, y, ldy, nr);
  }
};
template <int T>
struct F16Tile {
  static void run(const uint16_t* p, int64_t cols, const float* x, float* y, int64_t ldy, int nr) {
    f16_tile<T>(p, cols, x, y, ldy, nr);
  }
};

// One activation row rounded to bf16 (nearest even, one instruction for
// every column, the tail included); an odd last column pairs with a 0.
void row_to_bf16(const float* x, int64_t cols, uint16_t* dst) {
  int64_t k = 0;
  for (; k + 16 <= cols; k += 16) {
    const __m256bh b = _mm512_cvtneps_pbh(_mm512_loadu_ps(x + k));
    std::memcpy(dst + k, &b, sizeof(b));
  }
  if (k < cols) {
    const __mmask16 m = static_cast<__mmask16>((1u << (cols - k)) - 1);
    const __m256bh b = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x + k));
    _mm256_mask_storeu_epi16(dst + k, m, (__m256i)b);
  }
  if (cols % 2 != 0) dst[cols] = 0;
}

}  // namespace

size_t float_panel_bytes(DType type, int64_t cols) {
  switch (type) {
    case DType::BF16: return static_cast<size_t>((cols + 1) / 2) * 2 * kRows * sizeof(uint16_t);
    case DType::F16: return static_cast<size_t>(cols) * kRows * sizeof(uint16_t);
    default: fail("float panel: {} weights have no panel layout", dtype_name(type));
  }
}

void pack_float_panel(DType type, const void* w, int64_t rows, int64_t cols, int64_t panel, uint8_t* dst) {
  const size_t bytes = float_panel_bytes(type, cols);
  std::memset(dst, 0, bytes);  // rows past the end and BF16's odd last column stay 0
  const auto* src = static_cast<const uint16_t*>(w);
  auto* out = reinterpret_cast<uint16_t*>(dst);
  const int64_t r0 = panel * kRows;
  const int nrows = static_cast<int>(std::min<int64_t>(kRows, rows - r0));
  // Columns outer: the writes run in order and the 32 rows' current lines stay in L1
  // (rows outer measured ~3 s more at load for a 1.1B F16 model).
  const uint16_t* rows0 = src + r0 * cols;
  for (int64_t k = 0; k < cols; ++k) {
    uint16_t* o = type == DType::BF16 ? out + (k / 2) * 2 * kRows + (k & 1) : out + k * kRows;
    const int step = type == DType::BF16 ? 2 : 1;
    for (int r = 0; r < nrows; ++r) o[r * step] = rows0[r * cols + k];
  }
}

int64_t float_act_units(DType type, int64_t cols) { return type == DType::BF16 ? (cols + 1) / 2 : cols; }

void pack_float_acts(DType type, const float* x, int64_t cols, int64_t n, int64_t tile0, int64_t tile1, void* dst) {
  constexpr int64_t kT = kFloatTileTokens;
  const int64_t units = float_act_units(type, cols);
  thread_local std::vector<uint16_t> row;  // grows, never shrinks: no allocation per call after warm-up
  if (type == DType::BF16 && row.size() < static_cast<size_t>(cols + 1)) row.resize(static_cast<size_t>(cols + 1));
  for (int64_t tile = tile0; tile < tile1; ++tile) {
    const int64_t t0 = tile * kT, nt = std::min(kT, n - t0);
    for (int64_t t = 0; t < nt; ++t) {
      const float* xr = x + (t0 + t) * cols;
      if (type == DType::BF16) {
        auto* out = static_cast<uint32_t*>(dst) + t0 * units;
        row_to_bf16(xr, cols, row.data());
        for (int64_t kp = 0; kp < units; ++kp) {
          uint32_t pair;
          std::memcpy(&pair, row.data() + 2 * kp, 4);
          out[kp * nt + t] = pair;
        }
      } else {
        float* out = static_cast<float*>(dst) + t0 * units;
        for (int64_t k = 0; k < cols; ++k) out[k * nt + t] = xr[k];
      }
    }
  }
}

void gemm_float_panel(DType type, const uint8_t* panel, int64_t cols, const void* acts, int64_t nt, float* y,
                      int64_t ldy, int nrows) {
  const auto* p = reinterpret_cast<const uint16_t*>(panel);
  switch (type) {
    case DType::BF16:
      return run_tiles<Bf16Tile>(p, (cols + 1) / 2, static_cast<const uint32_t*>(acts), nt, y, ldy, nrows);
    case DType::F16: return run_tiles<F16Tile>(p, cols, static_cast<const float*>(acts), nt, y, ldy, nrows);
    default: fail("float panel: {} weights have no panel kernel", dtype_name(type));
  }
}

}  // namespace pagellm::cpu::avx512
