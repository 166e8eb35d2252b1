// AVX2 GEMM kernels over the 8-row interleaved layouts (matmul_repack.h).
//
// Register tile: 8 weight rows (the lanes) x T tokens. Per 4-element quad, one
// weight vector is unpacked once and multiplied (maddubs: unsigned weight
// levels x signed int8 activations) with a broadcast activation quad of each
// of the T tokens, summing in int16 while that cannot overflow, then madd to
// int32 (with ones, or with the sub-block scales of the K-quants), and one
// float FMA per block and token. Weight zero points (-8, -16, -32) are taken
// out as offset * (activation sum), in integers.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "backend/cpu/matmul_kernels.h"
#include "backend/cpu/matmul_repack.h"
#include "backend/cpu/quants_avx2_common.h"
#include "backend/cpu/quants_kernels.h"
#include "core/error.h"

namespace pagellm::cpu::avx2 {
namespace {

// p += maddubs(u, s). The empty asm pins p in a register at this point: GCC
// otherwise re-associates the chains into trees of all products at once and
// spills them (halving the speed of the K-quant kernels).
inline void add_maddubs(__m256i& p, __m256i u, __m256i s) {
  p = _mm256_add_epi16(p, _mm256_maddubs_epi16(u, s));
  asm("" : "+x"(p));
}

// Same for int32 sums and float accumulators.
inline void add_epi32(__m256i& acc, __m256i x) {
  acc = _mm256_add_epi32(acc, x);
  asm("" : "+x"(acc));
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

// Signed weights w (int8 lanes) times a broadcast activation quad a, summed
// in int32 pairs: |w| feeds maddubs, a takes w's sign.
inline __m256i signed_dot(__m256i w, __m256i a) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w)), _mm256_set1_epi16(1));
}

// A quad's 32 bytes of nibbles as signed levels from a 16-entry table.
inline void lut_levels(__m256i q, __m256i lut, __m256i& lo, __m256i& hi) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  lo = _mm256_shuffle_epi8(lut, _mm256_and_si256(q, m4));
  hi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(q, 4), m4));
}

inline __m256 load_halves8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Lanes (a, b) of int16 pairs -> (a, a) and (b, b).
inline __m256i dup_even16(__m256i v) {
  return _mm256_shuffle_epi8(v, _mm256_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13, 0, 1, 0, 1, 4, 5,
                                                 4, 5, 8, 9, 8, 9, 12, 13, 12, 13));
}
inline __m256i dup_odd16(__m256i v) {
  return _mm256_shuffle_epi8(v, _mm256_setr_epi8(2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15, 2, 3, 2, 3,
                                                 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15));
}

// Moves bit `from` of every byte to bit `to` (other bits: garbage, mask after).
template <int From, int To>
inline __m256i move_bits(__m256i v) {
  if constexpr (To > From) return _mm256_slli_epi16(v, To - From);
  else if constexpr (To < From) return _mm256_srli_epi16(v, From - To);
  else return v;
}

// Decode (one token) is bound by memory: fetch the weight block a few blocks
// ahead, so the loads overlap the arithmetic (the hardware prefetcher alone
// lags behind on the longer K-quant blocks). The row groups of a work item
// are contiguous, so the prefetch runs on into the next group instead of
// restarting cold at each group's start (a prefetch past the end of the
// buffer is harmless: it never faults). Larger tiles reuse each block enough
// that it does not matter.
constexpr int64_t kPrefetchBytes = 4096;
template <int T, typename Block>
[[gnu::always_inline]] inline void prefetch_ahead(const Block* w, int64_t b) {
  if constexpr (T == 1) {
    constexpr int64_t ahead = (kPrefetchBytes + sizeof(Block) - 1) / sizeof(Block);
    const char* p = reinterpret_cast<const char*>(w + b + ahead);
    for (size_t off = 0; off < sizeof(Block); off += 64) _mm_prefetch(p + off, _MM_HINT_T0);
  }
}

// The same for the long K-quant blocks, spread over the block's loop: part
// `part` of `parts` of the block ahead. All of a block's ~20-27 prefetches at
// once fill the core's miss buffers and stall the loads behind them (Q6_K
// decode ran at 10 GB/s from memory, 30 from L3).
template <int T, typename Block>
[[gnu::always_inline]] inline void prefetch_part(const Block* w, int64_t b, int part, int parts) {
  if constexpr (T == 1) {
    constexpr int64_t ahead = (kPrefetchBytes + sizeof(Block) - 1) / sizeof(Block);
    constexpr int64_t lines = (sizeof(Block) + 63) / 64;
    const char* p = reinterpret_cast<const char*>(w + b + ahead);
    for (int64_t l = lines * part / parts; l < lines * (part + 1) / parts; ++l) _mm_prefetch(p + 64 * l, _MM_HINT_T0);
  }
}

// The per-token pointers of one tile.
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
inline void store_tile(const __m256 (&acc)[T], float* y, int64_t ldy, int nrows) {
  for (int t = 0; t < T; ++t) {
    if (nrows == kGroupRows) {
      _mm256_storeu_ps(y + t * ldy, acc[t]);
    } else {
      alignas(32) float tmp[kGroupRows];
      _mm256_store_ps(tmp, acc[t]);
      std::memcpy(y + t * ldy, tmp, sizeof(float) * static_cast<size_t>(nrows));
    }
  }
}

