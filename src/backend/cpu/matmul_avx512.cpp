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
#include <type_traits>

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

// A tile that reads its weights first (decode, or the first tile of a token
// chunk) is bound by memory: fetch a few blocks ahead in every group. Later
// tiles find the run in L2 and skip it. bench ops, one core, against no
// prefetch: n = 8 1.3-1.9x, n = 512 +7-19%; 2 KiB ahead beat 1 and 4 KiB
// (with up to four groups' streams into L1). always_inline: GCC 12 takes a
// function whose only effects are prefetches for one without side effects
// and deletes the calls to it (these were gone from every tile until
// 2026-12-06).
constexpr int64_t kPrefetchBytes = 2048;
template <typename Block>
[[gnu::always_inline]] inline void prefetch_ahead(bool cold, const Block* w0, const Block* w1, int64_t b) {
  if (!cold) return;
  constexpr int64_t ahead = (kPrefetchBytes + sizeof(Block) - 1) / sizeof(Block);
  const char* p0 = reinterpret_cast<const char*>(w0 + b + ahead);
  const char* p1 = reinterpret_cast<const char*>(w1 + b + ahead);
  for (size_t off = 0; off < sizeof(Block); off += 64) {
    _mm_prefetch(p0 + off, _MM_HINT_T0);
    _mm_prefetch(p1 + off, _MM_HINT_T0);
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
  // Token t's 4 activation bytes at qs[k] of block b, and its side values.
  const int8_t* quad(int t, int64_t b, int k) const { return a[t][b].qs + k; }
  const Side& side(int t, int64_t b) const { return s[t][b]; }
};

// The same tile read from ActRows::tiles (tokens [t0, t0 + 8), t0 a multiple of 8).
template <typename Side>
struct TiledActs {
  static_assert(sizeof(Side) == 8, "kActTileBlockBytes holds 8-byte sides");
  const uint8_t* base;
  TiledActs(const ActRows& rows, int64_t t0) : base(rows.tiles + (t0 / kActTileTokens) * rows.tile_stride) {}
  const int8_t* quad(int t, int64_t b, int k) const {
    return reinterpret_cast<const int8_t*>(base + b * kActTileBlockBytes + (k / 4) * 32 + t * 4);
  }
  const Side& side(int t, int64_t b) const {
    return *reinterpret_cast<const Side*>(base + b * kActTileBlockBytes + 256 + t * 8);
  }
};

// Runs body on the tile's activations: from ActRows::tiles for whole tiles
// when there are any, else a pointer per token.
template <int T, typename ABlock, typename Side, typename Body>
[[gnu::always_inline]] inline void with_acts(const ActRows& rows, int64_t t0, Body&& body) {
  if constexpr (T == kActTileTokens) {
    if (rows.tiles) return body(TiledActs<Side>(rows, t0));
  }
  body(TileActs<T, ABlock, Side>(rows, t0));
}

template <int T>
inline void store_tile(const __m512 (&acc)[T], float* y, int64_t ldy, int nrows) {
  const __mmask16 keep = nrows >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << nrows) - 1);
  for (int t = 0; t < T; ++t) _mm512_mask_storeu_ps(y + t * ldy, keep, acc[t]);
}

template <int T>
inline void zero(__m512i (&v)[T]) {
  for (int t = 0; t < T; ++t) v[t] = _mm512_setzero_si512();
}

// Each kernel: run<T>() computes two row groups (16 rows) x T tokens over all
// blocks. The wide kernels' run<P, T>() computes 2P groups (group g's blocks at
// w + g * gbytes): each broadcast activation quad then feeds P vpdpbusd, and
// the broadcast loads, not the products, were the limit at P = 1.
template <typename Block, int G>
inline void group_blocks(const uint8_t* w, int64_t gbytes, const Block* (&out)[G]) {
  for (int g = 0; g < G; ++g) out[g] = reinterpret_cast<const Block*>(w + g * gbytes);
}

// One int32 sum per (pair, token) and block, offset by c (the weights' zero
// point times the activation sum), times both scales into the accumulator.
template <int P, int T, typename Block, typename Acts>
inline void epilogue_q8_0(const Block* const* w, int64_t b, const Acts& in, const __m512i (&sum)[P][T],
                          __m512 (&acc)[P][T]) {
  __m512 dw[P];
  for (int p = 0; p < P; ++p) dw[p] = load_halves16(w[2 * p][b].d, w[2 * p + 1][b].d);
  for (int t = 0; t < T; ++t) {
    const __m512i c = _mm512_set1_epi32(in.side(t, b).c);
    const __m512 da = _mm512_set1_ps(in.side(t, b).d);
    for (int p = 0; p < P; ++p)
      fmadd(acc[p][t], _mm512_cvtepi32_ps(_mm512_sub_epi32(sum[p][t], c)), _mm512_mul_ps(dw[p], da));
  }
}

