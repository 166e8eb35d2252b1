// AVX-512 VNNI kernels for one token times one 8-row interleaved group
// (decode): one weight stream, as the AVX2 kernel's, but 512 bits per load.
//
// A 512-bit load takes two consecutive quads of the group (lanes 0-7: quad i
// of rows 0-7, lanes 8-15: quad i + 1), and a permute of the activation
// block puts quad i's 4 bytes in lanes 0-7 and quad i + 1's in lanes 8-15.
// vpdpbusd then sums both quads per row; lanes r and r + 8 are added at the
// end of each block. The int32 sums are the AVX2 kernels' exactly and the
// float steps are theirs, in 256 bits and in the same order, so every output
// is bit-identical to matmul_avx2.cpp's.
//
// Only the types whose decode these kernels made faster have one: Q4_K,
// Q5_K, IQ4_NL, IQ4_XS, MXFP4 (1.05-1.33x, one thread). The blocks of 32
// (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) stream at ~85-90% of the read bandwidth with
// AVX2 already and measured the same (0.9-1.06x across runs); Q6_K and Q2_K
// are bound by unpacking their levels (5-6 operations per quad, the same in
// 512 bits, which this machine's cores run as two 256-bit halves) and
// measured 0.75-0.96x. Those run avx2::gemm_x8 (docs/performance.md §14).
//
// GCC 12 warns about the intentionally undefined source operands inside the
// AVX-512 intrinsics' own headers (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "backend/cpu/matmul_kernels.h"
#include "backend/cpu/matmul_repack.h"
#include "backend/cpu/quants_kernels.h"
#include "core/error.h"

