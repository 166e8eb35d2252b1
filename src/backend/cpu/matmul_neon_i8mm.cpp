// 2x2 tiles of the int8 matrix multiply (SMMLA, vmmlaq_s32): two weight rows
// times two activation rows, each 8-byte slice of a block one instruction.
// Compiled with +i8mm, called only on CPUs that have it. Each of the four
// dots keeps the scalar reference's float steps: the bits of vec_dot.
#pragma GCC optimize("fp-contract=off")

#include <arm_neon.h>

#include "backend/cpu/kernels_neon.h"
#include "core/error.h"
#include "core/fp16.h"

namespace pagellm::cpu::neon_i8mm {
namespace {

// Rows x (elements 0..7 of r0, then of r1) and y likewise: x.y^T added to acc
// as {x0.y0, x0.y1, x1.y0, x1.y1}; the upper halves go in a second call.
inline int32x4_t mmla16(int32x4_t acc, int8x16_t x0, int8x16_t x1, int8x16_t y0, int8x16_t y1) {
  const int64x2_t a0 = vreinterpretq_s64_s8(x0), a1 = vreinterpretq_s64_s8(x1);
  const int64x2_t b0 = vreinterpretq_s64_s8(y0), b1 = vreinterpretq_s64_s8(y1);
  acc = vmmlaq_s32(acc, vreinterpretq_s8_s64(vzip1q_s64(a0, a1)), vreinterpretq_s8_s64(vzip1q_s64(b0, b1)));
  return vmmlaq_s32(acc, vreinterpretq_s8_s64(vzip2q_s64(a0, a1)), vreinterpretq_s8_s64(vzip2q_s64(b0, b1)));
}

// sum += isum * (d_w * d_a) per lane, in the reference's order.
inline float32x4_t add_block(float32x4_t sum, int32x4_t isum, float dw0, float dw1, float da0, float da1) {
  const float32x4_t dw = {dw0, dw0, dw1, dw1}, da = {da0, da1, da0, da1};
  return vaddq_f32(sum, vmulq_f32(vcvtq_f32_s32(isum), vmulq_f32(dw, da)));
}

float32x4_t tile_q8_0(int64_t nb, const BlockQ8_0* w0, const BlockQ8_0* w1, const BlockQ8_0* a0,
                      const BlockQ8_0* a1) {
  float32x4_t sum = vdupq_n_f32(0);
  for (int64_t i = 0; i < nb; ++i) {
    int32x4_t acc = mmla16(vdupq_n_s32(0), vld1q_s8(w0[i].qs), vld1q_s8(w1[i].qs), vld1q_s8(a0[i].qs),
                           vld1q_s8(a1[i].qs));
    acc = mmla16(acc, vld1q_s8(w0[i].qs + 16), vld1q_s8(w1[i].qs + 16), vld1q_s8(a0[i].qs + 16),
                 vld1q_s8(a1[i].qs + 16));
    sum = add_block(sum, acc, fp16_to_fp32(w0[i].d), fp16_to_fp32(w1[i].d), fp16_to_fp32(a0[i].d),
                    fp16_to_fp32(a1[i].d));
  }
  return sum;
}

float32x4_t tile_q4_0(int64_t nb, const BlockQ4_0* w0, const BlockQ4_0* w1, const BlockQ8_0* a0,
                      const BlockQ8_0* a1) {
  const uint8x16_t low4 = vdupq_n_u8(0x0F);
  const int8x16_t eight = vdupq_n_s8(8);
  auto lo = [&](uint8x16_t q) { return vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, low4)), eight); };
  auto hi = [&](uint8x16_t q) { return vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), eight); };
  float32x4_t sum = vdupq_n_f32(0);
  for (int64_t i = 0; i < nb; ++i) {
    const uint8x16_t q0 = vld1q_u8(w0[i].qs), q1 = vld1q_u8(w1[i].qs);
    int32x4_t acc = mmla16(vdupq_n_s32(0), lo(q0), lo(q1), vld1q_s8(a0[i].qs), vld1q_s8(a1[i].qs));
    acc = mmla16(acc, hi(q0), hi(q1), vld1q_s8(a0[i].qs + 16), vld1q_s8(a1[i].qs + 16));
    sum = add_block(sum, acc, fp16_to_fp32(w0[i].d), fp16_to_fp32(w1[i].d), fp16_to_fp32(a0[i].d),
                    fp16_to_fp32(a1[i].d));
  }
  return sum;
}

}  // namespace

bool has_gemm_2x2(DType weight_type) { return weight_type == DType::Q4_0 || weight_type == DType::Q8_0; }

void gemm_2x2(DType type, int64_t n, const void* w0, const void* w1, const void* a0, const void* a1, float out[4]) {
  const auto* x0 = static_cast<const BlockQ8_0*>(a0);
  const auto* x1 = static_cast<const BlockQ8_0*>(a1);
  float32x4_t r;
  switch (type) {
    case DType::Q4_0:
      r = tile_q4_0(n / QK4_0, static_cast<const BlockQ4_0*>(w0), static_cast<const BlockQ4_0*>(w1), x0, x1);
      break;
    case DType::Q8_0:
      r = tile_q8_0(n / QK8_0, static_cast<const BlockQ8_0*>(w0), static_cast<const BlockQ8_0*>(w1), x0, x1);
      break;
    default: fail("gemm_2x2: no i8mm kernel for weight type {}", dtype_name(type));
  }
  vst1q_f32(out, r);
}

}  // namespace pagellm::cpu::neon_i8mm