template <int P, int T>
inline void store_tiles(const __m512 (&acc)[P][T], float* y, int64_t ldy, int nrows) {
  for (int p = 0; p < P && 16 * p < nrows; ++p) store_tile<T>(acc[p], y + 16 * p, ldy, nrows - 16 * p);
}

// ---- Q4_0 x Q8_0 ------------------------------------------------------------------
// Levels 0..15; the -8 comes out as 8 * (activation sum), the side's c.
struct KernelQ4_0 {
  template <int P, int T>
  __attribute__((noinline)) static void run(const uint8_t* wp, int64_t gbytes, int64_t nb, const ActRows& rows,
                                            int64_t t0, float* y, int64_t ldy, int nrows, bool cold) {
    const BlockQ4_0x8* w[2 * P];
    group_blocks(wp, gbytes, w);
    with_acts<T, BlockQ8_0, ActSideQ8_0>(rows, t0, [&](const auto& in) __attribute__((always_inline)) {
      const __m512i m4 = _mm512_set1_epi8(0x0F);
      __m512 acc[P][T];
      for (int p = 0; p < P; ++p)
        for (int t = 0; t < T; ++t) acc[p][t] = _mm512_setzero_ps();
      for (int64_t b = 0; b < nb; ++b) {
        for (int p = 0; p < P; ++p) prefetch_ahead(cold, w[2 * p], w[2 * p + 1], b);
        __m512i sum[P][T];  // one chain each: the dpbusd latency is not the limit
        for (int p = 0; p < P; ++p) zero(sum[p]);
  #pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) {
          __m512i lo[P], hi[P];
          for (int p = 0; p < P; ++p) {
            const __m512i q = load_pair(w[2 * p][b].qs + 32 * i, w[2 * p + 1][b].qs + 32 * i);
            lo[p] = _mm512_and_si512(q, m4);
            hi[p] = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
          }
          for (int t = 0; t < T; ++t) {
            const __m512i a_lo = bcast32(in.quad(t, b, 4 * i)), a_hi = bcast32(in.quad(t, b, 16 + 4 * i));
            for (int p = 0; p < P; ++p) {
              dpbusd(sum[p][t], lo[p], a_lo);
              dpbusd(sum[p][t], hi[p], a_hi);
            }
          }
        }
        epilogue_q8_0<P, T>(w, b, in, sum, acc);
      }
      store_tiles<P, T>(acc, y, ldy, nrows);
    });
  }
};

// ---- Q8_0 x Q8_0 ------------------------------------------------------------------
struct KernelQ8_0 {
  template <int P, int T>
  __attribute__((noinline)) static void run(const uint8_t* wp, int64_t gbytes, int64_t nb, const ActRows& rows,
                                            int64_t t0, float* y, int64_t ldy, int nrows, bool cold) {
    const BlockQ8_0x8* w[2 * P];
    group_blocks(wp, gbytes, w);
    with_acts<T, BlockQ8_0, ActSideQ8_0>(rows, t0, [&](const auto& in) __attribute__((always_inline)) {
      const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
      __m512 acc[P][T];
      for (int p = 0; p < P; ++p)
        for (int t = 0; t < T; ++t) acc[p][t] = _mm512_setzero_ps();
      for (int64_t b = 0; b < nb; ++b) {
        for (int p = 0; p < P; ++p) prefetch_ahead(cold, w[2 * p], w[2 * p + 1], b);
        __m512i sum[P][T];
        for (int p = 0; p < P; ++p) zero(sum[p]);
  #pragma GCC unroll 8
        for (int i = 0; i < 8; ++i) {
          __m512i q[P];
          for (int p = 0; p < P; ++p)  // w + 128
            q[p] = _mm512_xor_si512(load_pair(w[2 * p][b].qs + 32 * i, w[2 * p + 1][b].qs + 32 * i), flip);
          for (int t = 0; t < T; ++t) {
            const __m512i a = bcast32(in.quad(t, b, 4 * i));
            for (int p = 0; p < P; ++p) dpbusd(sum[p][t], q[p], a);
          }
        }
        epilogue_q8_0<P, T>(w, b, in, sum, acc);
      }
      store_tiles<P, T>(acc, y, ldy, nrows);
    });
  }
};