// Each kernel: run<T>() computes one 8-row group x T tokens over all blocks.
// noinline keeps one compact function per tile size (and lets llvm-mca look
// at each loop on its own).

// ---- Q4_0 x Q8_0 ----------------------------------------------------------------
struct KernelQ4_0 {
  static constexpr int kTile = kTileTokens;
  template <int T>
  __attribute__((noinline)) static void run(const void* wp, int64_t nb, const ActRows& rows, int64_t t0, float* y, int64_t ldy, int nrows) {
    const auto* w = static_cast<const BlockQ4_0x8*>(wp);
    const TileActs<T, BlockQ8_0, ActSideQ8_0> in(rows, t0);
    const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    __m256 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      prefetch_ahead<T>(w, b);
      __m256i p[T];
      for (int t = 0; t < T; ++t) p[t] = _mm256_setzero_si256();
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        const __m256i q = load256(w[b].qs + 32 * i);
        const __m256i lo = _mm256_and_si256(q, m4);
        for (int t = 0; t < T; ++t)
          add_maddubs(p[t], lo, bcast32(in.a[t][b].qs + 4 * i));
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        for (int t = 0; t < T; ++t)
          add_maddubs(p[t], hi, bcast32(in.a[t][b].qs + 16 + 4 * i));
      }
      const __m256 dw = load_halves8(w[b].d);
      for (int t = 0; t < T; ++t) {
        const __m256i i32 = _mm256_sub_epi32(_mm256_madd_epi16(p[t], ones), _mm256_set1_epi32(in.s[t][b].c));
        fmadd(acc[t], _mm256_cvtepi32_ps(i32), _mm256_mul_ps(dw, _mm256_set1_ps(in.s[t][b].d)));
      }
    }
    store_tile<T>(acc, y, ldy, nrows);
  }
};

// ---- Q4_1 x Q8_1 ----------------------------------------------------------------
struct KernelQ4_1 {
  static constexpr int kTile = kTileTokens;
  template <int T>
  __attribute__((noinline)) static void run(const void* wp, int64_t nb, const ActRows& rows, int64_t t0, float* y, int64_t ldy, int nrows) {
    const auto* w = static_cast<const BlockQ4_1x8*>(wp);
    const TileActs<T, BlockQ8_1, ActSideQ8_1> in(rows, t0);
    const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    __m256 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      prefetch_ahead<T>(w, b);
      __m256i p[T];
      for (int t = 0; t < T; ++t) p[t] = _mm256_setzero_si256();
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        const __m256i q = load256(w[b].qs + 32 * i);
        const __m256i lo = _mm256_and_si256(q, m4);
        for (int t = 0; t < T; ++t)
          add_maddubs(p[t], lo, bcast32(in.a[t][b].qs + 4 * i));
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        for (int t = 0; t < T; ++t)
          add_maddubs(p[t], hi, bcast32(in.a[t][b].qs + 16 + 4 * i));
      }
      const __m256 dw = load_halves8(w[b].d), mw = load_halves8(w[b].m);
      for (int t = 0; t < T; ++t) {
        const __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(p[t], ones));
        fmadd(acc[t], f, _mm256_mul_ps(dw, _mm256_set1_ps(in.s[t][b].d)));
        fmadd(acc[t], mw, _mm256_set1_ps(in.s[t][b].s));
      }
    }
    store_tile<T>(acc, y, ldy, nrows);
  }
};

// ---- Q5_0 x Q8_0, Q5_1 x Q8_1 -----------------------------------------------------
// Levels < 32: four maddubs fit in int16 before the madd.
template <bool HasMin>
struct KernelQ5 {
  static constexpr int kTile = kTileTokens;
  template <int J>
  static __m256i fifth_bit(__m256i qh) {
    return _mm256_and_si256(move_bits<J, 4>(qh), _mm256_set1_epi8(0x10));
  }

