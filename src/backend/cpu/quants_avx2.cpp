// AVX2 + FMA + F16C kernels: activation quantization (byte-identical to the
// scalar reference), row dot products (integer dots with maddubs), and
// dequantization (bit-identical to the reference).
//
// No implicit contraction: quantization and dequantization must round exactly
// like the reference; where an FMA is wanted it is written out.
#pragma GCC optimize("fp-contract=off")

#include <immintrin.h>

#include <cstring>
#include <utility>

#include "backend/cpu/quants_avx2_common.h"
#include "backend/cpu/quants_kernels.h"
#include "core/error.h"

namespace pagellm::cpu::avx2 {
namespace {

// ---- quantization -----------------------------------------------------------

// Rounds 8 values of one block with the block's inverse scale, half away from
// zero (as roundf), and returns them as int32.
inline __m256i round_scaled(const float* x, __m256 id) {
  const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x), id);
  // trunc(v + copysign(0.5 - 2^-25, v)) == roundf(v) for |v| < 2^23.
  const __m256 sign = _mm256_and_ps(v, _mm256_set1_ps(-0.0f));
  const __m256 half = _mm256_or_ps(sign, _mm256_set1_ps(0.49999997f));
  return _mm256_cvttps_epi32(_mm256_add_ps(v, half));
}

inline float block_absmax(const float* x, int n) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 m = _mm256_setzero_ps();
  for (int j = 0; j < n; j += 8) m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + j), abs_mask));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_movehdup_ps(h));
  return _mm_cvtss_f32(h);
}

// Quantizes 32 values to int8; returns their int32 lanes summed (8 partials).
inline __m256i quantize_32(const float* x, __m256 id, int8_t* out) {
  const __m256i i0 = round_scaled(x, id), i1 = round_scaled(x + 8, id);
  const __m256i i2 = round_scaled(x + 16, id), i3 = round_scaled(x + 24, id);
  const __m256i p01 = _mm256_packs_epi32(i0, i1), p23 = _mm256_packs_epi32(i2, i3);
  __m256i q = _mm256_packs_epi16(p01, p23);
  q = _mm256_permutevar8x32_epi32(q, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), q);
  return _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
}

// ---- row dot products --------------------------------------------------------

float dot_q4_0(int64_t nb, const BlockQ4_0* w, const BlockQ8_0* a) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const __m256i q = _mm256_sub_epi8(unpack_nibbles_16(w[i].qs), _mm256_set1_epi8(8));
    const __m256i p = dot_s8(q, load256(a[i].qs));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(half_to_float(w[i].d) * half_to_float(a[i].d)), acc);
  }
  return hsum(acc);
}

float dot_q4_1(int64_t nb, const BlockQ4_1* w, const BlockQ8_1* a) {
  __m256 acc = _mm256_setzero_ps();
  float mins = 0;
  for (int64_t i = 0; i < nb; ++i) {
    const __m256i p = dot_u8s8(unpack_nibbles_16(w[i].qs), load256(a[i].qs));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(half_to_float(w[i].d) * half_to_float(a[i].d)), acc);
    mins += half_to_float(w[i].m) * half_to_float(a[i].s);
  }
  return hsum(acc) + mins;
}

inline __m256i fifth_bits(const uint8_t* qh) {
  uint32_t bits;
  std::memcpy(&bits, qh, 4);
  return _mm256_and_si256(bits_to_bytes(bits), _mm256_set1_epi8(0x10));
}

float dot_q5_0(int64_t nb, const BlockQ5_0* w, const BlockQ8_0* a) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    __m256i q = _mm256_or_si256(unpack_nibbles_16(w[i].qs), fifth_bits(w[i].qh));
    q = _mm256_sub_epi8(q, _mm256_set1_epi8(16));
    const __m256i p = dot_s8(q, load256(a[i].qs));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(half_to_float(w[i].d) * half_to_float(a[i].d)), acc);
  }
  return hsum(acc);
}