// ---- Q4_K / Q5_K x Q8_K ----------------------------------------------------------
// Per pair of sub-blocks (32 elements each: the low and high nibbles of the
// same 8 quads, Q5_K's fifth bits from bits 2c, 2c + 1 of qh): int32 sums by
// vpdpbusd, times the rows' 6-bit scales; mins against the activation sums of
// 32, in one madd per pair.
template <bool HighBits>
struct KernelQ45K {
  using WBlock = std::conditional_t<HighBits, BlockQ5_Kx8, BlockQ4_Kx8>;
  template <int T>
  __attribute__((noinline)) static void run(const void* w0p, const void* w1p, int64_t nb, const ActRows& rows,
                                            int64_t t0, float* y, int64_t ldy, int nrows, bool cold) {
    const auto* w0 = static_cast<const WBlock*>(w0p);
    const auto* w1 = static_cast<const WBlock*>(w1p);
    const TileActs<T, BlockQ8_K, ActSideQ8_K> in(rows, t0);
    const __m512i m4 = _mm512_set1_epi8(0x0F), m10 = _mm512_set1_epi8(0x10);
    __m512 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      prefetch_ahead(cold, w0, w1, b);
      __m512i isum[T];
      zero(isum);
      for (int c = 0; c < 4; ++c) {
        __m512i lo_sum[T], hi_sum[T];
        zero(lo_sum);
        zero(hi_sum);
#pragma GCC unroll 8
        for (int i = 0; i < 8; ++i) {
          const __m512i q = load_pair(w0[b].qs + (c * 8 + i) * 32, w1[b].qs + (c * 8 + i) * 32);
          __m512i lo = _mm512_and_si512(q, m4), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
          if constexpr (HighBits) {  // bit 2c of each qh byte to bit 4, and bit 2c + 1
            const __m512i qh = load_pair(w0[b].qh + i * 32, w1[b].qh + i * 32);
            const __m512i h_lo = c < 2 ? _mm512_slli_epi16(qh, 4 - 2 * c) : _mm512_srli_epi16(qh, 2 * c - 4);
            const __m512i h_hi = c < 2 ? _mm512_slli_epi16(qh, 3 - 2 * c) : _mm512_srli_epi16(qh, 2 * c - 3);
            lo = _mm512_or_si512(lo, _mm512_and_si512(h_lo, m10));
            hi = _mm512_or_si512(hi, _mm512_and_si512(h_hi, m10));
          }
          for (int t = 0; t < T; ++t) dpbusd(lo_sum[t], lo, bcast32(in.quad(t, b, 64 * c + 4 * i)));
          for (int t = 0; t < T; ++t) dpbusd(hi_sum[t], hi, bcast32(in.quad(t, b, 64 * c + 32 + 4 * i)));
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
      for (int t = 0; t < T; ++t) dpbusd(i < 4 ? first[t] : second[t], v, bcast32(in.quad(t, b, 128 * h + 32 * K + 4 * i)));
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
                                            int64_t t0, float* y, int64_t ldy, int nrows, bool cold) {
    const auto* w0 = static_cast<const BlockQ6_Kx8*>(w0p);
    const auto* w1 = static_cast<const BlockQ6_Kx8*>(w1p);
    const TileActs<T, BlockQ8_K, ActSideQ8_K> in(rows, t0);
    __m512 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      prefetch_ahead(cold, w0, w1, b);
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

// ---- Q4_1 x Q8_1, Q5_0 x Q8_0, Q5_1 x Q8_1 ------------------------------------------
// Levels 0..15 (Q4_1) or 0..31 with the fifth bit of quad j in bit j (low
// nibbles) or j + 4 (high) of each qh byte. Q5_0's -16 comes out as 16 *
// (activation sum), the side's c; the _1 types add m * s per block.
template <bool Fifth, bool HasMin>
struct KernelQ4Q5 {
  using WBlock = std::conditional_t<Fifth, std::conditional_t<HasMin, BlockQ5_1x8, BlockQ5_0x8>, BlockQ4_1x8>;
  using ABlock = std::conditional_t<HasMin, BlockQ8_1, BlockQ8_0>;
  using Side = std::conditional_t<HasMin, ActSideQ8_1, ActSideQ8_0>;
  template <int P, int T>
  __attribute__((noinline)) static void run(const uint8_t* wp, int64_t gbytes, int64_t nb, const ActRows& rows,
                                            int64_t t0, float* y, int64_t ldy, int nrows, bool cold) {
    const WBlock* w[2 * P];
    group_blocks(wp, gbytes, w);
    with_acts<T, ABlock, Side>(rows, t0, [&](const auto& in) __attribute__((always_inline)) {
      const __m512i m4 = _mm512_set1_epi8(0x0F), m10 = _mm512_set1_epi8(0x10);
      __m512 acc[P][T];
      for (int p = 0; p < P; ++p)
        for (int t = 0; t < T; ++t) acc[p][t] = _mm512_setzero_ps();
      for (int64_t b = 0; b < nb; ++b) {
        for (int p = 0; p < P; ++p) prefetch_ahead(cold, w[2 * p], w[2 * p + 1], b);
        __m512i sum[P][T];  // low and high nibbles' products in one chain each
        __m512i qh[P];
        for (int p = 0; p < P; ++p) {
          zero(sum[p]);
          qh[p] = _mm512_setzero_si512();
          if constexpr (Fifth) qh[p] = load_pair(w[2 * p][b].qh, w[2 * p + 1][b].qh);
        }
  #pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) {
          __m512i lo[P], hi[P];
          for (int p = 0; p < P; ++p) {
            const __m512i q = load_pair(w[2 * p][b].qs + 32 * i, w[2 * p + 1][b].qs + 32 * i);
            lo[p] = _mm512_and_si512(q, m4);
            hi[p] = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
            if constexpr (Fifth) {  // bit i to bit 4 (low nibbles), bit i + 4 to bit 4 (high)
              lo[p] = _mm512_or_si512(lo[p], _mm512_and_si512(i < 4 ? _mm512_slli_epi16(qh[p], 4 - i) : qh[p], m10));
              hi[p] = _mm512_or_si512(hi[p], _mm512_and_si512(i == 0 ? qh[p] : _mm512_srli_epi16(qh[p], i), m10));
            }
          }
          for (int t = 0; t < T; ++t) {
            const __m512i a_lo = bcast32(in.quad(t, b, 4 * i)), a_hi = bcast32(in.quad(t, b, 16 + 4 * i));
            for (int p = 0; p < P; ++p) {
              dpbusd(sum[p][t], lo[p], a_lo);
              dpbusd(sum[p][t], hi[p], a_hi);
            }
          }
        }
        if constexpr (HasMin) {
          for (int p = 0; p < P; ++p) {
            const __m512 dw = load_halves16(w[2 * p][b].d, w[2 * p + 1][b].d);
            const __m512 mw = load_halves16(w[2 * p][b].m, w[2 * p + 1][b].m);
            for (int t = 0; t < T; ++t) {
              fmadd(acc[p][t], _mm512_cvtepi32_ps(sum[p][t]), _mm512_mul_ps(dw, _mm512_set1_ps(in.side(t, b).d)));
              fmadd(acc[p][t], mw, _mm512_set1_ps(in.side(t, b).s));
            }
          }
        } else {
          epilogue_q8_0<P, T>(w, b, in, sum, acc);
        }
      }
      store_tiles<P, T>(acc, y, ldy, nrows);
    });
  }
};

// 16 signed 4-bit levels plus 128, as unsigned bytes, in every 128-bit lane:
// one vpshufb maps nibbles to what vpdpbusd takes; the 128 comes out against
// the activation sums.
inline __m512i shifted_lut(const int8_t* values) {
  alignas(64) uint8_t u[64];
  for (int k = 0; k < 64; ++k) u[k] = static_cast<uint8_t>(values[k % 16] + 128);
  return _mm512_load_si512(u);
}

// ---- IQ4_NL / MXFP4 x Q8_0 -----------------------------------------------------------
// The side's c holds 128 * (activation sum).
template <bool Mx>
struct KernelLut4 {
  using WBlock = std::conditional_t<Mx, BlockMXFP4x8, BlockQ4_0x8>;

  // The 16 rows' block scales: fp16, or e8m0_to_fp32_half of the exponent bytes.
  static __m512 scales(const WBlock& w0, const WBlock& w1) {
    if constexpr (Mx) {
      const __m128i bytes = _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w0.e)),
                                               _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w1.e)));
      const __m512i e = _mm512_cvtepu8_epi32(bytes);
      const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
      const __m512i subnormal = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
      return _mm512_castsi512_ps(_mm512_mask_blend_epi32(_mm512_cmpgt_epi32_mask(e, _mm512_set1_epi32(1)), subnormal, normal));
    } else {
      return load_halves16(w0.d, w1.d);
    }
  }

  template <int T>
  __attribute__((noinline)) static void run(const void* w0p, const void* w1p, int64_t nb, const ActRows& rows,
                                            int64_t t0, float* y, int64_t ldy, int nrows, bool cold) {
    const auto* w0 = static_cast<const WBlock*>(w0p);
    const auto* w1 = static_cast<const WBlock*>(w1p);
    const TileActs<T, BlockQ8_0, ActSideQ8_0> in(rows, t0);
    const __m512i lut = shifted_lut(Mx ? kMXFP4Values : kIQ4NLValues), m4 = _mm512_set1_epi8(0x0F);
    __m512 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      prefetch_ahead(cold, w0, w1, b);
      __m512i lo_sum[T], hi_sum[T];
      zero(lo_sum);
      zero(hi_sum);
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        const __m512i q = load_pair(w0[b].qs + 32 * i, w1[b].qs + 32 * i);
        const __m512i lo = _mm512_shuffle_epi8(lut, _mm512_and_si512(q, m4));
        const __m512i hi = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(q, 4), m4));
        for (int t = 0; t < T; ++t) dpbusd(lo_sum[t], lo, bcast32(in.quad(t, b, 4 * i)));
        for (int t = 0; t < T; ++t) dpbusd(hi_sum[t], hi, bcast32(in.quad(t, b, 16 + 4 * i)));
      }
      const __m512 dw = scales(w0[b], w1[b]);
      for (int t = 0; t < T; ++t) {
        const __m512i i32 = _mm512_sub_epi32(_mm512_add_epi32(lo_sum[t], hi_sum[t]), _mm512_set1_epi32(in.s[t][b].c));
        fmadd(acc[t], _mm512_cvtepi32_ps(i32), _mm512_mul_ps(dw, _mm512_set1_ps(in.s[t][b].d)));
      }
    }
    store_tile<T>(acc, y, ldy, nrows);
  }
};