  template <int T>
  __attribute__((noinline)) static void run(const void* wp, int64_t nb, const ActRows& rows, int64_t t0, float* y, int64_t ldy, int nrows) {
    using WBlock = std::conditional_t<HasMin, BlockQ5_1x8, BlockQ5_0x8>;
    using ABlock = std::conditional_t<HasMin, BlockQ8_1, BlockQ8_0>;
    using Side = std::conditional_t<HasMin, ActSideQ8_1, ActSideQ8_0>;
    const auto* w = static_cast<const WBlock*>(wp);
    const TileActs<T, ABlock, Side> in(rows, t0);
    const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    __m256 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      prefetch_ahead<T>(w, b);
      const __m256i qh = load256(w[b].qh);
      __m256i isum[T];
      for (int half = 0; half < 2; ++half) {  // quads 0-1, then 2-3: 4 maddubs per int16 sum
        __m256i p[T];
        for (int t = 0; t < T; ++t) p[t] = _mm256_setzero_si256();
        for (int k = 0; k < 2; ++k) {
          const int i = 2 * half + k;
          const __m256i q = load256(w[b].qs + 32 * i);
          __m256i hb_lo, hb_hi;
          switch (i) {  // quad j's fifth bits are bit j of each qh byte
            case 0: hb_lo = fifth_bit<0>(qh), hb_hi = fifth_bit<4>(qh); break;
            case 1: hb_lo = fifth_bit<1>(qh), hb_hi = fifth_bit<5>(qh); break;
            case 2: hb_lo = fifth_bit<2>(qh), hb_hi = fifth_bit<6>(qh); break;
            default: hb_lo = fifth_bit<3>(qh), hb_hi = fifth_bit<7>(qh); break;
          }
          const __m256i lo = _mm256_or_si256(_mm256_and_si256(q, m4), hb_lo);
          for (int t = 0; t < T; ++t)
            add_maddubs(p[t], lo, bcast32(in.a[t][b].qs + 4 * i));
          const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), hb_hi);
          for (int t = 0; t < T; ++t)
            add_maddubs(p[t], hi, bcast32(in.a[t][b].qs + 16 + 4 * i));
        }
        for (int t = 0; t < T; ++t) {
          const __m256i v = _mm256_madd_epi16(p[t], ones);
          isum[t] = half == 0 ? v : _mm256_add_epi32(isum[t], v);
        }
      }
      const __m256 dw = load_halves8(w[b].d);
      for (int t = 0; t < T; ++t) {
        if constexpr (HasMin) {
          const __m256 f = _mm256_cvtepi32_ps(isum[t]);
          fmadd(acc[t], f, _mm256_mul_ps(dw, _mm256_set1_ps(in.s[t][b].d)));
          fmadd(acc[t], load_halves8(w[b].m), _mm256_set1_ps(in.s[t][b].s));
        } else {
          const __m256i i32 = _mm256_sub_epi32(isum[t], _mm256_set1_epi32(in.s[t][b].c));
          fmadd(acc[t], _mm256_cvtepi32_ps(i32), _mm256_mul_ps(dw, _mm256_set1_ps(in.s[t][b].d)));
        }
      }
    }
    store_tile<T>(acc, y, ldy, nrows);
  }
};

// ---- Q8_0 x Q8_0 ----------------------------------------------------------------
// Signed x signed: |w| feeds maddubs, the activation takes w's sign.
struct KernelQ8_0 {
  static constexpr int kTile = kTileTokens;
  template <int T>
  __attribute__((noinline)) static void run(const void* wp, int64_t nb, const ActRows& rows, int64_t t0, float* y, int64_t ldy, int nrows) {
    const auto* w = static_cast<const BlockQ8_0x8*>(wp);
    const TileActs<T, BlockQ8_0, ActSideQ8_0> in(rows, t0);
    __m256 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      prefetch_ahead<T>(w, b);
      __m256i isum[T];
      for (int t = 0; t < T; ++t) isum[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) {
        const __m256i q = load256(w[b].qs + 32 * i);
        for (int t = 0; t < T; ++t) add_epi32(isum[t], signed_dot(q, bcast32(in.a[t][b].qs + 4 * i)));
      }
      const __m256 dw = load_halves8(w[b].d);
      for (int t = 0; t < T; ++t)
        fmadd(acc[t], _mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(dw, _mm256_set1_ps(in.s[t][b].d)));
    }
    store_tile<T>(acc, y, ldy, nrows);
  }
};

// ---- IQ4_NL / MXFP4 x Q8_0 ------------------------------------------------------------
// 4-bit indices into 16 signed levels (one pshufb), then Q8_0's sign trick.
// IQ4_NL's levels reach 127, so each maddubs goes to int32 on its own; MXFP4's
// (doubled e2m1, at most 12) sum all 8 quads in int16 first.
template <bool Mx>
struct KernelLut4 {
  static constexpr int kTile = kTileTokens;
  using WBlock = std::conditional_t<Mx, BlockMXFP4x8, BlockQ4_0x8>;

  // The 8 rows' block scales: fp16, or e8m0_to_fp32_half of the exponent bytes.
  static __m256 scales(const WBlock& w) {
    if constexpr (Mx) {
      const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w.e)));
      const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
      const __m256i subnormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
      return _mm256_castsi256_ps(_mm256_blendv_epi8(subnormal, normal, _mm256_cmpgt_epi32(e, _mm256_set1_epi32(1))));
    } else {
      return load_halves8(w.d);
    }
  }

  template <int T>
  __attribute__((noinline)) static void run(const void* wp, int64_t nb, const ActRows& rows, int64_t t0, float* y, int64_t ldy, int nrows) {
    const auto* w = static_cast<const WBlock*>(wp);
    const TileActs<T, BlockQ8_0, ActSideQ8_0> in(rows, t0);
    const __m256i lut = _mm256_broadcastsi128_si256(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(Mx ? kMXFP4Values : kIQ4NLValues)));
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      prefetch_ahead<T>(w, b);
      __m256i isum[T];
      for (int t = 0; t < T; ++t) isum[t] = _mm256_setzero_si256();
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        __m256i wl, wh;
        lut_levels(load256(w[b].qs + 32 * i), lut, wl, wh);
        for (int t = 0; t < T; ++t) {
          const __m256i al = bcast32(in.a[t][b].qs + 4 * i), ah = bcast32(in.a[t][b].qs + 16 + 4 * i);
          if constexpr (Mx) {  // int16 lanes in isum until the madd below
            add_maddubs(isum[t], _mm256_sign_epi8(wl, wl), _mm256_sign_epi8(al, wl));
            add_maddubs(isum[t], _mm256_sign_epi8(wh, wh), _mm256_sign_epi8(ah, wh));
          } else {
            add_epi32(isum[t], signed_dot(wl, al));
            add_epi32(isum[t], signed_dot(wh, ah));
          }
        }
      }
      const __m256 dw = scales(w[b]);
      for (int t = 0; t < T; ++t) {
        // MXFP4: isum held int16 sums (at most 8 x 2 x 12 x 127 per lane); widen now.
        const __m256i s32 = Mx ? _mm256_madd_epi16(isum[t], ones) : isum[t];
        fmadd(acc[t], _mm256_cvtepi32_ps(s32), _mm256_mul_ps(dw, _mm256_set1_ps(in.s[t][b].d)));
      }
    }
    store_tile<T>(acc, y, ldy, nrows);
  }
};