float dot_q5_1(int64_t nb, const BlockQ5_1* w, const BlockQ8_1* a) {
  __m256 acc = _mm256_setzero_ps();
  float mins = 0;
  for (int64_t i = 0; i < nb; ++i) {
    const __m256i q = _mm256_or_si256(unpack_nibbles_16(w[i].qs), fifth_bits(w[i].qh));
    const __m256i p = dot_u8s8(q, load256(a[i].qs));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(half_to_float(w[i].d) * half_to_float(a[i].d)), acc);
    mins += half_to_float(w[i].m) * half_to_float(a[i].s);
  }
  return hsum(acc) + mins;
}

float dot_q8_0(int64_t nb, const BlockQ8_0* w, const BlockQ8_0* a) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const __m256i p = dot_s8(load256(w[i].qs), load256(a[i].qs));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(half_to_float(w[i].d) * half_to_float(a[i].d)), acc);
  }
  return hsum(acc);
}

int kquant_min_sum(const uint8_t* mins, const int16_t* bsums) {
  int s = 0;
  for (int j = 0; j < 8; ++j) s += mins[j] * (bsums[2 * j] + bsums[2 * j + 1]);
  return s;
}

// Q4_K and Q5_K differ only in the fifth bit (HighBits = false for Q4_K).
template <bool HighBits, typename Block>
float dot_q45_k(int64_t nb, const Block* w, const BlockQ8_K* a) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
  __m256 acc = _mm256_setzero_ps();
  float mins_total = 0;
  for (int64_t i = 0; i < nb; ++i) {
    uint8_t sc[8], mn[8];
    for (int j = 0; j < 8; ++j) kquant_scale_min(j, w[i].scales, sc[j], mn[j]);
    __m256i hv = _mm256_setzero_si256();
    if constexpr (HighBits) hv = load256(w[i].qh);
    __m256i isum = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      const __m256i q = load256(w[i].qs + 32 * c);
      __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
      if constexpr (HighBits) {
        lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hv, 2 * c), one), 4));
        hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hv, 2 * c + 1), one), 4));
      }
      const __m256i p_lo = _mm256_maddubs_epi16(lo, load256(a[i].qs + 64 * c));
      const __m256i p_hi = _mm256_maddubs_epi16(hi, load256(a[i].qs + 64 * c + 32));
      isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p_lo, _mm256_set1_epi16(sc[2 * c])));
      isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p_hi, _mm256_set1_epi16(sc[2 * c + 1])));
    }
    const float dw = half_to_float(w[i].d), dmin = half_to_float(w[i].dmin);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(a[i].d * dw), acc);
    mins_total += a[i].d * dmin * static_cast<float>(kquant_min_sum(mn, a[i].bsums));
  }
  return hsum(acc) - mins_total;
}

float dot_q6_k(int64_t nb, const BlockQ6_K* w, const BlockQ8_K* a) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    __m256i isum = _mm256_setzero_si256();
    int correction = 0;  // sum_s sc[s] * bsums[s]: the -32 offset of every level
    for (int s = 0; s < 16; ++s) correction += w[i].scales[s] * a[i].bsums[s];
    for (int h = 0; h < 2; ++h) {
      const __m256i qh = load256(w[i].qh + 32 * h);
      const __m256i ql0 = load256(w[i].ql + 64 * h), ql1 = load256(w[i].ql + 64 * h + 32);
      __m256i q[4];
      q[0] = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(0x03)), 4));
      q[1] = _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(0x0C)), 2));
      q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, _mm256_set1_epi8(0x30)));
      q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                             _mm256_srli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(static_cast<char>(0xC0))), 2));
      const int8_t* sc = w[i].scales + 8 * h;
      for (int k = 0; k < 4; ++k) {
        const __m256i p = _mm256_maddubs_epi16(q[k], load256(a[i].qs + 128 * h + 32 * k));
        const __m256i s = _mm256_set_m128i(_mm_set1_epi16(sc[2 * k + 1]), _mm_set1_epi16(sc[2 * k]));
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, s));
      }
    }
    isum = _mm256_sub_epi32(isum, _mm256_setr_epi32(32 * correction, 0, 0, 0, 0, 0, 0, 0));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(a[i].d * half_to_float(w[i].d)), acc);
  }
  return hsum(acc);
}