// ---- IQ4_XS x Q8_K -------------------------------------------------------------------
// IQ4_NL's levels (plus 128) in sub-blocks of 32, each with a signed scale;
// the 128 comes out against the sub-block's activation sum (the side's bs32).
struct KernelIQ4XS {
  template <int T>
  __attribute__((noinline)) static void run(const void* w0p, const void* w1p, int64_t nb, const ActRows& rows,
                                            int64_t t0, float* y, int64_t ldy, int nrows, bool cold) {
    const auto* w0 = static_cast<const BlockIQ4_XSx8*>(w0p);
    const auto* w1 = static_cast<const BlockIQ4_XSx8*>(w1p);
    const TileActs<T, BlockQ8_K, ActSideQ8_K> in(rows, t0);
    const __m512i lut = shifted_lut(kIQ4NLValues), m4 = _mm512_set1_epi8(0x0F);
    __m512 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      prefetch_ahead(cold, w0, w1, b);
      __m512i isum[T];
      zero(isum);
      for (int j = 0; j < 8; ++j) {
        __m512i sub[T];
        for (int t = 0; t < T; ++t) sub[t] = _mm512_set1_epi32(-128 * in.s[t][b].bs32[j]);
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) {
          const __m512i q = load_pair(w0[b].qs + (j * 4 + i) * 32, w1[b].qs + (j * 4 + i) * 32);
          const __m512i lo = _mm512_shuffle_epi8(lut, _mm512_and_si512(q, m4));
          const __m512i hi = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(q, 4), m4));
          for (int t = 0; t < T; ++t) {
            const int8_t* a = in.a[t][b].qs + 32 * j + 4 * i;
            dpbusd(sub[t], lo, bcast32(a));
            dpbusd(sub[t], hi, bcast32(a + 16));
          }
        }
        const __m128i sc8 = _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w0[b].scales + j * kGroupRows)),
                                               _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w1[b].scales + j * kGroupRows)));
        const __m512i sc = _mm512_cvtepi8_epi32(sc8);
        for (int t = 0; t < T; ++t) add_epi32(isum[t], _mm512_mullo_epi32(sub[t], sc));
      }
      const __m512 dw = load_halves16(w0[b].d, w1[b].d);
      for (int t = 0; t < T; ++t)
        fmadd(acc[t], _mm512_cvtepi32_ps(isum[t]), _mm512_mul_ps(dw, _mm512_set1_ps(in.a[t][b].d)));
    }
    store_tile<T>(acc, y, ldy, nrows);
  }
};

