// Dot-product bodies shared by quants_neon.cpp and quants_neon_dotprod.cpp.
// Included once per level inside a distinct namespace (NEON_NS); with
// NEON_DOTPROD the 16-lane int8 dots are vdotq_s32, without it widening
// multiplies with pairwise accumulation (the same exact integer sums).
#include <arm_neon.h>

#include <cstring>

#include "backend/cpu/kernels_neon.h"
#include "core/error.h"
#include "core/fp16.h"
#include "core/quant_blocks.h"

namespace pagellm::cpu::NEON_NS {
namespace {

// acc + the four 4-lane partial sums of a[i] * b[i] (16 int8 lanes). No
// overflow: |a[i] * b[i]| <= 128 * 127 fits int16 even before the pairwise add.
inline int32x4_t dot16(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(NEON_DOTPROD)
  return vdotq_s32(acc, a, b);
#else
  acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
  return vpadalq_s16(acc, vmull_high_s8(a, b));
#endif
}

float dot_q4_0(int64_t nb, const BlockQ4_0* w, const BlockQ8_0* a) {
  const uint8x16_t low4 = vdupq_n_u8(0x0F);
  const int8x16_t eight = vdupq_n_s8(8);
  float sum = 0;
  for (int64_t i = 0; i < nb; ++i) {
    const uint8x16_t q = vld1q_u8(w[i].qs);
    const int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, low4)), eight);
    const int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), eight);
    int32x4_t acc = dot16(vdupq_n_s32(0), lo, vld1q_s8(a[i].qs));
    acc = dot16(acc, hi, vld1q_s8(a[i].qs + 16));
    sum += static_cast<float>(vaddvq_s32(acc)) * (fp16_to_fp32(w[i].d) * fp16_to_fp32(a[i].d));
  }
  return sum;
}

float dot_q8_0(int64_t nb, const BlockQ8_0* w, const BlockQ8_0* a) {
  float sum = 0;
  for (int64_t i = 0; i < nb; ++i) {
    int32x4_t acc = dot16(vdupq_n_s32(0), vld1q_s8(w[i].qs), vld1q_s8(a[i].qs));
    acc = dot16(acc, vld1q_s8(w[i].qs + 16), vld1q_s8(a[i].qs + 16));
    sum += static_cast<float>(vaddvq_s32(acc)) * (fp16_to_fp32(w[i].d) * fp16_to_fp32(a[i].d));
  }
  return sum;
}

// Q6_K: element 128h + 32k + l (k = 0..3, l = 0..31) has its low 4 bits in
// ql[64h + l (+32 for k odd)] (high nibble for k >= 2) and its top 2 bits at
// bits 2k of qh[32h + l]; each 16 elements share a scale.
float dot_q6_k(int64_t nb, const BlockQ6_K* w, const BlockQ8_K* a) {
  const uint8x16_t low4 = vdupq_n_u8(0x0F), two = vdupq_n_u8(0x03);
  const int8x16_t off = vdupq_n_s8(32);
  float sum = 0;
  for (int64_t i = 0; i < nb; ++i) {
    int isum = 0;
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = w[i].ql + 64 * h;
      const uint8_t* qh = w[i].qh + 32 * h;
      const int8_t* sc = w[i].scales + 8 * h;
      const int8_t* y = a[i].qs + 128 * h;
      for (int half = 0; half < 2; ++half) {  // l in [16 half, 16 half + 16): scales sc[half + 2k]
        const int l = 16 * half;
        const uint8x16_t lq0 = vld1q_u8(ql + l), lq1 = vld1q_u8(ql + l + 32), hq = vld1q_u8(qh + l);
        const uint8x16_t u0 = vorrq_u8(vandq_u8(lq0, low4), vshlq_n_u8(vandq_u8(hq, two), 4));
        const uint8x16_t u1 = vorrq_u8(vandq_u8(lq1, low4), vshlq_n_u8(vandq_u8(vshrq_n_u8(hq, 2), two), 4));
        const uint8x16_t u2 = vorrq_u8(vshrq_n_u8(lq0, 4), vshlq_n_u8(vandq_u8(vshrq_n_u8(hq, 4), two), 4));
        const uint8x16_t u3 = vorrq_u8(vshrq_n_u8(lq1, 4), vshlq_n_u8(vshrq_n_u8(hq, 6), 4));
        const int32x4_t zero = vdupq_n_s32(0);
        const int p0 = vaddvq_s32(dot16(zero, vsubq_s8(vreinterpretq_s8_u8(u0), off), vld1q_s8(y + l)));
        const int p1 = vaddvq_s32(dot16(zero, vsubq_s8(vreinterpretq_s8_u8(u1), off), vld1q_s8(y + l + 32)));
        const int p2 = vaddvq_s32(dot16(zero, vsubq_s8(vreinterpretq_s8_u8(u2), off), vld1q_s8(y + l + 64)));
        const int p3 = vaddvq_s32(dot16(zero, vsubq_s8(vreinterpretq_s8_u8(u3), off), vld1q_s8(y + l + 96)));
        isum += sc[half] * p0 + sc[half + 2] * p1 + sc[half + 4] * p2 + sc[half + 6] * p3;
      }
    }
    sum += a[i].d * (fp16_to_fp32(w[i].d) * static_cast<float>(isum));
  }
  return sum;
}

