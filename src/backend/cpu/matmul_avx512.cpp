// AVX-512 VNNI GEMM kernels over the 8-row interleaved layouts (matmul_repack.h).
//
// One 512-bit vector holds the same quad of two adjacent row groups (lanes
// 0-7: group g, lanes 8-15: group g + 1), so a broadcast activation quad
// feeds 16 rows, and vpdpbusd (unsigned weight levels x signed int8
// activations, 4 products summed into each int32 lane) replaces AVX2's
// maddubs + madd + add. The int32 sums are the AVX2 kernels' exactly, and
// the float steps per block are the same operations in the same order, so
// every output is bit-identical to matmul_avx2.cpp's.
//
// Signed Q8_0 weights become unsigned by flipping the sign bit (w + 128); the
// activation side's offset term (128 * sum of the block's activations, see
// zero_point in matmul.cpp) takes the 128 out again.
// GCC 12 warns about the intentionally undefined source operands inside the
// AVX-512 intrinsics' own headers (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/matmul_kernels.h"
#include "backend/cpu/matmul_repack.h"
#include "backend/cpu/quants_kernels.h"
#include "core/error.h"

namespace pagellm::cpu::avx512 {
namespace {

// The empty asm pins the accumulator in a register at this point (as in
// matmul_avx2.cpp: GCC otherwise re-associates the chains and spills).
inline void dpbusd(__m512i& acc, __m512i u, __m512i s) {
  acc = _mm512_dpbusd_epi32(acc, u, s);
  asm("" : "+v"(acc));
}
inline void add_epi32(__m512i& acc, __m512i x) {
  acc = _mm512_add_epi32(acc, x);
  asm("" : "+v"(acc));
}
inline void fmadd(__m512& acc, __m512 a, __m512 b) {
  acc = _mm512_fmadd_ps(a, b, acc);
  asm("" : "+v"(acc));
}

inline __m512i bcast32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// 32 bytes of group 0 (low half) and 32 of group 1 (high half).
inline __m512i load_pair(const void* g0, const void* g1) {
  const __m256i lo = _mm256_loadu_si256(static_cast<const __m256i*>(g0));
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), _mm256_loadu_si256(static_cast<const __m256i*>(g1)), 1);
}
inline __m256i load_pair128(const void* g0, const void* g1) {
  return _mm256_set_m128i(_mm_loadu_si128(static_cast<const __m128i*>(g1)),
                          _mm_loadu_si128(static_cast<const __m128i*>(g0)));
}

// The 16 rows' fp16 values (8 per group) as floats.
inline __m512 load_halves16(const uint16_t* g0, const uint16_t* g1) { return _mm512_cvtph_ps(load_pair128(g0, g1)); }

// Lanes of int16 pairs (a, b) -> int32 a (Even) or b, zero- or sign-extended.
template <bool Signed>
inline __m512i even16(__m512i v) {
  return Signed ? _mm512_srai_epi32(_mm512_slli_epi32(v, 16), 16) : _mm512_and_si512(v, _mm512_set1_epi32(0xFFFF));
}
template <bool Signed>
inline __m512i odd16(__m512i v) {
  return Signed ? _mm512_srai_epi32(v, 16) : _mm512_srli_epi32(v, 16);
}

// As matmul_avx2.cpp: decode (T == 1) is bound by memory, so fetch both
// groups' blocks a few blocks ahead.
constexpr int64_t kPrefetchBytes = 4096;
template <int T, typename Block>
inline void prefetch_ahead(const Block* w0, const Block* w1, int64_t b) {
  if constexpr (T == 1) {
    constexpr int64_t ahead = (kPrefetchBytes + sizeof(Block) - 1) / sizeof(Block);
    const char* p0 = reinterpret_cast<const char*>(w0 + b + ahead);
    const char* p1 = reinterpret_cast<const char*>(w1 + b + ahead);
    for (size_t off = 0; off < sizeof(Block); off += 64) {
      _mm_prefetch(p0 + off, _MM_HINT_T0);
      _mm_prefetch(p1 + off, _MM_HINT_T0);
    }
  }
}

template <int T, typename ABlock, typename Side>
struct TileActs {
  const ABlock* a[T];
  const Side* s[T];
  TileActs(const ActRows& rows, int64_t t0) {
    for (int t = 0; t < T; ++t) {
      a[t] = reinterpret_cast<const ABlock*>(rows.blocks + (t0 + t) * rows.block_stride);
      s[t] = reinterpret_cast<const Side*>(rows.side + (t0 + t) * rows.side_stride);
    }
  }
};