namespace pagellm::cpu::avx512 {
namespace {

inline void dpbusd(__m512i& acc, __m512i u, __m512i s) {
  acc = _mm512_dpbusd_epi32(acc, u, s);
  asm("" : "+v"(acc));
}

inline __m512i load512(const void* p) { return _mm512_loadu_si512(p); }
inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// Lanes r and r + 8 added: the 8 rows' int32 sums.
inline __m256i fold(__m512i v) {
  return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

// The 8 activation quads of 32 bytes in both halves; pair(k) then holds quad
// 2k in lanes 0-7 and quad 2k + 1 in lanes 8-15.
struct ActQuads {
  __m512i v;
  explicit ActQuads(const void* p) : v(_mm512_broadcast_i64x4(load256(p))) {}
  __m512i pair(int k) const {
    const __m512i idx = _mm512_mask_mov_epi32(_mm512_set1_epi32(2 * k), 0xFF00, _mm512_set1_epi32(2 * k + 1));
    return _mm512_permutexvar_epi32(idx, v);
  }
};

inline __m256 load_halves8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

inline void fmadd(__m256& acc, __m256 a, __m256 b) {
  acc = _mm256_fmadd_ps(a, b, acc);
  asm("" : "+x"(acc));
}

inline __m256i bcast32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// Lanes of int16 pairs (a, b) -> int32 a or b (zero-extended).
inline __m512i even16(__m512i v) { return _mm512_and_si512(v, _mm512_set1_epi32(0xFFFF)); }
inline __m512i odd16(__m512i v) { return _mm512_srli_epi32(v, 16); }

// The weight stream fetched ahead, as the AVX2 decode kernels do.
constexpr int64_t kPrefetchBytes = 4096;
template <typename Block>
[[gnu::always_inline]] inline void prefetch_ahead(const Block* w, int64_t b) {
  constexpr int64_t ahead = (kPrefetchBytes + sizeof(Block) - 1) / sizeof(Block);
  const char* p = reinterpret_cast<const char*>(w + b + ahead);
  for (size_t off = 0; off < sizeof(Block); off += 64) _mm_prefetch(p + off, _MM_HINT_T0);
}

// The same, spread over a block's loop: part `part` of `parts` of the block
// ahead. A long block's ~20-27 prefetches at once fill the core's miss
// buffers and stall the loads behind them.
template <typename Block>
[[gnu::always_inline]] inline void prefetch_part(const Block* w, int64_t b, int part, int parts) {
  constexpr int64_t ahead = (kPrefetchBytes + sizeof(Block) - 1) / sizeof(Block);
  constexpr int64_t lines = (sizeof(Block) + 63) / 64;
  const char* p = reinterpret_cast<const char*>(w + b + ahead);
  for (int64_t l = lines * part / parts; l < lines * (part + 1) / parts; ++l) _mm_prefetch(p + 64 * l, _MM_HINT_T0);
}

inline void store8(__m256 acc, float* y, int nrows) {
  if (nrows == kGroupRows) {
    _mm256_storeu_ps(y, acc);
  } else {
    _mm256_mask_storeu_ps(y, static_cast<__mmask8>((1u << nrows) - 1), acc);
  }
}

// ---- Q4_K: 256-bit, one quad of the 8 rows per vector ------------------------------
// The activation quad comes broadcast from memory (vpdpbusd's {1to8} operand)
// instead of a permute per 512-bit pair: Zen 4 runs a 512-bit op as two
// 256-bit halves, so the pairs saved no work and the permutes were extra
// (1.3x from L2). Two accumulators per sub-block halve the dependency chains.
inline void dpbusd256(__m256i& acc, __m256i u, const int8_t* act) {
  acc = _mm256_dpbusd_epi32(acc, u, bcast32(act));
  asm("" : "+x"(acc));
}

void gemv_q4_k(const BlockQ4_Kx8* w, int64_t nb, const BlockQ8_K* a, const ActSideQ8_K* s, float* y, int nrows) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), low16 = _mm256_set1_epi32(0xFFFF);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m256i isum = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      prefetch_part(w, b, c, 4);
      const int8_t* act = a[b].qs + 64 * c;
      const uint8_t* q = w[b].qs + c * 8 * 32;
      __m256i lo[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
      __m256i hi[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) {
        const __m256i v = load256(q + 32 * i);
        dpbusd256(lo[i & 1], _mm256_and_si256(v, m4), act + 4 * i);
        dpbusd256(hi[i & 1], _mm256_and_si256(_mm256_srli_epi16(v, 4), m4), act + 32 + 4 * i);
      }
      // Row r's scales of sub-blocks 2c, 2c + 1 as an int16 pair in lane r.
      const __m256i sc = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w[b].scales + 16 * c)));
      isum = _mm256_add_epi32(isum, _mm256_mullo_epi32(_mm256_add_epi32(lo[0], lo[1]), _mm256_and_si256(sc, low16)));
      isum = _mm256_add_epi32(isum, _mm256_mullo_epi32(_mm256_add_epi32(hi[0], hi[1]), _mm256_srli_epi32(sc, 16)));
    }
    const __m256 dw = load_halves8(w[b].d), dmin = load_halves8(w[b].dmin);
    const __m256 da = _mm256_set1_ps(a[b].d);
    fmadd(acc, _mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, da));
    __m256i imin = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      const __m256i m = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w[b].mins + 16 * c)));
      imin = _mm256_add_epi32(imin, _mm256_madd_epi16(m, bcast32(s[b].bs32 + 2 * c)));
    }
    acc = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(imin), _mm256_mul_ps(dmin, da), acc);
  }
  store8(acc, y, nrows);
}

// 16 signed 4-bit levels plus 128 as unsigned bytes, in every 128-bit lane.
inline __m512i shifted_lut(const int8_t* values) {
  alignas(64) uint8_t u[64];
  for (int k = 0; k < 64; ++k) u[k] = static_cast<uint8_t>(values[k % 16] + 128);
  return _mm512_load_si512(u);
}