// 16 bytes, 0x10 where bit i of the 16-bit mask is set (byte i): a Q5 block's fifth bits.
inline uint8x16_t fifth_bits(uint32_t bits) {
  static const uint8_t kBit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
  const uint8x16_t spread = vcombine_u8(vdup_n_u8(static_cast<uint8_t>(bits)), vdup_n_u8(static_cast<uint8_t>(bits >> 8)));
  return vandq_u8(vtstq_u8(spread, vld1q_u8(kBit)), vdupq_n_u8(0x10));
}

inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// The integer sum of a 32-value Q4/Q5 block's levels lo (elements 0..15) and
// hi (16..31) with activations y.
inline int block_sum(int8x16_t lo, int8x16_t hi, const int8_t* y) {
  return vaddvq_s32(dot16(dot16(vdupq_n_s32(0), lo, vld1q_s8(y)), hi, vld1q_s8(y + 16)));
}

float dot_q4_1(int64_t nb, const BlockQ4_1* w, const BlockQ8_1* a) {
  const uint8x16_t low4 = vdupq_n_u8(0x0F);
  float sum = 0;
  for (int64_t i = 0; i < nb; ++i) {
    const uint8x16_t q = vld1q_u8(w[i].qs);
    const int isum = block_sum(vreinterpretq_s8_u8(vandq_u8(q, low4)), vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), a[i].qs);
    sum += static_cast<float>(isum) * (fp16_to_fp32(w[i].d) * fp16_to_fp32(a[i].d)) +
           fp16_to_fp32(w[i].m) * fp16_to_fp32(a[i].s);
  }
  return sum;
}

// Q5_0 / Q5_1: nibble | fifth bit (bit j of qh for element j, bit j + 16 for element j + 16).
template <typename Block>
inline void q5_levels(const Block& b, uint8x16_t& lo, uint8x16_t& hi) {
  const uint32_t qh = load_u32(b.qh);
  const uint8x16_t q = vld1q_u8(b.qs);
  lo = vorrq_u8(vandq_u8(q, vdupq_n_u8(0x0F)), fifth_bits(qh & 0xFFFF));
  hi = vorrq_u8(vshrq_n_u8(q, 4), fifth_bits(qh >> 16));
}