// Q2_K / Q3_K: element 128h + 32s + l is bits 2s..2s+1 of qs[32h + l], so
// one 32-byte load serves four runs of 32 elements (sub-blocks 8h + 2s and
// 8h + 2s + 1, one per 128-bit lane of the maddubs result).
//
// The 16 sub-block scales sit as bytes in both 128-bit lanes of `sc`; this
// picks scale j (low lane) and j + 1 (high lane) as int16 in every element
// (signed: into the high byte, then shifted down with its sign).
template <int J, bool Signed>
inline __m256i pair_scales(__m256i sc) {
  constexpr int lo = Signed ? (J << 8) | 0x80 : 0x8000 | J, hi = Signed ? ((J + 1) << 8) | 0x80 : 0x8000 | (J + 1);
  const __m256i pick = _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(hi)), _mm_set1_epi16(static_cast<int16_t>(lo)));
  const __m256i v = _mm256_shuffle_epi8(sc, pick);
  return Signed ? _mm256_srai_epi16(v, 8) : v;
}

// sum over the 8 runs of maddubs(levels of run, activations) * scales, where
// Levels(q, hm, h, s) gives run (h, s)'s 32 unsigned levels.
template <bool Signed, typename Levels>
inline __m256i k_runs(const uint8_t* qs, const int8_t* y, __m256i sc, Levels levels) {
  __m256i isum = _mm256_setzero_si256();
  auto run = [&](auto hs) {
    constexpr int h = decltype(hs)::value / 4, s = decltype(hs)::value % 4;
    const __m256i lv = levels(load256(qs + 32 * h), h, s);
    const __m256i p = _mm256_maddubs_epi16(lv, load256(y + 128 * h + 32 * s));
    isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, pair_scales<8 * h + 2 * s, Signed>(sc)));
  };
  [&]<int... I>(std::integer_sequence<int, I...>) { (run(std::integral_constant<int, I>{}), ...); }(
      std::make_integer_sequence<int, 8>{});
  return isum;
}

float dot_q2_k(int64_t nb, const BlockQ2_K* w, const BlockQ8_K* a) {
  const __m256i m3 = _mm256_set1_epi8(3), m4 = _mm256_set1_epi8(0x0F);
  __m256 acc = _mm256_setzero_ps(), acc_min = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[i].scales));
    const __m256i sc = _mm256_and_si256(_mm256_set_m128i(raw, raw), m4);
    // mins * activation sums of 16: 8 int32 partial sums
    const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), _mm256_castsi256_si128(m4)));
    const __m256i imin = _mm256_madd_epi16(mins, load256(a[i].bsums));
    const __m256i isum = k_runs<false>(w[i].qs, a[i].qs, sc, [&](__m256i q, int, int s) {
      return _mm256_and_si256(_mm256_srli_epi16(q, 2 * s), m3);
    });
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(a[i].d * half_to_float(w[i].d)), acc);
    acc_min = _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin), _mm256_set1_ps(a[i].d * half_to_float(w[i].dmin)), acc_min);
  }
  return hsum(acc) - hsum(acc_min);
}

// The 16 Q3_K scales (minus 32) as int8, as q3k_scales: low 4 bits from
// the nibbles of bytes 0-7, high 2 bits from bytes 8-11 (scale k: byte
// 8 + k % 4, bits 2 (k / 4)), so one variable shift per 32-bit lane.
inline __m128i q3k_scales_vec(const uint8_t* p) {
  uint64_t lo;
  uint32_t hi;
  std::memcpy(&lo, p, 8);
  std::memcpy(&hi, p + 8, 4);
  const __m128i m4 = _mm_set1_epi8(0x0F);
  const __m128i l = _mm_cvtsi64_si128(static_cast<int64_t>(lo));
  const __m128i low = _mm_unpacklo_epi64(_mm_and_si128(l, m4), _mm_and_si128(_mm_srli_epi16(l, 4), m4));
  const __m128i high = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32(static_cast<int>(hi)), _mm_setr_epi32(0, 2, 4, 6)),
                                     _mm_set1_epi8(3));
  return _mm_sub_epi8(_mm_or_si128(low, _mm_slli_epi16(high, 4)), _mm_set1_epi8(32));
}

