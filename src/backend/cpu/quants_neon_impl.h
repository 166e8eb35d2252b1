// Dot-product bodies shared by quants_neon.cpp and quants_neon_dotprod.cpp.
// Included once per level inside a distinct namespace (NEON_NS); with
// NEON_DOTPROD the 16-lane int8 dots are vdotq_s32, without it widening
// multiplies with pairwise accumulation (the same exact integer sums).
#include <arm_neon.h>

#include "backend/cpu/kernels_neon.h"
#include "core/error.h"
#include "core/fp16.h"

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

float dot_q4_k(int64_t nb, const BlockQ4_K* w, const BlockQ8_K* a) {
  const uint8x16_t low4 = vdupq_n_u8(0x0F);
  float sum = 0;
  for (int64_t i = 0; i < nb; ++i) {
    int isum = 0, imin = 0;
    for (int c = 0; c < 4; ++c) {
      uint8_t sc_lo, sc_hi, m_lo, m_hi;
      kquant_scale_min(2 * c, w[i].scales, sc_lo, m_lo);
      kquant_scale_min(2 * c + 1, w[i].scales, sc_hi, m_hi);
      const uint8x16_t q0 = vld1q_u8(w[i].qs + 32 * c), q1 = vld1q_u8(w[i].qs + 32 * c + 16);
      const int8_t* y = a[i].qs + 64 * c;
      int32x4_t lo = dot16(vdupq_n_s32(0), vreinterpretq_s8_u8(vandq_u8(q0, low4)), vld1q_s8(y));
      lo = dot16(lo, vreinterpretq_s8_u8(vandq_u8(q1, low4)), vld1q_s8(y + 16));
      int32x4_t hi = dot16(vdupq_n_s32(0), vreinterpretq_s8_u8(vshrq_n_u8(q0, 4)), vld1q_s8(y + 32));
      hi = dot16(hi, vreinterpretq_s8_u8(vshrq_n_u8(q1, 4)), vld1q_s8(y + 48));
      isum += sc_lo * vaddvq_s32(lo) + sc_hi * vaddvq_s32(hi);
      const int16_t* bs = a[i].bsums + 4 * c;
      imin += m_lo * (bs[0] + bs[1]) + m_hi * (bs[2] + bs[3]);
    }
    sum += a[i].d * (fp16_to_fp32(w[i].d) * static_cast<float>(isum) -
                     fp16_to_fp32(w[i].dmin) * static_cast<float>(imin));
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

}  // namespace

float vec_dot(DType type, int64_t n, const void* w, const void* a) {
  const int64_t nb = n / dtype_block_size(type);
  switch (type) {
    case DType::Q4_0: return dot_q4_0(nb, static_cast<const BlockQ4_0*>(w), static_cast<const BlockQ8_0*>(a));
    case DType::Q8_0: return dot_q8_0(nb, static_cast<const BlockQ8_0*>(w), static_cast<const BlockQ8_0*>(a));
    case DType::Q4_K: return dot_q4_k(nb, static_cast<const BlockQ4_K*>(w), static_cast<const BlockQ8_K*>(a));
    case DType::Q6_K: return dot_q6_k(nb, static_cast<const BlockQ6_K*>(w), static_cast<const BlockQ8_K*>(a));
    default: fail("vec_dot: no NEON kernel for weight type {}", dtype_name(type));
  }
}

}  // namespace pagellm::cpu::NEON_NS