float dot_q5_0(int64_t nb, const BlockQ5_0* w, const BlockQ8_0* a) {
  const int8x16_t sixteen = vdupq_n_s8(16);
  float sum = 0;
  for (int64_t i = 0; i < nb; ++i) {
    uint8x16_t lo, hi;
    q5_levels(w[i], lo, hi);
    const int isum = block_sum(vsubq_s8(vreinterpretq_s8_u8(lo), sixteen), vsubq_s8(vreinterpretq_s8_u8(hi), sixteen),
                               a[i].qs);
    sum += static_cast<float>(isum) * (fp16_to_fp32(w[i].d) * fp16_to_fp32(a[i].d));
  }
  return sum;
}

float dot_q5_1(int64_t nb, const BlockQ5_1* w, const BlockQ8_1* a) {
  float sum = 0;
  for (int64_t i = 0; i < nb; ++i) {
    uint8x16_t lo, hi;
    q5_levels(w[i], lo, hi);
    const int isum = block_sum(vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi), a[i].qs);
    sum += static_cast<float>(isum) * (fp16_to_fp32(w[i].d) * fp16_to_fp32(a[i].d)) +
           fp16_to_fp32(w[i].m) * fp16_to_fp32(a[i].s);
  }
  return sum;
}

// IQ4_NL and MXFP4: each nibble indexes a 16-entry table of int8 levels.
template <typename Block, const int8_t* Levels, float (*Scale)(const Block&)>
float dot_table4(int64_t nb, const Block* w, const BlockQ8_0* a) {
  const int8x16_t table = vld1q_s8(Levels);
  const uint8x16_t low4 = vdupq_n_u8(0x0F);
  float sum = 0;
  for (int64_t i = 0; i < nb; ++i) {
    const uint8x16_t q = vld1q_u8(w[i].qs);
    const int isum = block_sum(vqtbl1q_s8(table, vandq_u8(q, low4)), vqtbl1q_s8(table, vshrq_n_u8(q, 4)), a[i].qs);
    sum += static_cast<float>(isum) * (Scale(w[i]) * fp16_to_fp32(a[i].d));
  }
  return sum;
}
inline float iq4nl_scale(const BlockIQ4_NL& b) { return fp16_to_fp32(b.d); }
inline float mxfp4_scale(const BlockMXFP4& b) { return e8m0_to_fp32_half(b.e); }

float dot_iq4_xs(int64_t nb, const BlockIQ4_XS* w, const BlockQ8_K* a) {
  const int8x16_t table = vld1q_s8(kIQ4NLValues);
  const uint8x16_t low4 = vdupq_n_u8(0x0F);
  float sum = 0;
  for (int64_t i = 0; i < nb; ++i) {
    int isum = 0;
    for (int j = 0; j < 8; ++j) {
      const uint8x16_t q = vld1q_u8(w[i].qs + 16 * j);
      isum += iq4xs_scale(w[i], j) *
              block_sum(vqtbl1q_s8(table, vandq_u8(q, low4)), vqtbl1q_s8(table, vshrq_n_u8(q, 4)), a[i].qs + 32 * j);
    }
    sum += a[i].d * (fp16_to_fp32(w[i].d) * static_cast<float>(isum));
  }
  return sum;
}