// ---- Q2_K x Q8_K --------------------------------------------------------------------
// 2-bit levels: the 8 quads of one shift and half share two sub-blocks of 16
// (quads 0-3, 4-7) with 4-bit scales; mins against the activation sums of 16.
struct KernelQ2K {
  // Sub-block j's (scale | min << 4) bytes of the 16 rows, as int32 lanes.
  static __m512i scale_bytes(const BlockQ2_Kx8& w0, const BlockQ2_Kx8& w1, int j) {
    return _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w0.scales + j * kGroupRows)),
                                                   _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w1.scales + j * kGroupRows))));
  }

  template <int T>
  __attribute__((noinline)) static void run(const void* w0p, const void* w1p, int64_t nb, const ActRows& rows,
                                            int64_t t0, float* y, int64_t ldy, int nrows, bool cold) {
    const auto* w0 = static_cast<const BlockQ2_Kx8*>(w0p);
    const auto* w1 = static_cast<const BlockQ2_Kx8*>(w1p);
    const TileActs<T, BlockQ8_K, ActSideQ8_K> in(rows, t0);
    const __m512i m2 = _mm512_set1_epi8(0x03), m4 = _mm512_set1_epi32(0x0F);
    __m512 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      prefetch_ahead(cold, w0, w1, b);
      __m512i isum[T];
      zero(isum);
      for (int h = 0; h < 2; ++h)
        for (int k = 0; k < 4; ++k) {
          __m512i p0[T], p1[T];
          zero(p0);
          zero(p1);
#pragma GCC unroll 8
          for (int i = 0; i < 8; ++i) {
            const __m512i q = load_pair(w0[b].qs + (h * 8 + i) * 32, w1[b].qs + (h * 8 + i) * 32);
            const __m512i v = _mm512_and_si512(_mm512_srli_epi16(q, 2 * k), m2);
            for (int t = 0; t < T; ++t)
              dpbusd(i < 4 ? p0[t] : p1[t], v, bcast32(in.quad(t, b, 128 * h + 32 * k + 4 * i)));
          }
          const int j = 8 * h + 2 * k;
          const __m512i s0 = _mm512_and_si512(scale_bytes(w0[b], w1[b], j), m4);
          const __m512i s1 = _mm512_and_si512(scale_bytes(w0[b], w1[b], j + 1), m4);
          for (int t = 0; t < T; ++t) {
            add_epi32(isum[t], _mm512_mullo_epi32(p0[t], s0));
            add_epi32(isum[t], _mm512_mullo_epi32(p1[t], s1));
          }
        }
      const __m512 dw = load_halves16(w0[b].d, w1[b].d), dmin = load_halves16(w0[b].dmin, w1[b].dmin);
      __m512i mins[8];  // mins of sub-blocks 2p (low int16) and 2p + 1 (high), once for all tokens
      for (int p = 0; p < 8; ++p)
        mins[p] = _mm512_or_si512(_mm512_srli_epi32(scale_bytes(w0[b], w1[b], 2 * p), 4),
                                  _mm512_slli_epi32(_mm512_srli_epi32(scale_bytes(w0[b], w1[b], 2 * p + 1), 4), 16));
      for (int t = 0; t < T; ++t) {
        __m512i imin = _mm512_setzero_si512();
        for (int p = 0; p < 8; ++p)
          imin = _mm512_add_epi32(imin, _mm512_madd_epi16(mins[p], bcast32(in.a[t][b].bsums + 2 * p)));
        const __m512 da = _mm512_set1_ps(in.a[t][b].d);
        fmadd(acc[t], _mm512_cvtepi32_ps(isum[t]), _mm512_mul_ps(dw, da));
        acc[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(imin), _mm512_mul_ps(dmin, da), acc[t]);
      }
    }
    store_tile<T>(acc, y, ldy, nrows);
  }
};