template <int T>
inline void store_tile(const __m512 (&acc)[T], float* y, int64_t ldy, int nrows) {
  const __mmask16 keep = nrows >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << nrows) - 1);
  for (int t = 0; t < T; ++t) _mm512_mask_storeu_ps(y + t * ldy, keep, acc[t]);
}

template <int T>
inline void zero(__m512i (&v)[T]) {
  for (int t = 0; t < T; ++t) v[t] = _mm512_setzero_si512();
}

// Each kernel: run<T>() computes two row groups (16 rows) x T tokens over all blocks.

// ---- Q4_0 x Q8_0 ------------------------------------------------------------------
// Levels 0..15; the -8 comes out as 8 * (activation sum), the side's c.
struct KernelQ4_0 {
  template <int T>
  __attribute__((noinline)) static void run(const void* w0p, const void* w1p, int64_t nb, const ActRows& rows,
                                            int64_t t0, float* y, int64_t ldy, int nrows) {
    const auto* w0 = static_cast<const BlockQ4_0x8*>(w0p);
    const auto* w1 = static_cast<const BlockQ4_0x8*>(w1p);
    const TileActs<T, BlockQ8_0, ActSideQ8_0> in(rows, t0);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      prefetch_ahead<T>(w0, w1, b);
      __m512i lo_sum[T], hi_sum[T];  // two chains: the dpbusd latency is not the limit
      zero(lo_sum);
      zero(hi_sum);
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        const __m512i q = load_pair(w0[b].qs + 32 * i, w1[b].qs + 32 * i);
        const __m512i lo = _mm512_and_si512(q, m4), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
        for (int t = 0; t < T; ++t) dpbusd(lo_sum[t], lo, bcast32(in.a[t][b].qs + 4 * i));
        for (int t = 0; t < T; ++t) dpbusd(hi_sum[t], hi, bcast32(in.a[t][b].qs + 16 + 4 * i));
      }
      const __m512 dw = load_halves16(w0[b].d, w1[b].d);
      for (int t = 0; t < T; ++t) {
        const __m512i i32 = _mm512_sub_epi32(_mm512_add_epi32(lo_sum[t], hi_sum[t]), _mm512_set1_epi32(in.s[t][b].c));
        fmadd(acc[t], _mm512_cvtepi32_ps(i32), _mm512_mul_ps(dw, _mm512_set1_ps(in.s[t][b].d)));
      }
    }
    store_tile<T>(acc, y, ldy, nrows);
  }
};

// ---- Q8_0 x Q8_0 ------------------------------------------------------------------
struct KernelQ8_0 {
  template <int T>
  __attribute__((noinline)) static void run(const void* w0p, const void* w1p, int64_t nb, const ActRows& rows,
                                            int64_t t0, float* y, int64_t ldy, int nrows) {
    const auto* w0 = static_cast<const BlockQ8_0x8*>(w0p);
    const auto* w1 = static_cast<const BlockQ8_0x8*>(w1p);
    const TileActs<T, BlockQ8_0, ActSideQ8_0> in(rows, t0);
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    __m512 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      prefetch_ahead<T>(w0, w1, b);
      __m512i even[T], odd[T];
      zero(even);
      zero(odd);
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) {
        const __m512i q = _mm512_xor_si512(load_pair(w0[b].qs + 32 * i, w1[b].qs + 32 * i), flip);  // w + 128
        for (int t = 0; t < T; ++t) dpbusd(i % 2 == 0 ? even[t] : odd[t], q, bcast32(in.a[t][b].qs + 4 * i));
      }
      const __m512 dw = load_halves16(w0[b].d, w1[b].d);
      for (int t = 0; t < T; ++t) {
        const __m512i i32 = _mm512_sub_epi32(_mm512_add_epi32(even[t], odd[t]), _mm512_set1_epi32(in.s[t][b].c));
        fmadd(acc[t], _mm512_cvtepi32_ps(i32), _mm512_mul_ps(dw, _mm512_set1_ps(in.s[t][b].d)));
      }
    }
    store_tile<T>(acc, y, ldy, nrows);
  }
};