// Q4_K and Q5_K (HighBits: each element's fifth bit, bit 2c or 2c + 1 of qh[l]
// for the low or high nibbles of chunk c).
template <bool HighBits, typename Block>
float dot_q45_k(int64_t nb, const Block* w, const BlockQ8_K* a) {
  const uint8x16_t low4 = vdupq_n_u8(0x0F), sixteen = vdupq_n_u8(0x10);
  float sum = 0;
  for (int64_t i = 0; i < nb; ++i) {
    uint8x16_t h0 = vdupq_n_u8(0), h1 = h0;
    if constexpr (HighBits) h0 = vld1q_u8(w[i].qh), h1 = vld1q_u8(w[i].qh + 16);
    int isum = 0, imin = 0;
    for (int c = 0; c < 4; ++c) {
      uint8_t sc_lo, sc_hi, m_lo, m_hi;
      kquant_scale_min(2 * c, w[i].scales, sc_lo, m_lo);
      kquant_scale_min(2 * c + 1, w[i].scales, sc_hi, m_hi);
      const uint8x16_t q0 = vld1q_u8(w[i].qs + 32 * c), q1 = vld1q_u8(w[i].qs + 32 * c + 16);
      const uint8x16_t bit_lo = vdupq_n_u8(static_cast<uint8_t>(1 << (2 * c)));
      const uint8x16_t bit_hi = vdupq_n_u8(static_cast<uint8_t>(2 << (2 * c)));
      const auto level = [&](uint8x16_t nib, uint8x16_t h, uint8x16_t bit) {
        if constexpr (HighBits) nib = vorrq_u8(nib, vandq_u8(vtstq_u8(h, bit), sixteen));
        return vreinterpretq_s8_u8(nib);
      };
      const int8_t* y = a[i].qs + 64 * c;
      int32x4_t lo = dot16(vdupq_n_s32(0), level(vandq_u8(q0, low4), h0, bit_lo), vld1q_s8(y));
      lo = dot16(lo, level(vandq_u8(q1, low4), h1, bit_lo), vld1q_s8(y + 16));
      int32x4_t hi = dot16(vdupq_n_s32(0), level(vshrq_n_u8(q0, 4), h0, bit_hi), vld1q_s8(y + 32));
      hi = dot16(hi, level(vshrq_n_u8(q1, 4), h1, bit_hi), vld1q_s8(y + 48));
      isum += sc_lo * vaddvq_s32(lo) + sc_hi * vaddvq_s32(hi);
      const int16_t* bs = a[i].bsums + 4 * c;
      imin += m_lo * (bs[0] + bs[1]) + m_hi * (bs[2] + bs[3]);
    }
    sum += a[i].d * (fp16_to_fp32(w[i].d) * static_cast<float>(isum) -
                     fp16_to_fp32(w[i].dmin) * static_cast<float>(imin));
  }
  return sum;
}

// Q2_K / Q3_K: element 128h + 32s + l is bits 2s..2s+1 of qs[32h + l];
// sub-block j (16 elements) is h = j / 8, s = j / 2 % 4, l from 16 (j % 2).
float dot_q2_k(int64_t nb, const BlockQ2_K* w, const BlockQ8_K* a) {
  const uint8x16_t three = vdupq_n_u8(3);
  float sum = 0;
  for (int64_t i = 0; i < nb; ++i) {
    int isum = 0, imin = 0;
    for (int h = 0; h < 2; ++h) {
      const uint8x16_t q[2] = {vld1q_u8(w[i].qs + 32 * h), vld1q_u8(w[i].qs + 32 * h + 16)};
      for (int s = 0; s < 4; ++s)
        for (int half = 0; half < 2; ++half) {
          const int j = 8 * h + 2 * s + half;
          const int8x16_t shift = vdupq_n_s8(static_cast<int8_t>(-2 * s));  // right by 2s
          const int8x16_t lv = vreinterpretq_s8_u8(vandq_u8(vshlq_u8(q[half], shift), three));
          const int part = vaddvq_s32(dot16(vdupq_n_s32(0), lv, vld1q_s8(a[i].qs + 16 * j)));
          isum += (w[i].scales[j] & 0x0F) * part;
          imin += (w[i].scales[j] >> 4) * a[i].bsums[j];
        }
    }
    sum += a[i].d * (fp16_to_fp32(w[i].d) * static_cast<float>(isum) -
                     fp16_to_fp32(w[i].dmin) * static_cast<float>(imin));
  }
  return sum;
}