float dot_q3_k(int64_t nb, const BlockQ3_K* w, const BlockQ8_K* a) {
  const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const __m128i raw = q3k_scales_vec(w[i].scales);
    // Levels are stored as q + 4: take 4 * sum_j sc[j] * bsums[j] out.
    const __m256i corr = _mm256_madd_epi16(_mm256_cvtepi8_epi16(raw), load256(a[i].bsums));
    const __m256i hm = load256(w[i].hmask);
    __m256i isum = k_runs<true>(w[i].qs, a[i].qs, _mm256_set_m128i(raw, raw), [&](__m256i q, int h, int s) {
      const __m256i high = _mm256_and_si256(_mm256_srli_epi16(hm, 4 * h + s), one);
      return _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 2 * s), m3), _mm256_slli_epi16(high, 2));
    });
    isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(corr, 2));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(a[i].d * half_to_float(w[i].d)), acc);
  }
  return hsum(acc);
}

// A 16-entry int8 level table in both 128-bit lanes, for pshufb lookups.
inline __m256i level_table(const int8_t* levels) {
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(levels));
  return _mm256_set_m128i(t, t);
}

float dot_iq4_xs(int64_t nb, const BlockIQ4_XS* w, const BlockQ8_K* a) {
  const __m256i table = level_table(kIQ4NLValues);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    __m256i isum = _mm256_setzero_si256();
    for (int j = 0; j < 8; ++j) {
      const __m256i q = _mm256_shuffle_epi8(table, unpack_nibbles_16(w[i].qs + 16 * j));
      const __m256i y = load256(a[i].qs + 32 * j);
      const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(y, q));
      isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, _mm256_set1_epi16(static_cast<int16_t>(iq4xs_scale(w[i], j)))));
    }
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(a[i].d * half_to_float(w[i].d)), acc);
  }
  return hsum(acc);
}

// IQ4_NL and MXFP4: Q4_0's nibble layout through a level table.
inline float iq4nl_scale(const BlockIQ4_NL& b) { return half_to_float(b.d); }
inline float mxfp4_scale(const BlockMXFP4& b) { return e8m0_to_fp32_half(b.e); }

template <typename Block, float (*Scale)(const Block&)>
float dot_table4(int64_t nb, const Block* w, const BlockQ8_0* a, const int8_t* levels) {
  const __m256i table = level_table(levels);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 2 <= nb; i += 2) {  // two chains: the FMA latency is not the limit
    const __m256i q0 = _mm256_shuffle_epi8(table, unpack_nibbles_16(w[i].qs));
    const __m256i q1 = _mm256_shuffle_epi8(table, unpack_nibbles_16(w[i + 1].qs));
    const __m256i p0 = dot_s8(q0, load256(a[i].qs)), p1 = dot_s8(q1, load256(a[i + 1].qs));
    acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_set1_ps(Scale(w[i]) * half_to_float(a[i].d)), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1), _mm256_set1_ps(Scale(w[i + 1]) * half_to_float(a[i + 1].d)), acc1);
  }
  for (; i < nb; ++i) {
    const __m256i q = _mm256_shuffle_epi8(table, unpack_nibbles_16(w[i].qs));
    acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_s8(q, load256(a[i].qs))),
                           _mm256_set1_ps(Scale(w[i]) * half_to_float(a[i].d)), acc0);
  }
  return hsum(_mm256_add_ps(acc0, acc1));
}

inline __m256 load_bf16(const uint16_t* p) {
  const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}
inline __m256 load_f16(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m256 load_f32(const float* p) { return _mm256_loadu_ps(p); }

template <typename T, __m256 (*Load)(const T*), float (*Scalar)(T)>
float dot_float(int64_t n, const T* w, const float* x) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int k = 0; k < 4; ++k) acc[k] = _mm256_fmadd_ps(Load(w + i + 8 * k), _mm256_loadu_ps(x + i + 8 * k), acc[k]);
  for (; i + 8 <= n; i += 8) acc[0] = _mm256_fmadd_ps(Load(w + i), _mm256_loadu_ps(x + i), acc[0]);
  float sum = hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  for (; i < n; ++i) sum += Scalar(w[i]) * x[i];
  return sum;
}

float identity(float v) { return v; }
float f16_scalar(uint16_t h) { return half_to_float(h); }
float bf16_scalar(uint16_t h) { return fp32_from_bits(static_cast<uint32_t>(h) << 16); }

// ---- dequantization ------------------------------------------------------------

