// AVX-512 VNNI row dot products (vec_dot) of the hot weight types. Their
// integer sums per block are exact (as the scalar and AVX2 ones); only the
// order of the float accumulation differs.
//
// vpdpbusd multiplies unsigned by signed bytes. Weights stored with a zero
// point (Q4_0: 8, Q6_K: 32) go in as their unsigned levels and the zero point
// comes out against the activation sums; signed Q8_0 weights go in as
// w + 128 (sign bit flipped) and 128 * (activation sum) comes out.
#pragma GCC optimize("fp-contract=off")

// GCC 12 warns about the intentionally undefined source operands inside the
// AVX-512 intrinsics' own headers (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/quants_kernels.h"
#include "core/error.h"

namespace pagellm::cpu::avx512 {
namespace {

inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }

inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline __m512i load_pair(const void* lo, const void* hi) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(load256(lo)), load256(hi), 1);
}

// Lanes 0-7 = a, lanes 8-15 = b.
inline __m512 halves(float a, float b) { return _mm512_mask_mov_ps(_mm512_set1_ps(a), 0xFF00, _mm512_set1_ps(b)); }
inline __m512i halves_i32(int a, int b) {
  return _mm512_mask_mov_epi32(_mm512_set1_epi32(a), 0xFF00, _mm512_set1_epi32(b));
}

// 16 bytes of nibbles -> 32 levels: low nibbles first (Q4_0's element order).
inline __m256i nibbles_16(const uint8_t* qs) {
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(0x0F));
}

inline __m512i dpbusd(__m512i acc, __m512i u, __m512i s) { return _mm512_dpbusd_epi32(acc, u, s); }

// Blocks of 32 (Q4_0, Q8_0) two at a time: Levels(block) gives the 32
// unsigned levels, kZero the zero point they carry.
template <typename Block, int kZero, __m256i (*Levels)(const Block&)>
float dot_32(int64_t nb, const Block* w, const BlockQ8_0* a) {
  const __m512i zero_point = _mm512_set1_epi8(static_cast<char>(kZero));
  __m512 acc = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 2 <= nb; i += 2) {
    const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(Levels(w[i])), Levels(w[i + 1]), 1);
    const __m512i y = load_pair(a[i].qs, a[i + 1].qs);
    const __m512i p = _mm512_sub_epi32(dpbusd(_mm512_setzero_si512(), q, y), dpbusd(_mm512_setzero_si512(), zero_point, y));
    const __m512 d = halves(half_to_float(w[i].d) * half_to_float(a[i].d), half_to_float(w[i + 1].d) * half_to_float(a[i + 1].d));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), d, acc);
  }
  float sum = _mm512_reduce_add_ps(acc);
  if (i < nb) {  // an odd last block, in 256 bits
    const __m256i y = load256(a[i].qs);
    const __m256i p = _mm256_sub_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), Levels(w[i]), y),
                                       _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm512_castsi512_si256(zero_point), y));
    const __m256i s = _mm256_add_epi32(p, _mm256_permute2x128_si256(p, p, 1));
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm_shuffle_epi32(_mm256_castsi256_si128(s), 0x4e));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
    sum += static_cast<float>(_mm_cvtsi128_si32(h)) * (half_to_float(w[i].d) * half_to_float(a[i].d));
  }
  return sum;
}

__m256i levels_q4_0(const BlockQ4_0& b) { return nibbles_16(b.qs); }
__m256i levels_q8_0(const BlockQ8_0& b) { return _mm256_xor_si256(load256(b.qs), _mm256_set1_epi8(static_cast<char>(0x80))); }

int kquant_min_sum(const uint8_t* mins, const int16_t* bsums) {
  int s = 0;
  for (int j = 0; j < 8; ++j) s += mins[j] * (bsums[2 * j] + bsums[2 * j + 1]);
  return s;
}

// Q4_K: 64 bytes of qs hold sub-blocks 4k, 4k + 2 (low nibbles of each 32)
// and 4k + 1, 4k + 3 (high nibbles).
float dot_q4_k(int64_t nb, const BlockQ4_K* w, const BlockQ8_K* a) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  __m512 acc = _mm512_setzero_ps();
  float mins_total = 0;
  for (int64_t i = 0; i < nb; ++i) {
    uint8_t sc[8], mn[8];
    for (int j = 0; j < 8; ++j) kquant_scale_min(j, w[i].scales, sc[j], mn[j]);
    __m512i isum = _mm512_setzero_si512();
    for (int k = 0; k < 2; ++k) {
      const __m512i q = _mm512_loadu_si512(w[i].qs + 64 * k);
      const __m512i lo = _mm512_and_si512(q, m4), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
      const int8_t* y = a[i].qs + 128 * k;
      const __m512i s_lo = dpbusd(_mm512_setzero_si512(), lo, load_pair(y, y + 64));
      const __m512i s_hi = dpbusd(_mm512_setzero_si512(), hi, load_pair(y + 32, y + 96));
      isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(s_lo, halves_i32(sc[4 * k], sc[4 * k + 2])));
      isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(s_hi, halves_i32(sc[4 * k + 1], sc[4 * k + 3])));
    }
    const float dw = half_to_float(w[i].d), dmin = half_to_float(w[i].dmin);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(a[i].d * dw), acc);
    mins_total += a[i].d * dmin * static_cast<float>(kquant_min_sum(mn, a[i].bsums));
  }
  return _mm512_reduce_add_ps(acc) - mins_total;
}