// ---- Q3_K x Q8_K --------------------------------------------------------------------
// Q2_K's structure with a third bit from hmask (levels 0..7, the -4 taken out
// against the activation sums of 16) and signed scales, no mins.
struct KernelQ3K {
  // Sub-block j's signed scales of the 16 rows, as int32 lanes.
  static __m512i scales(const BlockQ3_Kx8& w0, const BlockQ3_Kx8& w1, int j) {
    return _mm512_cvtepi8_epi32(_mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w0.scales + j * kGroupRows)),
                                                   _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w1.scales + j * kGroupRows))));
  }

  template <int T>
  __attribute__((noinline)) static void run(const void* w0p, const void* w1p, int64_t nb, const ActRows& rows,
                                            int64_t t0, float* y, int64_t ldy, int nrows, bool cold) {
    const auto* w0 = static_cast<const BlockQ3_Kx8*>(w0p);
    const auto* w1 = static_cast<const BlockQ3_Kx8*>(w1p);
    const TileActs<T, BlockQ8_K, ActSideQ8_K> in(rows, t0);
    const __m512i m2 = _mm512_set1_epi8(0x03), m04 = _mm512_set1_epi8(0x04);
    __m512 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      prefetch_ahead(cold, w0, w1, b);
      __m512i isum[T];
      zero(isum);
      for (int h = 0; h < 2; ++h)
        for (int k = 0; k < 4; ++k) {
          const int bit = 4 * h + k;  // the third bits' position in hmask
          const __m128i up = _mm_cvtsi32_si128(2 - bit), down = _mm_cvtsi32_si128(bit - 2);
          __m512i p0[T], p1[T];
          zero(p0);
          zero(p1);
#pragma GCC unroll 8
          for (int i = 0; i < 8; ++i) {
            const __m512i q = load_pair(w0[b].qs + (h * 8 + i) * 32, w1[b].qs + (h * 8 + i) * 32);
            const __m512i hm = load_pair(w0[b].hmask + i * 32, w1[b].hmask + i * 32);
            const __m512i hb = bit >= 2 ? _mm512_srl_epi16(hm, down) : _mm512_sll_epi16(hm, up);
            const __m512i v = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(q, 2 * k), m2), _mm512_and_si512(hb, m04));
            for (int t = 0; t < T; ++t)
              dpbusd(i < 4 ? p0[t] : p1[t], v, bcast32(in.quad(t, b, 128 * h + 32 * k + 4 * i)));
          }
          const int j = 8 * h + 2 * k;
          const __m512i s0 = scales(w0[b], w1[b], j), s1 = scales(w0[b], w1[b], j + 1);
          for (int t = 0; t < T; ++t) {
            add_epi32(isum[t], _mm512_mullo_epi32(p0[t], s0));
            add_epi32(isum[t], _mm512_mullo_epi32(p1[t], s1));
          }
        }
      __m512i pairs[8];  // scales of sub-blocks 2p (low int16) and 2p + 1 (high), once for all tokens
      for (int p = 0; p < 8; ++p)
        pairs[p] = _mm512_or_si512(_mm512_and_si512(scales(w0[b], w1[b], 2 * p), _mm512_set1_epi32(0xFFFF)),
                                   _mm512_slli_epi32(scales(w0[b], w1[b], 2 * p + 1), 16));
      const __m512 dw = load_halves16(w0[b].d, w1[b].d);
      for (int t = 0; t < T; ++t) {
        __m512i corr = _mm512_setzero_si512();
        for (int p = 0; p < 8; ++p) corr = _mm512_add_epi32(corr, _mm512_madd_epi16(pairs[p], bcast32(in.a[t][b].bsums + 2 * p)));
        const __m512i i32 = _mm512_sub_epi32(isum[t], _mm512_slli_epi32(corr, 2));
        fmadd(acc[t], _mm512_cvtepi32_ps(i32), _mm512_mul_ps(dw, _mm512_set1_ps(in.a[t][b].d)));
      }
    }
    store_tile<T>(acc, y, ldy, nrows);
  }
};

