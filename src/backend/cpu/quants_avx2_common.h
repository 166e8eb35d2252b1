// Small AVX2 helpers shared by the *_avx2.cpp kernels. Include only from files
// compiled with -mavx2 -mfma -mf16c.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "core/fp16.h"

namespace pagellm::cpu::avx2 {

inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }
inline uint16_t float_to_half(float f) { return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT)); }

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline int hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

// 16 bytes of packed nibbles -> 32 bytes: low nibbles first, then high ones
// (the Q4_0 / Q4_1 / Q5_x element order).
inline __m256i unpack_nibbles_16(const uint8_t* qs) {
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(0x0F));
}

// Bit i of `bits` -> byte i = 0xFF if set, else 0.
inline __m256i bits_to_bytes(uint32_t bits) {
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  return _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
}

// Per 32-bit lane: sum of 4 products of unsigned u (< 128 here) and signed s.
inline __m256i dot_u8s8(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

// Per 32-bit lane: sum of 4 products of two signed int8 vectors (|x| <= 127
// in at least one of them, so maddubs never saturates).
inline __m256i dot_s8(__m256i x, __m256i y) {
  return dot_u8s8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

}  // namespace pagellm::cpu::avx2