// ---- IQ4_XS x Q8_K -------------------------------------------------------------------
// IQ4_NL's levels in sub-blocks of 32, each with a signed 6-bit scale: the
// sub-block's int32 sums are multiplied by the 8 rows' scales (at most
// 8 x 31 x 258064 in a lane).
struct KernelIQ4XS {
  static constexpr int kTile = kTileTokens;
  template <int T>
  __attribute__((noinline)) static void run(const void* wp, int64_t nb, const ActRows& rows, int64_t t0, float* y, int64_t ldy, int nrows) {
    const auto* w = static_cast<const BlockIQ4_XSx8*>(wp);
    const TileActs<T, BlockQ8_K, ActSideQ8_K> in(rows, t0);
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIQ4NLValues)));
    __m256 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      __m256i isum[T];
      for (int t = 0; t < T; ++t) isum[t] = _mm256_setzero_si256();
      for (int j = 0; j < 8; ++j) {
        prefetch_part<T>(w, b, j, 8);
        __m256i sub[T];
        for (int t = 0; t < T; ++t) sub[t] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) {
          __m256i wl, wh;
          lut_levels(load256(w[b].qs + (j * 4 + i) * 32), lut, wl, wh);
          for (int t = 0; t < T; ++t) {
            const int8_t* a = in.a[t][b].qs + 32 * j + 4 * i;
            add_epi32(sub[t], signed_dot(wl, bcast32(a)));
            add_epi32(sub[t], signed_dot(wh, bcast32(a + 16)));
          }
        }
        const __m256i sc =
            _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w[b].scales + j * kGroupRows)));
        for (int t = 0; t < T; ++t) add_epi32(isum[t], _mm256_mullo_epi32(sub[t], sc));
      }
      const __m256 dw = load_halves8(w[b].d);
      for (int t = 0; t < T; ++t)
        fmadd(acc[t], _mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(dw, _mm256_set1_ps(in.a[t][b].d)));
    }
    store_tile<T>(acc, y, ldy, nrows);
  }
};

// ---- Q2_K x Q8_K --------------------------------------------------------------------
// 2-bit levels: the 8 quads of one shift and half share two sub-blocks of
// 16 (quads 0-3, 4-7), summed in int16 (at most 4 x 2 x 3 x 127), then madd
// with the rows' 4-bit scales; mins against the activation sums of 16.
struct KernelQ2K {
  static constexpr int kTile = kTileTokens;

  static __m256i scale_bytes(const BlockQ2_Kx8& w, int j) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w.scales + j * kGroupRows)));
  }
  // Sub-block j's scale of the 8 rows, in both int16 halves of each row's lane.
  static __m256i scales(const BlockQ2_Kx8& w, int j) {
    const __m256i v = _mm256_and_si256(scale_bytes(w, j), _mm256_set1_epi32(0x0F));
    return _mm256_or_si256(v, _mm256_slli_epi32(v, 16));
  }
  // The mins of sub-blocks j (low int16) and j + 1 (high) of the 8 rows.
  static __m256i min_pairs(const BlockQ2_Kx8& w, int j) {
    return _mm256_or_si256(_mm256_srli_epi32(scale_bytes(w, j), 4),
                           _mm256_slli_epi32(_mm256_srli_epi32(scale_bytes(w, j + 1), 4), 16));
  }

  template <int T>
  __attribute__((noinline)) static void run(const void* wp, int64_t nb, const ActRows& rows, int64_t t0, float* y, int64_t ldy, int nrows) {
    const auto* w = static_cast<const BlockQ2_Kx8*>(wp);
    const TileActs<T, BlockQ8_K, ActSideQ8_K> in(rows, t0);
    const __m256i m2 = _mm256_set1_epi8(0x03);
    __m256 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      __m256i isum[T];
      for (int t = 0; t < T; ++t) isum[t] = _mm256_setzero_si256();
      for (int h = 0; h < 2; ++h)
        for (int k = 0; k < 4; ++k) {
          prefetch_part<T>(w, b, 4 * h + k, 8);
          __m256i p0[T], p1[T];
          for (int t = 0; t < T; ++t) p0[t] = p1[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
          for (int i = 0; i < 8; ++i) {
            const __m256i v = _mm256_and_si256(_mm256_srli_epi16(load256(w[b].qs + (h * 8 + i) * 32), 2 * k), m2);
            for (int t = 0; t < T; ++t)
              add_maddubs(i < 4 ? p0[t] : p1[t], v, bcast32(in.a[t][b].qs + 128 * h + 32 * k + 4 * i));
          }
          const int j = 8 * h + 2 * k;
          const __m256i s0 = scales(w[b], j), s1 = scales(w[b], j + 1);
          for (int t = 0; t < T; ++t) {
            add_epi32(isum[t], _mm256_madd_epi16(p0[t], s0));
            add_epi32(isum[t], _mm256_madd_epi16(p1[t], s1));
          }
        }
      const __m256 dw = load_halves8(w[b].d), dmin = load_halves8(w[b].dmin);
      __m256i mins[8];  // unpacked once for all the tile's tokens
      for (int p = 0; p < 8; ++p) mins[p] = min_pairs(w[b], 2 * p);
      for (int t = 0; t < T; ++t) {
        __m256i imin = _mm256_setzero_si256();
        for (int p = 0; p < 8; ++p)
          imin = _mm256_add_epi32(imin, _mm256_madd_epi16(mins[p], bcast32(in.a[t][b].bsums + 2 * p)));
        const __m256 da = _mm256_set1_ps(in.a[t][b].d);
        fmadd(acc[t], _mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(dw, da));
        acc[t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(imin), _mm256_mul_ps(dmin, da), acc[t]);
      }
    }
    store_tile<T>(acc, y, ldy, nrows);
  }
};