// Tokens per tile of the wide kernels: P = 2 x 8 tokens keeps 16 int32 sums
// in registers (the float sums spill, touched once per block). bench ops,
// n = 512, one core: Q8_0 435 -> ~600 GOP/s against P = 1 x 6 tokens.
constexpr int kWideTileTokens = 8;
static_assert(kWideTileTokens == kActTileTokens, "whole wide tiles read ActRows::tiles");
// Pairs of groups per call of the wide kernels.
constexpr int kWidePairs = 2;

// The two-group kernels (run<T>(w0, w1, ...)) as wide kernels of one pair.
template <typename Kernel>
struct OnePair {
  template <int P, int T>
  static void run(const uint8_t* w, int64_t gbytes, int64_t nb, const ActRows& a, int64_t t0, float* y, int64_t ldy,
                  int nrows, bool cold) {
    static_assert(P == 1);
    Kernel::template run<T>(w, w + gbytes, nb, a, t0, y, ldy, nrows, cold);
  }
};

// Tiles of T tokens, then the rest in tiles of T - 1, ...; only the first
// tile reads the weights cold.
template <typename Kernel, int P, int T>
void run_tiles_of(const uint8_t* w, int64_t gbytes, int64_t nb, const ActRows& a, int64_t t0, int64_t nt, float* y,
                  int64_t ldy, int nrows, bool cold = true) {
  int64_t t = 0;
  for (; t + T <= nt; t += T, cold = false)
    Kernel::template run<P, T>(w, gbytes, nb, a, t0 + t, y + t * ldy, ldy, nrows, cold);
  if constexpr (T > 1) {
    if (t < nt) run_tiles_of<Kernel, P, T - 1>(w, gbytes, nb, a, t0 + t, nt - t, y + t * ldy, ldy, nrows, cold);
  }
}