// 32 int8 values -> 32 floats, each value * d (+ m when Offset).
template <bool Offset = false>
inline void store_scaled(__m256i q, float d, float* y, float m = 0) {
  const __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);
  const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
  const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
  for (int k = 0; k < 4; ++k) {
    __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[k])), vd);
    if constexpr (Offset) v = _mm256_add_ps(v, vm);
    _mm256_storeu_ps(y + 8 * k, v);
  }
}

// 32 levels (unsigned, < 128) -> d * q - m, as the K-quant reference computes it.
inline void store_affine_k(__m256i q, float d, float m, float* y) {
  const __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);
  const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
  const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
  for (int k = 0; k < 4; ++k) {
    const __m256 v = _mm256_mul_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[k])));
    _mm256_storeu_ps(y + 8 * k, _mm256_sub_ps(v, vm));
  }
}

template <bool HighBits, typename Block>
void dequant_q45_k(const Block* b, float* y, int64_t nb) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
  for (int64_t i = 0; i < nb; ++i) {
    const float d = half_to_float(b[i].d), dmin = half_to_float(b[i].dmin);
    __m256i hv = _mm256_setzero_si256();
    if constexpr (HighBits) hv = load256(b[i].qh);
    for (int c = 0; c < 4; ++c, y += 64) {
      uint8_t sc, m;
      const __m256i q = load256(b[i].qs + 32 * c);
      __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
      if constexpr (HighBits) {
        lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hv, 2 * c), one), 4));
        hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hv, 2 * c + 1), one), 4));
      }
      kquant_scale_min(2 * c, b[i].scales, sc, m);
      store_affine_k(lo, d * static_cast<float>(sc), dmin * static_cast<float>(m), y);
      kquant_scale_min(2 * c + 1, b[i].scales, sc, m);
      store_affine_k(hi, d * static_cast<float>(sc), dmin * static_cast<float>(m), y + 32);
    }
  }
}

void dequant_q6_k(const BlockQ6_K* b, float* y, int64_t nb) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), off = _mm256_set1_epi8(32);
  for (int64_t i = 0; i < nb; ++i) {
    const float d = half_to_float(b[i].d);
    for (int h = 0; h < 2; ++h, y += 128) {
      const __m256i qh = load256(b[i].qh + 32 * h);
      const __m256i ql0 = load256(b[i].ql + 64 * h), ql1 = load256(b[i].ql + 64 * h + 32);
      __m256i q[4];
      q[0] = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(0x03)), 4));
      q[1] = _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(0x0C)), 2));
      q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, _mm256_set1_epi8(0x30)));
      q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                             _mm256_srli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(static_cast<char>(0xC0))), 2));
      const int8_t* sc = b[i].scales + 8 * h;
      for (int k = 0; k < 4; ++k) {
        const __m256i v = _mm256_sub_epi8(q[k], off);
        // Sub-blocks of 16 have their own scale: (d * sc) * q as the reference.
        const __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
        const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
        for (int p = 0; p < 4; ++p) {
          const __m256 ds = _mm256_set1_ps(d * static_cast<float>(sc[2 * k + p / 2]));
          _mm256_storeu_ps(y + 32 * k + 8 * p, _mm256_mul_ps(ds, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[p]))));
        }
      }
    }
  }
}

}  // namespace

void quantize_q8_0(const float* x, BlockQ8_0* y, int64_t n) {
  for (int64_t i = 0; i < n / QK8_0; ++i, x += QK8_0) {
    const float d = block_absmax(x, QK8_0) / 127;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    y[i].d = float_to_half(d);
    quantize_32(x, _mm256_set1_ps(id), y[i].qs);
  }
}

void quantize_q8_1(const float* x, BlockQ8_1* y, int64_t n) {
  for (int64_t i = 0; i < n / QK8_1; ++i, x += QK8_1) {
    const float d = block_absmax(x, QK8_1) / 127;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    const int sum = hsum_i32(quantize_32(x, _mm256_set1_ps(id), y[i].qs));
    y[i].d = float_to_half(d);
    y[i].s = float_to_half(static_cast<float>(sum) * d);
  }
}