// ---- Q3_K x Q8_K --------------------------------------------------------------------
// Q2_K's structure with a third bit from hmask (levels 0..7, the -4 taken out
// against the activation sums of 16) and signed scales, no mins. int16 sums of
// 4 quads (at most 4 x 2 x 7 x 127), madd with the rows' scales.
struct KernelQ3K {
  static constexpr int kTile = kTileTokens;
  // Sub-block j's scale of the 8 rows, in both int16 halves of each row's lane.
  static __m256i scales(const BlockQ3_Kx8& w, int j) {
    const __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w.scales + j * kGroupRows)));
    return _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(v, 16));
  }
  // The scales of sub-blocks j (low int16) and j + 1 (high) of the 8 rows.
  static __m256i scale_pairs(const BlockQ3_Kx8& w, int j) {
    const __m256i lo = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w.scales + j * kGroupRows)));
    const __m256i hi = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w.scales + (j + 1) * kGroupRows)));
    return _mm256_or_si256(_mm256_and_si256(lo, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(hi, 16));
  }
  // Bit `bit` of every byte moved to bit 2.
  static __m256i third_bit(__m256i hm, int bit) {
    const __m256i v = bit >= 2 ? _mm256_srl_epi16(hm, _mm_cvtsi32_si128(bit - 2)) : _mm256_sll_epi16(hm, _mm_cvtsi32_si128(2 - bit));
    return _mm256_and_si256(v, _mm256_set1_epi8(0x04));
  }

  template <int T>
  __attribute__((noinline)) static void run(const void* wp, int64_t nb, const ActRows& rows, int64_t t0, float* y, int64_t ldy, int nrows) {
    const auto* w = static_cast<const BlockQ3_Kx8*>(wp);
    const TileActs<T, BlockQ8_K, ActSideQ8_K> in(rows, t0);
    const __m256i m2 = _mm256_set1_epi8(0x03);
    __m256 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      __m256i isum[T];
      for (int t = 0; t < T; ++t) isum[t] = _mm256_setzero_si256();
      for (int h = 0; h < 2; ++h)
        for (int k = 0; k < 4; ++k) {
          prefetch_part<T>(w, b, 4 * h + k, 8);
          __m256i p0[T], p1[T];
          for (int t = 0; t < T; ++t) p0[t] = p1[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
          for (int i = 0; i < 8; ++i) {
            const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(load256(w[b].qs + (h * 8 + i) * 32), 2 * k), m2);
            const __m256i v = _mm256_or_si256(lo, third_bit(load256(w[b].hmask + i * 32), 4 * h + k));
            for (int t = 0; t < T; ++t)
              add_maddubs(i < 4 ? p0[t] : p1[t], v, bcast32(in.a[t][b].qs + 128 * h + 32 * k + 4 * i));
          }
          const int j = 8 * h + 2 * k;
          const __m256i s0 = scales(w[b], j), s1 = scales(w[b], j + 1);
          for (int t = 0; t < T; ++t) {
            add_epi32(isum[t], _mm256_madd_epi16(p0[t], s0));
            add_epi32(isum[t], _mm256_madd_epi16(p1[t], s1));
          }
        }
      __m256i pairs[8];  // once for all the tile's tokens
      for (int p = 0; p < 8; ++p) pairs[p] = scale_pairs(w[b], 2 * p);
      const __m256 dw = load_halves8(w[b].d);
      for (int t = 0; t < T; ++t) {
        __m256i corr = _mm256_setzero_si256();  // sum_j scale_j * bsum_j: the -4 of every level
        for (int p = 0; p < 8; ++p) corr = _mm256_add_epi32(corr, _mm256_madd_epi16(pairs[p], bcast32(in.a[t][b].bsums + 2 * p)));
        const __m256i i32 = _mm256_sub_epi32(isum[t], _mm256_slli_epi32(corr, 2));
        fmadd(acc[t], _mm256_cvtepi32_ps(i32), _mm256_mul_ps(dw, _mm256_set1_ps(in.a[t][b].d)));
      }
    }
    store_tile<T>(acc, y, ldy, nrows);
  }
};

