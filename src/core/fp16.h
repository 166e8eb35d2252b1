// Scalar half / bfloat16 conversions, bit-exact with IEEE round-to-nearest-even.
// SIMD kernels convert with F16C / AVX-512 themselves; tests compare the two.
#pragma once

#include <cstdint>
#include <cstring>

namespace pagellm {

inline float fp32_from_bits(uint32_t w) {
  float f;
  std::memcpy(&f, &w, 4);
  return f;
}
inline uint32_t fp32_to_bits(float f) {
  uint32_t w;
  std::memcpy(&w, &f, 4);
  return w;
}

inline float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24
    const float v = static_cast<float>(mant) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  if (exp == 31) return fp32_from_bits(sign | 0x7f800000u | (mant << 13));  // inf / nan
  return fp32_from_bits(sign | ((exp + 112) << 23) | (mant << 13));
}

// Rounds `value >> shift` to nearest, ties to even.
inline uint32_t round_shift_rne(uint32_t value, uint32_t shift) {
  const uint32_t kept = value >> shift;
  const uint32_t rest = value & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  return kept + ((rest > half || (rest == half && (kept & 1))) ? 1 : 0);
}

inline uint16_t fp32_to_fp16(float f) {
  uint32_t x = fp32_to_bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) return sign | 0x7c00u | (x > 0x7f800000u ? 0x200u : 0u);  // inf / nan
  if (x >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to inf
  const uint32_t e = x >> 23;
  if (e < 113) {                     // below 2^-14: half subnormal (or zero)
    if (e < 102) return sign;        // < 2^-25 rounds to zero
    const uint32_t m = (x & 0x7fffffu) | 0x800000u;
    return sign | static_cast<uint16_t>(round_shift_rne(m, 126 - e));
  }
  // Normal: rebias the exponent; a mantissa carry correctly bumps the exponent.
  const uint32_t bits = ((e - 112) << 23) | (x & 0x7fffffu);
  return sign | static_cast<uint16_t>(round_shift_rne(bits, 13));
}

inline float bf16_to_fp32(uint16_t h) { return fp32_from_bits(static_cast<uint32_t>(h) << 16); }

inline uint16_t fp32_to_bf16(float f) {
  const uint32_t x = fp32_to_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet nan
  return static_cast<uint16_t>(round_shift_rne(x, 16));
}

}  // namespace pagellm