// ---- Q4_K x Q8_K ------------------------------------------------------------------
// Per pair of sub-blocks (32 elements each: the low and high nibbles of the
// same 8 quads): int32 sums by vpdpbusd, times the rows' 6-bit scales; mins
// against the activation sums of 32, in one madd per pair.
struct KernelQ4K {
  template <int T>
  __attribute__((noinline)) static void run(const void* w0p, const void* w1p, int64_t nb, const ActRows& rows,
                                            int64_t t0, float* y, int64_t ldy, int nrows) {
    const auto* w0 = static_cast<const BlockQ4_Kx8*>(w0p);
    const auto* w1 = static_cast<const BlockQ4_Kx8*>(w1p);
    const TileActs<T, BlockQ8_K, ActSideQ8_K> in(rows, t0);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      prefetch_ahead<T>(w0, w1, b);
      __m512i isum[T];
      zero(isum);
      for (int c = 0; c < 4; ++c) {
        __m512i lo_sum[T], hi_sum[T];
        zero(lo_sum);
        zero(hi_sum);
#pragma GCC unroll 8
        for (int i = 0; i < 8; ++i) {
          const __m512i q = load_pair(w0[b].qs + (c * 8 + i) * 32, w1[b].qs + (c * 8 + i) * 32);
          const __m512i lo = _mm512_and_si512(q, m4), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
          for (int t = 0; t < T; ++t) dpbusd(lo_sum[t], lo, bcast32(in.a[t][b].qs + 64 * c + 4 * i));
          for (int t = 0; t < T; ++t) dpbusd(hi_sum[t], hi, bcast32(in.a[t][b].qs + 64 * c + 32 + 4 * i));
        }
        // Scales of sub-blocks 2c, 2c + 1 as int16 pairs per row.
        const __m512i s = _mm512_cvtepu8_epi16(load_pair128(w0[b].scales + 16 * c, w1[b].scales + 16 * c));
        const __m512i s_lo = even16<false>(s), s_hi = odd16<false>(s);
        for (int t = 0; t < T; ++t) {
          add_epi32(isum[t], _mm512_mullo_epi32(lo_sum[t], s_lo));
          add_epi32(isum[t], _mm512_mullo_epi32(hi_sum[t], s_hi));
        }
      }
      const __m512 dw = load_halves16(w0[b].d, w1[b].d), dmin = load_halves16(w0[b].dmin, w1[b].dmin);
      for (int t = 0; t < T; ++t) {
        const __m512 da = _mm512_set1_ps(in.a[t][b].d);
        fmadd(acc[t], _mm512_cvtepi32_ps(isum[t]), _mm512_mul_ps(dw, da));
        __m512i imin = _mm512_setzero_si512();
        for (int c = 0; c < 4; ++c) {
          const __m512i m = _mm512_cvtepu8_epi16(load_pair128(w0[b].mins + 16 * c, w1[b].mins + 16 * c));
          imin = _mm512_add_epi32(imin, _mm512_madd_epi16(m, bcast32(in.s[t][b].bs32 + 2 * c)));
        }
        acc[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(imin), _mm512_mul_ps(dmin, da), acc[t]);
      }
    }
    store_tile<T>(acc, y, ldy, nrows);
  }
};

// ---- Q6_K x Q8_K ------------------------------------------------------------------
// Levels 0..63 in sub-blocks of 16 (4 quads) with signed 8-bit scales; the
// -32 offset comes out against the activation sums of 16 (Q8_K bsums).
struct KernelQ6K {
  // Part K (0..3) of half h: quad i's levels (as matmul_avx2.cpp's).
  template <int K>
  static __m512i levels(const BlockQ6_Kx8& w0, const BlockQ6_Kx8& w1, int h, int i) {
    const int lq = ((h * 2 + (K & 1)) * 8 + i) * 32, hq = (h * 8 + i) * 32;
    const __m512i l = load_pair(w0.ql + lq, w1.ql + lq);
    const __m512i lo = _mm512_and_si512(K < 2 ? l : _mm512_srli_epi16(l, 4), _mm512_set1_epi8(0x0F));
    const __m512i qh = load_pair(w0.qh + hq, w1.qh + hq);
    __m512i hb = qh;
    if constexpr (2 * K < 4) hb = _mm512_slli_epi16(qh, 4 - 2 * K);
    else if constexpr (2 * K > 4) hb = _mm512_srli_epi16(qh, 2 * K - 4);
    return _mm512_or_si512(lo, _mm512_and_si512(hb, _mm512_set1_epi8(0x30)));
  }