// ---- Q4_K / Q5_K x Q8_K -------------------------------------------------------------
// Per sub-block of 32: 8 quads, int16 sums (4 at a time for 5-bit levels),
// madd with the sub-block scales of the 8 rows; mins against the activation
// sums of 32 in one madd per pair of sub-blocks.
template <bool HighBits>
struct KernelQ45K {
  static constexpr int kTile = kTileTokens;
  using WBlock = std::conditional_t<HighBits, BlockQ5_Kx8, BlockQ4_Kx8>;

  // Sub-block j = 2c + e: levels of quad i (low nibbles for e = 0).
  template <int J>
  static __m256i levels(const WBlock& w, int i) {
    constexpr int c = J / 2, e = J % 2;
    const __m256i q = load256(w.qs + (c * 8 + i) * 32);
    __m256i v = e == 0 ? q : _mm256_srli_epi16(q, 4);
    v = _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
    if constexpr (HighBits) {
      const __m256i h = move_bits<J, 4>(load256(w.qh + i * 32));
      v = _mm256_or_si256(v, _mm256_and_si256(h, _mm256_set1_epi8(0x10)));
    }
    return v;
  }

  template <int J, int T>
  static void sub_block(const WBlock& w, const TileActs<T, BlockQ8_K, ActSideQ8_K>& in, int64_t b, __m256i scale,
                        __m256i (&isum)[T]) {
    constexpr int kPerSum = HighBits ? 4 : 8;  // quads per int16 sum
    for (int g = 0; g < 8 / kPerSum; ++g) {
      __m256i p[T];
      for (int t = 0; t < T; ++t) p[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
      for (int k = 0; k < kPerSum; ++k) {
        const int i = g * kPerSum + k;
        const __m256i v = levels<J>(w, i);
        for (int t = 0; t < T; ++t)
          add_maddubs(p[t], v, bcast32(in.a[t][b].qs + 32 * J + 4 * i));
      }
      for (int t = 0; t < T; ++t) add_epi32(isum[t], _mm256_madd_epi16(p[t], scale));
    }
  }

  template <int T>
  __attribute__((noinline)) static void run(const void* wp, int64_t nb, const ActRows& rows, int64_t t0, float* y, int64_t ldy, int nrows) {
    const auto* w = static_cast<const WBlock*>(wp);
    const TileActs<T, BlockQ8_K, ActSideQ8_K> in(rows, t0);
    __m256 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      __m256i isum[T];
      for (int t = 0; t < T; ++t) isum[t] = _mm256_setzero_si256();
      const auto pair_scales = [&](int c) {
        return _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w[b].scales + 16 * c)));
      };
      prefetch_part<T>(w, b, 0, 4);
      __m256i s = pair_scales(0);
      sub_block<0>(w[b], in, b, dup_even16(s), isum);
      sub_block<1>(w[b], in, b, dup_odd16(s), isum);
      prefetch_part<T>(w, b, 1, 4);
      s = pair_scales(1);
      sub_block<2>(w[b], in, b, dup_even16(s), isum);
      sub_block<3>(w[b], in, b, dup_odd16(s), isum);
      prefetch_part<T>(w, b, 2, 4);
      s = pair_scales(2);
      sub_block<4>(w[b], in, b, dup_even16(s), isum);
      sub_block<5>(w[b], in, b, dup_odd16(s), isum);
      prefetch_part<T>(w, b, 3, 4);
      s = pair_scales(3);
      sub_block<6>(w[b], in, b, dup_even16(s), isum);
      sub_block<7>(w[b], in, b, dup_odd16(s), isum);

      const __m256 dw = load_halves8(w[b].d), dmin = load_halves8(w[b].dmin);
      for (int t = 0; t < T; ++t) {
        const __m256 da = _mm256_set1_ps(in.a[t][b].d);
        fmadd(acc[t], _mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(dw, da));
        __m256i imin = _mm256_setzero_si256();
        for (int c = 0; c < 4; ++c) {
          const __m256i m = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w[b].mins + 16 * c)));
          imin = _mm256_add_epi32(imin, _mm256_madd_epi16(m, bcast32(in.s[t][b].bs32 + 2 * c)));
        }
        acc[t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(imin), _mm256_mul_ps(dmin, da), acc[t]);
      }
    }
    store_tile<T>(acc, y, ldy, nrows);
  }
};