void quantize_q8_K(const float* x, BlockQ8_K* y, int64_t n) {
  for (int64_t i = 0; i < n / QK_K; ++i, x += QK_K) {
    const float d = block_absmax(x, QK_K) / 127;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    y[i].d = d;
    const __m256 vid = _mm256_set1_ps(id);
    for (int g = 0; g < QK_K / 32; ++g) {
      quantize_32(x + 32 * g, vid, y[i].qs + 32 * g);
      // Sums of 16: from the stored bytes (two 16-byte halves).
      const __m256i q = load256(y[i].qs + 32 * g);
      const __m256i s16 = _mm256_maddubs_epi16(_mm256_set1_epi8(1), q);      // pairs
      const __m256i s32 = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));      // quads
      __m128i h = _mm_hadd_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
      h = _mm_hadd_epi32(h, h);  // [sum 0..15, sum 16..31, ...]
      y[i].bsums[2 * g] = static_cast<int16_t>(_mm_cvtsi128_si32(h));
      y[i].bsums[2 * g + 1] = static_cast<int16_t>(_mm_extract_epi32(h, 1));
    }
  }
}

void quantize_act_row(DType act_type, int offset, const float* x, int64_t n, void* blocks, void* side) {
  switch (act_type) {
    case DType::Q8_0: {
      auto* b = static_cast<BlockQ8_0*>(blocks);
      auto* s = static_cast<ActSideQ8_0*>(side);
      for (int64_t i = 0; i < n / QK8_0; ++i, x += QK8_0) {
        const float d = block_absmax(x, QK8_0) / 127;
        const float id = d != 0 ? 1.0f / d : 0.0f;
        b[i].d = float_to_half(d);
        const int sum = hsum_i32(quantize_32(x, _mm256_set1_ps(id), b[i].qs));
        s[i].d = half_to_float(b[i].d);
        s[i].c = offset * sum;
      }
      return;
    }
    case DType::Q8_1: {
      auto* b = static_cast<BlockQ8_1*>(blocks);
      auto* s = static_cast<ActSideQ8_1*>(side);
      quantize_q8_1(x, b, n);
      for (int64_t i = 0; i < n / QK8_1; ++i) s[i] = {half_to_float(b[i].d), half_to_float(b[i].s)};
      return;
    }
    case DType::Q8_K: {
      auto* b = static_cast<BlockQ8_K*>(blocks);
      auto* s = static_cast<ActSideQ8_K*>(side);
      quantize_q8_K(x, b, n);
      for (int64_t i = 0; i < n / QK_K; ++i)
        for (int j = 0; j < 8; ++j) s[i].bs32[j] = static_cast<int16_t>(b[i].bsums[2 * j] + b[i].bsums[2 * j + 1]);
      return;
    }
    default: fail("quantize_act_row: {} is not an activation format", dtype_name(act_type));
  }
}

float vec_dot(DType type, int64_t n, const void* w, const void* a) {
  const int64_t nb = n / dtype_block_size(type);
  const float* x = static_cast<const float*>(a);
  switch (type) {
    case DType::F32: return dot_float<float, load_f32, identity>(n, static_cast<const float*>(w), x);
    case DType::F16: return dot_float<uint16_t, load_f16, f16_scalar>(n, static_cast<const uint16_t*>(w), x);
    case DType::BF16: return dot_float<uint16_t, load_bf16, bf16_scalar>(n, static_cast<const uint16_t*>(w), x);
    case DType::Q4_0: return dot_q4_0(nb, static_cast<const BlockQ4_0*>(w), static_cast<const BlockQ8_0*>(a));
    case DType::Q4_1: return dot_q4_1(nb, static_cast<const BlockQ4_1*>(w), static_cast<const BlockQ8_1*>(a));
    case DType::Q5_0: return dot_q5_0(nb, static_cast<const BlockQ5_0*>(w), static_cast<const BlockQ8_0*>(a));
    case DType::Q5_1: return dot_q5_1(nb, static_cast<const BlockQ5_1*>(w), static_cast<const BlockQ8_1*>(a));
    case DType::Q8_0: return dot_q8_0(nb, static_cast<const BlockQ8_0*>(w), static_cast<const BlockQ8_0*>(a));
    case DType::Q4_K:
      return dot_q45_k<false>(nb, static_cast<const BlockQ4_K*>(w), static_cast<const BlockQ8_K*>(a));
    case DType::Q5_K:
      return dot_q45_k<true>(nb, static_cast<const BlockQ5_K*>(w), static_cast<const BlockQ8_K*>(a));
    case DType::Q6_K: return dot_q6_k(nb, static_cast<const BlockQ6_K*>(w), static_cast<const BlockQ8_K*>(a));
    case DType::Q2_K: return dot_q2_k(nb, static_cast<const BlockQ2_K*>(w), static_cast<const BlockQ8_K*>(a));
    case DType::Q3_K: return dot_q3_k(nb, static_cast<const BlockQ3_K*>(w), static_cast<const BlockQ8_K*>(a));
    case DType::IQ4_XS: return dot_iq4_xs(nb, static_cast<const BlockIQ4_XS*>(w), static_cast<const BlockQ8_K*>(a));
    case DType::IQ4_NL:
      return dot_table4<BlockIQ4_NL, iq4nl_scale>(nb, static_cast<const BlockIQ4_NL*>(w),
                                                  static_cast<const BlockQ8_0*>(a), kIQ4NLValues);
    case DType::MXFP4:
      return dot_table4<BlockMXFP4, mxfp4_scale>(nb, static_cast<const BlockMXFP4*>(w),
                                                 static_cast<const BlockQ8_0*>(a), kMXFP4Values);
    default: fail("vec_dot: no kernel for weight type {}", dtype_name(type));
  }
}

