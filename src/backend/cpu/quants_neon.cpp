// Plain Advanced SIMD kernels (every aarch64 CPU): activation quantization,
// byte-identical to the references of core/quant_ref.cpp, and the dot products
// of quants_neon_impl.h with widening multiplies.
#pragma GCC optimize("fp-contract=off")

#define NEON_NS neon
#include "backend/cpu/quants_neon_impl.h"

namespace pagellm::cpu::neon {
namespace {

// max |x[j]| over n (a multiple of 16) values.
float abs_max(const float* x, int n) {
  float32x4_t m = vdupq_n_f32(0);
  for (int j = 0; j < n; j += 4) m = vmaxq_f32(m, vabsq_f32(vld1q_f32(x + j)));
  return vmaxvq_f32(m);
}

// q[j] = round(x[j] * id) with halves away from zero (vcvtaq: the reference's
// std::round), for 16 values; |x[j] * id| <= 127, so the narrowing is exact.
int8x16_t scale_round16(const float* x, float32x4_t id) {
  const int32x4_t a = vcvtaq_s32_f32(vmulq_f32(vld1q_f32(x), id));
  const int32x4_t b = vcvtaq_s32_f32(vmulq_f32(vld1q_f32(x + 4), id));
  const int32x4_t c = vcvtaq_s32_f32(vmulq_f32(vld1q_f32(x + 8), id));
  const int32x4_t d = vcvtaq_s32_f32(vmulq_f32(vld1q_f32(x + 12), id));
  const int16x8_t ab = vcombine_s16(vqmovn_s32(a), vqmovn_s32(b));
  const int16x8_t cd = vcombine_s16(vqmovn_s32(c), vqmovn_s32(d));
  return vcombine_s8(vqmovn_s16(ab), vqmovn_s16(cd));
}

}  // namespace

void quantize_q8_0(const float* x, BlockQ8_0* y, int64_t n) {
  for (int64_t i = 0; i < n / QK8_0; ++i, x += QK8_0) {
    const float d = abs_max(x, QK8_0) / 127;
    const float32x4_t id = vdupq_n_f32(d != 0 ? 1.0f / d : 0.0f);
    y[i].d = fp32_to_fp16(d);
    vst1q_s8(y[i].qs, scale_round16(x, id));
    vst1q_s8(y[i].qs + 16, scale_round16(x + 16, id));
  }
}

void quantize_q8_1(const float* x, BlockQ8_1* y, int64_t n) {
  for (int64_t i = 0; i < n / QK8_1; ++i, x += QK8_1) {
    const float d = abs_max(x, QK8_1) / 127;
    const float32x4_t id = vdupq_n_f32(d != 0 ? 1.0f / d : 0.0f);
    const int8x16_t q0 = scale_round16(x, id), q1 = scale_round16(x + 16, id);
    vst1q_s8(y[i].qs, q0);
    vst1q_s8(y[i].qs + 16, q1);
    const int sum = vaddlvq_s8(q0) + vaddlvq_s8(q1);
    y[i].d = fp32_to_fp16(d);
    y[i].s = fp32_to_fp16(static_cast<float>(sum) * d);
  }
}

void quantize_q8_K(const float* x, BlockQ8_K* y, int64_t n) {
  for (int64_t i = 0; i < n / QK_K; ++i, x += QK_K) {
    const float d = abs_max(x, QK_K) / 127;
    const float32x4_t id = vdupq_n_f32(d != 0 ? 1.0f / d : 0.0f);
    y[i].d = d;
    for (int g = 0; g < QK_K / 16; ++g) {
      const int8x16_t q = scale_round16(x + 16 * g, id);
      vst1q_s8(y[i].qs + 16 * g, q);
      y[i].bsums[g] = vaddlvq_s8(q);
    }
  }
}

bool has_vec_dot(DType weight_type) {
  switch (weight_type) {
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q8_0:
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
    case DType::IQ4_NL:
    case DType::IQ4_XS:
    case DType::MXFP4: return true;
    default: return false;
  }
}

}  // namespace pagellm::cpu::neon