// ---- Q6_K x Q8_K ------------------------------------------------------------------
// Levels < 64: two maddubs per int16 sum. The -32 offset comes out against
// the activation sums of 16 (Q8_K bsums) with the same scales.
struct KernelQ6K {
  static constexpr int kTile = kTileTokens;
  // Part k (0..3) of half h: quad i's levels.
  template <int K>
  static __m256i levels(const BlockQ6_Kx8& w, int h, int i) {
    const __m256i l = load256(w.ql + ((h * 2 + (K & 1)) * 8 + i) * 32);
    const __m256i lo = _mm256_and_si256(K < 2 ? l : _mm256_srli_epi16(l, 4), _mm256_set1_epi8(0x0F));
    const __m256i hb = move_bits<2 * K, 4>(load256(w.qh + (h * 8 + i) * 32));
    return _mm256_or_si256(lo, _mm256_and_si256(hb, _mm256_set1_epi8(0x30)));
  }

  template <int K, int T>
  static void part(const BlockQ6_Kx8& w, const TileActs<T, BlockQ8_K, ActSideQ8_K>& in, int64_t b, int h,
                   __m256i (&isum)[T]) {
    const int pair = 4 * h + K;  // sub-blocks 2*pair (quads 0-3), 2*pair+1 (quads 4-7)
    const __m256i s = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.scales + 16 * pair)));
    const __m256i scales[2] = {dup_even16(s), dup_odd16(s)};
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
      __m256i p[T];
      for (int t = 0; t < T; ++t) p[t] = _mm256_setzero_si256();
      for (int k = 0; k < 2; ++k) {
        const int i = 2 * g + k;
        const __m256i v = levels<K>(w, h, i);
        for (int t = 0; t < T; ++t)
          add_maddubs(p[t], v, bcast32(in.a[t][b].qs + 128 * h + 32 * K + 4 * i));
      }
      for (int t = 0; t < T; ++t) add_epi32(isum[t], _mm256_madd_epi16(p[t], scales[g / 2]));
    }
    for (int t = 0; t < T; ++t) {
      const __m256i corr = _mm256_madd_epi16(s, bcast32(in.a[t][b].bsums + 2 * pair));
      isum[t] = _mm256_sub_epi32(isum[t], _mm256_slli_epi32(corr, 5));
    }
  }

  template <int T>
  __attribute__((noinline)) static void run(const void* wp, int64_t nb, const ActRows& rows, int64_t t0, float* y, int64_t ldy, int nrows) {
    const auto* w = static_cast<const BlockQ6_Kx8*>(wp);
    const TileActs<T, BlockQ8_K, ActSideQ8_K> in(rows, t0);
    __m256 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      __m256i isum[T];
      for (int t = 0; t < T; ++t) isum[t] = _mm256_setzero_si256();
      for (int h = 0; h < 2; ++h) {
        prefetch_part<T>(w, b, 4 * h, 8);
        part<0>(w[b], in, b, h, isum);
        prefetch_part<T>(w, b, 4 * h + 1, 8);
        part<1>(w[b], in, b, h, isum);
        prefetch_part<T>(w, b, 4 * h + 2, 8);
        part<2>(w[b], in, b, h, isum);
        prefetch_part<T>(w, b, 4 * h + 3, 8);
        part<3>(w[b], in, b, h, isum);
      }
      const __m256 dw = load_halves8(w[b].d);
      for (int t = 0; t < T; ++t)
        fmadd(acc[t], _mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(dw, _mm256_set1_ps(in.a[t][b].d)));
    }
    store_tile<T>(acc, y, ldy, nrows);
  }
};

template <typename Kernel, int T>
void run_tiles_of(const void* w, int64_t nb, const ActRows& a, int64_t t0, int64_t nt, float* y, int64_t ldy,
                  int nrows) {
  int64_t t = 0;
  for (; t + T <= nt; t += T) Kernel::template run<T>(w, nb, a, t0 + t, y + t * ldy, ldy, nrows);
  if constexpr (T > 1) {
    if (t < nt) run_tiles_of<Kernel, T - 1>(w, nb, a, t0 + t, nt - t, y + t * ldy, ldy, nrows);
  }
}

template <typename Kernel>
void run_tiles(const void* w, int64_t nb, const ActRows& a, int64_t t0, int64_t nt, float* y, int64_t ldy,
               int nrows) {
  run_tiles_of<Kernel, Kernel::kTile>(w, nb, a, t0, nt, y, ldy, nrows);
}

// ---- float weights ---------------------------------------------------------------