bool dequantize_row(DType type, const void* src, float* y, int64_t n) {
  const int64_t nb = n / dtype_block_size(type);
  switch (type) {
    case DType::F16: {
      const auto* s = static_cast<const uint16_t*>(src);
      int64_t i = 0;
      for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, load_f16(s + i));
      for (; i < n; ++i) y[i] = half_to_float(s[i]);
      return true;
    }
    case DType::BF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      int64_t i = 0;
      for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, load_bf16(s + i));
      for (; i < n; ++i) y[i] = bf16_scalar(s[i]);
      return true;
    }
    case DType::Q4_0: {
      const auto* b = static_cast<const BlockQ4_0*>(src);
      for (int64_t i = 0; i < nb; ++i)
        store_scaled(_mm256_sub_epi8(unpack_nibbles_16(b[i].qs), _mm256_set1_epi8(8)), half_to_float(b[i].d), y + 32 * i);
      return true;
    }
    case DType::Q4_1: {
      const auto* b = static_cast<const BlockQ4_1*>(src);
      for (int64_t i = 0; i < nb; ++i)
        store_scaled<true>(unpack_nibbles_16(b[i].qs), half_to_float(b[i].d), y + 32 * i, half_to_float(b[i].m));
      return true;
    }
    case DType::Q5_0: {
      const auto* b = static_cast<const BlockQ5_0*>(src);
      for (int64_t i = 0; i < nb; ++i) {
        const __m256i q = _mm256_or_si256(unpack_nibbles_16(b[i].qs), fifth_bits(b[i].qh));
        store_scaled(_mm256_sub_epi8(q, _mm256_set1_epi8(16)), half_to_float(b[i].d), y + 32 * i);
      }
      return true;
    }
    case DType::Q5_1: {
      const auto* b = static_cast<const BlockQ5_1*>(src);
      for (int64_t i = 0; i < nb; ++i) {
        const __m256i q = _mm256_or_si256(unpack_nibbles_16(b[i].qs), fifth_bits(b[i].qh));
        store_scaled<true>(q, half_to_float(b[i].d), y + 32 * i, half_to_float(b[i].m));
      }
      return true;
    }
    case DType::Q8_0: {
      const auto* b = static_cast<const BlockQ8_0*>(src);
      for (int64_t i = 0; i < nb; ++i) store_scaled(load256(b[i].qs), half_to_float(b[i].d), y + 32 * i);
      return true;
    }
    case DType::Q4_K: dequant_q45_k<false>(static_cast<const BlockQ4_K*>(src), y, nb); return true;
    case DType::Q5_K: dequant_q45_k<true>(static_cast<const BlockQ5_K*>(src), y, nb); return true;
    case DType::Q6_K: dequant_q6_k(static_cast<const BlockQ6_K*>(src), y, nb); return true;
    default: return false;  // F32, Q8_1, Q8_K: the reference is as fast
  }
}

}  // namespace pagellm::cpu::avx2