// Q6_K: per half h, ql[64h, 64h + 64) gives elements 128h + 0..63 (low
// nibbles) and 128h + 64..127 (high nibbles); the 2 high bits of element
// 128h + 32s + l are bits 2s, 2s + 1 of qh[32h + l].
float dot_q6_k(int64_t nb, const BlockQ6_K* w, const BlockQ8_K* a) {
  const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
  // Per 16-bit lane: the shifts that bring run s's high bits to bits 4-5.
  const __m512i up_01 = _mm512_mask_mov_epi16(_mm512_set1_epi16(4), 0xFFFF0000u, _mm512_set1_epi16(2));
  const __m512i down_23 = _mm512_mask_mov_epi16(_mm512_setzero_si512(), 0xFFFF0000u, _mm512_set1_epi16(2));
  // Scales per int32 lane (4 lanes = 16 elements), for runs 0-1 and 2-3 of a half.
  const __m512i pick_01 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  const __m512i pick_23 = _mm512_add_epi32(pick_01, _mm512_set1_epi32(4));
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    int correction = 0;  // sum_s sc[s] * bsums[s]: the -32 of every level
    for (int s = 0; s < 16; ++s) correction += w[i].scales[s] * a[i].bsums[s];
    const __m512i sc = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w[i].scales)));
    __m512i isum = _mm512_setzero_si512();
    for (int h = 0; h < 2; ++h) {
      const __m512i ql = _mm512_loadu_si512(w[i].ql + 64 * h);
      const __m512i qh = _mm512_broadcast_i64x4(load256(w[i].qh + 32 * h));
      const __m512i q01 = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_and_si512(_mm512_sllv_epi16(qh, up_01), m30));
      const __m512i q23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                          _mm512_and_si512(_mm512_srlv_epi16(qh, down_23), m30));
      const int8_t* y = a[i].qs + 128 * h;
      const __m512i s01 = dpbusd(_mm512_setzero_si512(), q01, _mm512_loadu_si512(y));
      const __m512i s23 = dpbusd(_mm512_setzero_si512(), q23, _mm512_loadu_si512(y + 64));
      const __m512i hsc = _mm512_add_epi32(_mm512_set1_epi32(8 * h), pick_01);
      isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(s01, _mm512_permutexvar_epi32(hsc, sc)));
      isum = _mm512_add_epi32(
          isum, _mm512_mullo_epi32(s23, _mm512_permutexvar_epi32(_mm512_add_epi32(_mm512_set1_epi32(8 * h), pick_23), sc)));
    }
    isum = _mm512_mask_sub_epi32(isum, 1, isum, _mm512_set1_epi32(32 * correction));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(a[i].d * half_to_float(w[i].d)), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

}  // namespace

bool has_vec_dot(DType weight_type) {
  switch (weight_type) {
    case DType::Q4_0:
    case DType::Q8_0:
    case DType::Q4_K:
    case DType::Q6_K: return true;
    default: return false;
  }
}

float vec_dot(DType type, int64_t n, const void* w, const void* a) {
  const int64_t nb = n / dtype_block_size(type);
  switch (type) {
    case DType::Q4_0:
      return dot_32<BlockQ4_0, 8, levels_q4_0>(nb, static_cast<const BlockQ4_0*>(w), static_cast<const BlockQ8_0*>(a));
    case DType::Q8_0:
      return dot_32<BlockQ8_0, 128, levels_q8_0>(nb, static_cast<const BlockQ8_0*>(w), static_cast<const BlockQ8_0*>(a));
    case DType::Q4_K: return dot_q4_k(nb, static_cast<const BlockQ4_K*>(w), static_cast<const BlockQ8_K*>(a));
    case DType::Q6_K: return dot_q6_k(nb, static_cast<const BlockQ6_K*>(w), static_cast<const BlockQ8_K*>(a));
    default: fail("vec_dot: no AVX-512 VNNI kernel for weight type {}", dtype_name(type));
  }
}

}  // namespace pagellm::cpu::avx512