// ---- IQ4_NL, MXFP4: LUT levels plus 128, the side's c = 128 * (activation sum) ----
template <bool Mx>
void gemv_lut4(const void* wp, int64_t nb, const BlockQ8_0* a, const ActSideQ8_0* s, float* y, int nrows) {
  using WBlock = std::conditional_t<Mx, BlockMXFP4x8, BlockQ4_0x8>;
  const auto* w = static_cast<const WBlock*>(wp);
  const __m512i lut = shifted_lut(Mx ? kMXFP4Values : kIQ4NLValues), m4 = _mm512_set1_epi8(0x0F);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    prefetch_ahead(w, b);
    const ActQuads act(a[b].qs);
    __m512i lo_sum = _mm512_setzero_si512(), hi_sum = _mm512_setzero_si512();
    for (int k = 0; k < 2; ++k) {
      const __m512i q = load512(w[b].qs + 64 * k);
      dpbusd(lo_sum, _mm512_shuffle_epi8(lut, _mm512_and_si512(q, m4)), act.pair(k));
      dpbusd(hi_sum, _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(q, 4), m4)), act.pair(2 + k));
    }
    __m256 dw;
    if constexpr (Mx) {  // e8m0_to_fp32_half of the exponent bytes, as matmul_avx2.cpp
      const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w[b].e)));
      const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
      const __m256i subnormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
      dw = _mm256_castsi256_ps(_mm256_blendv_epi8(subnormal, normal, _mm256_cmpgt_epi32(e, _mm256_set1_epi32(1))));
    } else {
      dw = load_halves8(w[b].d);
    }
    const __m256i i32 = _mm256_sub_epi32(fold(_mm512_add_epi32(lo_sum, hi_sum)), _mm256_set1_epi32(s[b].c));
    fmadd(acc, _mm256_cvtepi32_ps(i32), _mm256_mul_ps(dw, _mm256_set1_ps(s[b].d)));
  }
  store8(acc, y, nrows);
}

// ---- IQ4_XS: sub-blocks of 32 with signed scales; the 128 against bs32 ------------
void gemv_iq4_xs(const BlockIQ4_XSx8* w, int64_t nb, const BlockQ8_K* a, const ActSideQ8_K* s, float* y, int nrows) {
  const __m512i lut = shifted_lut(kIQ4NLValues), m4 = _mm512_set1_epi8(0x0F);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m512i isum = _mm512_setzero_si512();
    for (int j = 0; j < 8; ++j) {
      prefetch_part(w, b, j, 8);
      const ActQuads act(a[b].qs + 32 * j);
      // The -128 * (sub-block sum) once per row: in lanes 0-7 only.
      __m512i sub = _mm512_maskz_set1_epi32(0x00FF, -128 * s[b].bs32[j]);
      for (int k = 0; k < 2; ++k) {
        const __m512i q = load512(w[b].qs + (j * 4 + 2 * k) * 32);
        dpbusd(sub, _mm512_shuffle_epi8(lut, _mm512_and_si512(q, m4)), act.pair(k));
        dpbusd(sub, _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(q, 4), m4)), act.pair(2 + k));
      }
      const __m512i sc = _mm512_broadcast_i64x4(
          _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w[b].scales + j * kGroupRows))));
      isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(sub, sc));
    }
    fmadd(acc, _mm256_cvtepi32_ps(fold(isum)), _mm256_mul_ps(load_halves8(w[b].d), _mm256_set1_ps(a[b].d)));
  }
  store8(acc, y, nrows);
}