inline __m256 load8_bf16(const uint16_t* p) {
  const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

template <DType Type>
struct FloatRow;
template <>
struct FloatRow<DType::F32> {
  using T = float;
  static __m256 load(const float* p) { return _mm256_loadu_ps(p); }
  static float scalar(float v) { return v; }
};
template <>
struct FloatRow<DType::F16> {
  using T = uint16_t;
  static __m256 load(const uint16_t* p) { return load_halves8(p); }
  static float scalar(uint16_t v) { return half_to_float(v); }
};
template <>
struct FloatRow<DType::BF16> {
  using T = uint16_t;
  static __m256 load(const uint16_t* p) { return load8_bf16(p); }
  static float scalar(uint16_t v) { return fp32_from_bits(static_cast<uint32_t>(v) << 16); }
};

// R rows x T tokens of FMAs per 8 columns; horizontal sums at the end.
// 2 x 4 leaves registers for the loads (3 x 4 spilled).
template <DType Type, int R, int T>
void float_tile(const typename FloatRow<Type>::T* w, int64_t cols, const float* x, float* y, int64_t ldy) {
  using F = FloatRow<Type>;
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= cols; k += 8) {
    if constexpr (T == 1) {
      // Decode streams the rows once: prefetch as the quantized kernels do
      // (on into the rows that follow; the rows of a call are contiguous).
      constexpr int64_t ahead = kPrefetchBytes / sizeof(typename F::T);
      if ((k * sizeof(typename F::T)) % 64 == 0)
        for (int r = 0; r < R; ++r) _mm_prefetch(reinterpret_cast<const char*>(w + r * cols + k + ahead), _MM_HINT_T0);
    }
    __m256 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = F::load(w + r * cols + k);
    for (int t = 0; t < T; ++t) {
      const __m256 xv = _mm256_loadu_ps(x + t * cols + k);
      for (int r = 0; r < R; ++r) acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      float s = hsum(acc[r][t]);
      for (int64_t kk = k; kk < cols; ++kk) s += F::scalar(w[r * cols + kk]) * x[t * cols + kk];
      y[t * ldy + r] = s;
    }
  }
}

template <DType Type, int R>
void float_rows(const typename FloatRow<Type>::T* w, int64_t cols, const float* x, int64_t n, float* y,
                int64_t ldy) {
  int64_t t = 0;
  for (; t + 4 <= n; t += 4) float_tile<Type, R, 4>(w, cols, x + t * cols, y + t * ldy, ldy);
  switch (n - t) {
    case 3: float_tile<Type, R, 3>(w, cols, x + t * cols, y + t * ldy, ldy); break;
    case 2: float_tile<Type, R, 2>(w, cols, x + t * cols, y + t * ldy, ldy); break;
    case 1: float_tile<Type, R, 1>(w, cols, x + t * cols, y + t * ldy, ldy); break;
    default: break;
  }
}

template <DType Type>
void gemm_float_typed(const void* wp, int64_t r0, int64_t r1, int64_t cols, const float* x, int64_t n, float* y,
                      int64_t ldy) {
  const auto* w = static_cast<const typename FloatRow<Type>::T*>(wp);
  // Every row pair passes over all tokens: the weights stream once.
  int64_t r = r0;
  for (; r + 2 <= r1; r += 2) float_rows<Type, 2>(w + r * cols, cols, x, n, y + r, ldy);
  for (; r < r1; ++r) float_rows<Type, 1>(w + r * cols, cols, x, n, y + r, ldy);
}

}  // namespace

void gemm_x8(DType type, const void* w, int64_t nb, const ActRows& a, int64_t t0, int64_t nt, float* y,
             int64_t ldy, int nrows) {
  switch (type) {
    case DType::Q4_0: return run_tiles<KernelQ4_0>(w, nb, a, t0, nt, y, ldy, nrows);
    case DType::Q4_1: return run_tiles<KernelQ4_1>(w, nb, a, t0, nt, y, ldy, nrows);
    case DType::Q5_0: return run_tiles<KernelQ5<false>>(w, nb, a, t0, nt, y, ldy, nrows);
    case DType::Q5_1: return run_tiles<KernelQ5<true>>(w, nb, a, t0, nt, y, ldy, nrows);
    case DType::Q8_0: return run_tiles<KernelQ8_0>(w, nb, a, t0, nt, y, ldy, nrows);
    case DType::Q4_K: return run_tiles<KernelQ45K<false>>(w, nb, a, t0, nt, y, ldy, nrows);
    case DType::Q5_K: return run_tiles<KernelQ45K<true>>(w, nb, a, t0, nt, y, ldy, nrows);
    case DType::Q6_K: return run_tiles<KernelQ6K>(w, nb, a, t0, nt, y, ldy, nrows);
    case DType::IQ4_NL: return run_tiles<KernelLut4<false>>(w, nb, a, t0, nt, y, ldy, nrows);
    case DType::MXFP4: return run_tiles<KernelLut4<true>>(w, nb, a, t0, nt, y, ldy, nrows);
    case DType::IQ4_XS: return run_tiles<KernelIQ4XS>(w, nb, a, t0, nt, y, ldy, nrows);
    case DType::Q2_K: return run_tiles<KernelQ2K>(w, nb, a, t0, nt, y, ldy, nrows);
    case DType::Q3_K: return run_tiles<KernelQ3K>(w, nb, a, t0, nt, y, ldy, nrows);
    default: fail("gemm_x8: no interleaved kernel for {}", dtype_name(type));
  }
}

void gemm_float(DType type, const void* w, int64_t r0, int64_t r1, int64_t cols, const float* x, int64_t n,
                float* y, int64_t ldy) {
  switch (type) {
    case DType::F32: return gemm_float_typed<DType::F32>(w, r0, r1, cols, x, n, y, ldy);
    case DType::F16: return gemm_float_typed<DType::F16>(w, r0, r1, cols, x, n, y, ldy);
    case DType::BF16: return gemm_float_typed<DType::BF16>(w, r0, r1, cols, x, n, y, ldy);
    default: fail("gemm_float: {} is not a float type", dtype_name(type));
  }
}

}  // namespace pagellm::cpu::avx2