  template <int K, int T>
  static void part(const BlockQ6_Kx8& w0, const BlockQ6_Kx8& w1, const TileActs<T, BlockQ8_K, ActSideQ8_K>& in,
                   int64_t b, int h, __m512i (&isum)[T]) {
    const int pair = 4 * h + K;  // sub-blocks 2 pair (quads 0-3) and 2 pair + 1 (quads 4-7)
    __m512i first[T], second[T];
    zero(first);
    zero(second);
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      const __m512i v = levels<K>(w0, w1, h, i);
      for (int t = 0; t < T; ++t) dpbusd(i < 4 ? first[t] : second[t], v, bcast32(in.a[t][b].qs + 128 * h + 32 * K + 4 * i));
    }
    const __m512i s = _mm512_cvtepi8_epi16(load_pair128(w0.scales + 16 * pair, w1.scales + 16 * pair));
    const __m512i s_first = even16<true>(s), s_second = odd16<true>(s);
    for (int t = 0; t < T; ++t) {
      add_epi32(isum[t], _mm512_mullo_epi32(first[t], s_first));
      add_epi32(isum[t], _mm512_mullo_epi32(second[t], s_second));
      const __m512i corr = _mm512_madd_epi16(s, bcast32(in.a[t][b].bsums + 2 * pair));
      isum[t] = _mm512_sub_epi32(isum[t], _mm512_slli_epi32(corr, 5));
    }
  }

  template <int T>
  __attribute__((noinline)) static void run(const void* w0p, const void* w1p, int64_t nb, const ActRows& rows,
                                            int64_t t0, float* y, int64_t ldy, int nrows) {
    const auto* w0 = static_cast<const BlockQ6_Kx8*>(w0p);
    const auto* w1 = static_cast<const BlockQ6_Kx8*>(w1p);
    const TileActs<T, BlockQ8_K, ActSideQ8_K> in(rows, t0);
    __m512 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      prefetch_ahead<T>(w0, w1, b);
      __m512i isum[T];
      zero(isum);
      for (int h = 0; h < 2; ++h) {
        part<0>(w0[b], w1[b], in, b, h, isum);
        part<1>(w0[b], w1[b], in, b, h, isum);
        part<2>(w0[b], w1[b], in, b, h, isum);
        part<3>(w0[b], w1[b], in, b, h, isum);
      }
      const __m512 dw = load_halves16(w0[b].d, w1[b].d);
      for (int t = 0; t < T; ++t)
        fmadd(acc[t], _mm512_cvtepi32_ps(isum[t]), _mm512_mul_ps(dw, _mm512_set1_ps(in.a[t][b].d)));
    }
    store_tile<T>(acc, y, ldy, nrows);
  }
};

template <typename Kernel, int T>
void run_tiles_of(const void* w0, const void* w1, int64_t nb, const ActRows& a, int64_t t0, int64_t nt, float* y,
                  int64_t ldy, int nrows) {
  int64_t t = 0;
  for (; t + T <= nt; t += T) Kernel::template run<T>(w0, w1, nb, a, t0 + t, y + t * ldy, ldy, nrows);
  if constexpr (T > 1) {
    if (t < nt) run_tiles_of<Kernel, T - 1>(w0, w1, nb, a, t0 + t, nt - t, y + t * ldy, ldy, nrows);
  }
}

}  // namespace

bool has_gemm_x16(DType type) {
  switch (type) {
    case DType::Q4_0:
    case DType::Q8_0:
    case DType::Q4_K:
    case DType::Q6_K: return true;
    default: return false;
  }
}

void gemm_x16(DType type, const void* w0, const void* w1, int64_t nb, const ActRows& a, int64_t t0, int64_t nt,
              float* y, int64_t ldy, int nrows) {
  switch (type) {
    case DType::Q4_0: return run_tiles_of<KernelQ4_0, kTileTokens>(w0, w1, nb, a, t0, nt, y, ldy, nrows);
    case DType::Q8_0: return run_tiles_of<KernelQ8_0, kTileTokens>(w0, w1, nb, a, t0, nt, y, ldy, nrows);
    case DType::Q4_K: return run_tiles_of<KernelQ4K, kTileTokens>(w0, w1, nb, a, t0, nt, y, ldy, nrows);
    case DType::Q6_K: return run_tiles_of<KernelQ6K, kTileTokens>(w0, w1, nb, a, t0, nt, y, ldy, nrows);
    default: fail("gemm_x16: no AVX-512 VNNI kernel for {}", dtype_name(type));
  }
}

}  // namespace pagellm::cpu::avx512