float dot_q3_k(int64_t nb, const BlockQ3_K* w, const BlockQ8_K* a) {
  const uint8x16_t three = vdupq_n_u8(3), four = vdupq_n_u8(4);
  float sum = 0;
  for (int64_t i = 0; i < nb; ++i) {
    int8_t sc[16];
    q3k_scales(w[i].scales, sc);
    const uint8x16_t hm[2] = {vld1q_u8(w[i].hmask), vld1q_u8(w[i].hmask + 16)};
    int isum = 0;
    for (int h = 0; h < 2; ++h) {
      const uint8x16_t q[2] = {vld1q_u8(w[i].qs + 32 * h), vld1q_u8(w[i].qs + 32 * h + 16)};
      for (int s = 0; s < 4; ++s)
        for (int half = 0; half < 2; ++half) {
          const int j = 8 * h + 2 * s + half;
          const int8x16_t shift = vdupq_n_s8(static_cast<int8_t>(-2 * s));
          const uint8x16_t low = vandq_u8(vshlq_u8(q[half], shift), three);
          // level = low - 4 where the element's high bit (bit 4h + s of hmask[l]) is clear
          const uint8x16_t set = vtstq_u8(hm[half], vdupq_n_u8(static_cast<uint8_t>(1 << (4 * h + s))));
          const int8x16_t lv = vsubq_s8(vreinterpretq_s8_u8(low), vreinterpretq_s8_u8(vbicq_u8(four, set)));
          isum += sc[j] * vaddvq_s32(dot16(vdupq_n_s32(0), lv, vld1q_s8(a[i].qs + 16 * j)));
        }
    }
    sum += a[i].d * (fp16_to_fp32(w[i].d) * static_cast<float>(isum));
  }
  return sum;
}

}  // namespace

float vec_dot(DType type, int64_t n, const void* w, const void* a) {
  const int64_t nb = n / dtype_block_size(type);
  switch (type) {
    case DType::Q4_0: return dot_q4_0(nb, static_cast<const BlockQ4_0*>(w), static_cast<const BlockQ8_0*>(a));
    case DType::Q8_0: return dot_q8_0(nb, static_cast<const BlockQ8_0*>(w), static_cast<const BlockQ8_0*>(a));
    case DType::Q4_K: return dot_q45_k<false>(nb, static_cast<const BlockQ4_K*>(w), static_cast<const BlockQ8_K*>(a));
    case DType::Q6_K: return dot_q6_k(nb, static_cast<const BlockQ6_K*>(w), static_cast<const BlockQ8_K*>(a));
    case DType::Q4_1: return dot_q4_1(nb, static_cast<const BlockQ4_1*>(w), static_cast<const BlockQ8_1*>(a));
    case DType::Q5_0: return dot_q5_0(nb, static_cast<const BlockQ5_0*>(w), static_cast<const BlockQ8_0*>(a));
    case DType::Q5_1: return dot_q5_1(nb, static_cast<const BlockQ5_1*>(w), static_cast<const BlockQ8_1*>(a));
    case DType::Q5_K: return dot_q45_k<true>(nb, static_cast<const BlockQ5_K*>(w), static_cast<const BlockQ8_K*>(a));
    case DType::Q2_K: return dot_q2_k(nb, static_cast<const BlockQ2_K*>(w), static_cast<const BlockQ8_K*>(a));
    case DType::Q3_K: return dot_q3_k(nb, static_cast<const BlockQ3_K*>(w), static_cast<const BlockQ8_K*>(a));
    case DType::IQ4_XS: return dot_iq4_xs(nb, static_cast<const BlockIQ4_XS*>(w), static_cast<const BlockQ8_K*>(a));
    case DType::IQ4_NL:
      return dot_table4<BlockIQ4_NL, kIQ4NLValues, iq4nl_scale>(nb, static_cast<const BlockIQ4_NL*>(w),
                                                               static_cast<const BlockQ8_0*>(a));
    case DType::MXFP4:
      return dot_table4<BlockMXFP4, kMXFP4Values, mxfp4_scale>(nb, static_cast<const BlockMXFP4*>(w),
                                                              static_cast<const BlockQ8_0*>(a));
    default: fail("vec_dot: no NEON kernel for weight type {}", dtype_name(type));
  }
}

}  // namespace pagellm::cpu::NEON_NS