template <typename Kernel>
void run_wide(const uint8_t* w, int64_t gbytes, int groups, int64_t nb, const ActRows& a, int64_t t0, int64_t nt,
              float* y, int64_t ldy, int nrows) {
  if (groups == 2 * kWidePairs)
    return run_tiles_of<Kernel, kWidePairs, kWideTileTokens>(w, gbytes, nb, a, t0, nt, y, ldy, nrows);
  run_tiles_of<Kernel, 1, kWideTileTokens>(w, gbytes, nb, a, t0, nt, y, ldy, nrows);
}

}  // namespace

int gemm_group_count(DType type) {
  switch (type) {
    case DType::Q4_0:
    case DType::Q5_0:
    case DType::Q8_0: return 2 * kWidePairs;
    // Q4_1 / Q5_1 run the same kernel on one pair: the second float step per
    // token spills at two (bench ops n = 512: Q4_1 ~590 against ~500 GOP/s).
    case DType::Q4_1:
    case DType::Q5_1:
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
    case DType::IQ4_NL:
    case DType::IQ4_XS:
    case DType::MXFP4: return 2;
    default: return 0;
  }
}

// The run_wide kernels: their 8-token tiles read ActRows::tiles.
bool gemm_reads_act_tiles(DType type) {
  switch (type) {
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q8_0: return true;
    default: return false;
  }
}

void gemm_groups(DType type, const uint8_t* w, int64_t gbytes, int groups, int64_t nb, const ActRows& a, int64_t t0,
                 int64_t nt, float* y, int64_t ldy, int nrows) {
  PAGELLM_CHECK(groups == 2 || groups == gemm_group_count(type), "gemm_groups: {} groups of {}", groups,
                dtype_name(type));
  switch (type) {
    case DType::Q4_0: return run_wide<KernelQ4_0>(w, gbytes, groups, nb, a, t0, nt, y, ldy, nrows);
    case DType::Q8_0: return run_wide<KernelQ8_0>(w, gbytes, groups, nb, a, t0, nt, y, ldy, nrows);
    case DType::Q4_1: return run_wide<KernelQ4Q5<false, true>>(w, gbytes, groups, nb, a, t0, nt, y, ldy, nrows);
    case DType::Q5_0: return run_wide<KernelQ4Q5<true, false>>(w, gbytes, groups, nb, a, t0, nt, y, ldy, nrows);
    case DType::Q5_1: return run_wide<KernelQ4Q5<true, true>>(w, gbytes, groups, nb, a, t0, nt, y, ldy, nrows);
    case DType::Q2_K: return run_tiles_of<OnePair<KernelQ2K>, 1, kTileTokens>(w, gbytes, nb, a, t0, nt, y, ldy, nrows);
    case DType::Q3_K: return run_tiles_of<OnePair<KernelQ3K>, 1, kTileTokens>(w, gbytes, nb, a, t0, nt, y, ldy, nrows);
    // Q4_K: 5 tokens keep 4 x 5 sums in registers (6 spill): bench ops n = 512 +5% against 4.
    case DType::Q4_K: return run_tiles_of<OnePair<KernelQ45K<false>>, 1, 5>(w, gbytes, nb, a, t0, nt, y, ldy, nrows);
    case DType::Q5_K: return run_tiles_of<OnePair<KernelQ45K<true>>, 1, kTileTokens>(w, gbytes, nb, a, t0, nt, y, ldy, nrows);
    case DType::IQ4_NL: return run_tiles_of<OnePair<KernelLut4<false>>, 1, kTileTokens>(w, gbytes, nb, a, t0, nt, y, ldy, nrows);
    case DType::IQ4_XS: return run_tiles_of<OnePair<KernelIQ4XS>, 1, kTileTokens>(w, gbytes, nb, a, t0, nt, y, ldy, nrows);
    case DType::MXFP4: return run_tiles_of<OnePair<KernelLut4<true>>, 1, kTileTokens>(w, gbytes, nb, a, t0, nt, y, ldy, nrows);
    case DType::Q6_K: return run_tiles_of<OnePair<KernelQ6K>, 1, kTileTokens>(w, gbytes, nb, a, t0, nt, y, ldy, nrows);
    default: fail("gemm_groups: no AVX-512 VNNI kernel for {}", dtype_name(type));
  }
}

}  // namespace pagellm::cpu::avx512