// ---- Q5_K: Q4_K with the fifth bits of sub-blocks 2c, 2c + 1 in bits 2c, 2c + 1
// of the qh quads -------------------------------------------------------------------
void gemv_q5_k(const BlockQ5_Kx8* w, int64_t nb, const BlockQ8_K* a, const ActSideQ8_K* s, float* y, int nrows) {
  const __m512i m4 = _mm512_set1_epi8(0x0F), m10 = _mm512_set1_epi8(0x10);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m512i qh[4];
    for (int k = 0; k < 4; ++k) qh[k] = load512(w[b].qh + 2 * k * 32);
    __m512i isum = _mm512_setzero_si512();
    for (int c = 0; c < 4; ++c) {
      prefetch_part(w, b, c, 4);
      const ActQuads act_lo(a[b].qs + 64 * c), act_hi(a[b].qs + 64 * c + 32);
      __m512i lo_sum = _mm512_setzero_si512(), hi_sum = _mm512_setzero_si512();
      const __m128i up_lo = _mm_cvtsi32_si128(4 - 2 * c), up_hi = _mm_cvtsi32_si128(3 - 2 * c);
      const __m128i down_lo = _mm_cvtsi32_si128(2 * c - 4), down_hi = _mm_cvtsi32_si128(2 * c - 3);
      for (int k = 0; k < 4; ++k) {
        const __m512i q = load512(w[b].qs + (c * 8 + 2 * k) * 32);
        const __m512i h_lo = c < 2 ? _mm512_sll_epi16(qh[k], up_lo) : _mm512_srl_epi16(qh[k], down_lo);
        const __m512i h_hi = c < 2 ? _mm512_sll_epi16(qh[k], up_hi) : _mm512_srl_epi16(qh[k], down_hi);
        const __m512i lo = _mm512_or_si512(_mm512_and_si512(q, m4), _mm512_and_si512(h_lo, m10));
        const __m512i hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(q, 4), m4), _mm512_and_si512(h_hi, m10));
        dpbusd(lo_sum, lo, act_lo.pair(k));
        dpbusd(hi_sum, hi, act_hi.pair(k));
      }
      const __m512i sc = _mm512_broadcast_i64x4(
          _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w[b].scales + 16 * c))));
      isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(lo_sum, even16(sc)));
      isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(hi_sum, odd16(sc)));
    }
    const __m256 dw = load_halves8(w[b].d), dmin = load_halves8(w[b].dmin);
    const __m256 da = _mm256_set1_ps(a[b].d);
    fmadd(acc, _mm256_cvtepi32_ps(fold(isum)), _mm256_mul_ps(dw, da));
    __m256i imin = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      const __m256i m = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w[b].mins + 16 * c)));
      imin = _mm256_add_epi32(imin, _mm256_madd_epi16(m, bcast32(s[b].bs32 + 2 * c)));
    }
    acc = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(imin), _mm256_mul_ps(dmin, da), acc);
  }
  store8(acc, y, nrows);
}

}  // namespace

bool has_gemv_x8(DType type) {
  switch (type) {
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::IQ4_NL:
    case DType::IQ4_XS:
    case DType::MXFP4: return true;
    default: return false;
  }
}

void gemv_x8(DType type, const void* w, int64_t nb, const ActRows& a, int64_t t, float* y, int nrows) {
  const uint8_t* blocks = a.blocks + t * a.block_stride;
  const uint8_t* side = a.side + t * a.side_stride;
  switch (type) {
    case DType::Q4_K:
      return gemv_q4_k(static_cast<const BlockQ4_Kx8*>(w), nb, reinterpret_cast<const BlockQ8_K*>(blocks),
                       reinterpret_cast<const ActSideQ8_K*>(side), y, nrows);
    case DType::IQ4_NL:
      return gemv_lut4<false>(w, nb, reinterpret_cast<const BlockQ8_0*>(blocks), reinterpret_cast<const ActSideQ8_0*>(side),
                              y, nrows);
    case DType::MXFP4:
      return gemv_lut4<true>(w, nb, reinterpret_cast<const BlockQ8_0*>(blocks), reinterpret_cast<const ActSideQ8_0*>(side),
                             y, nrows);
    case DType::IQ4_XS:
      return gemv_iq4_xs(static_cast<const BlockIQ4_XSx8*>(w), nb, reinterpret_cast<const BlockQ8_K*>(blocks),
                         reinterpret_cast<const ActSideQ8_K*>(side), y, nrows);
    case DType::Q5_K:
      return gemv_q5_k(static_cast<const BlockQ5_Kx8*>(w), nb, reinterpret_cast<const BlockQ8_K*>(blocks),
                       reinterpret_cast<const ActSideQ8_K*>(side), y, nrows);
    default: fail("gemv_x8: no AVX-512 VNNI kernel for {}", dtype_name(type));
  }
}

}  // namespace pagellm::cpu::avx512
