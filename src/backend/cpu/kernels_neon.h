// The aarch64 kernels behind quants.h and matmul(), per ISA level. Internal to
// the CPU backend; declared on every architecture, defined only in aarch64
// builds (the *_neon*.cpp files).
//
// Every kernel here computes each block's integer sums exactly and then does
// the float steps of the scalar reference (quants_dot_scalar.cpp) in the same
// order, without fused multiply-adds: the results are the reference's bits.
#pragma once

#include <cstdint>

#include "backend/cpu/quants.h"

namespace pagellm::cpu {

// Plain Advanced SIMD (every aarch64 CPU): int8 products by widening multiplies.
namespace neon {
void quantize_q8_0(const float* x, BlockQ8_0* y, int64_t n);
void quantize_q8_1(const float* x, BlockQ8_1* y, int64_t n);
void quantize_q8_K(const float* x, BlockQ8_K* y, int64_t n);
// True for the weight types with NEON dot products (the quantized types:
// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K .. Q6_K, IQ4_NL, IQ4_XS, MXFP4); the
// float types run the scalar reference.
bool has_vec_dot(DType weight_type);
float vec_dot(DType weight_type, int64_t n, const void* w, const void* a);
}  // namespace neon

// Compiled with +dotprod (vdotq_s32); call only when the CPU has it.
namespace neon_dotprod {
float vec_dot(DType weight_type, int64_t n, const void* w, const void* a);
}  // namespace neon_dotprod

// Compiled with +i8mm (vmmlaq_s32); call only when the CPU has it.
namespace neon_i8mm {
// True for the weight types with a 2x2 tile (Q4_0, Q8_0).
bool has_gemm_2x2(DType weight_type);
// The dots of weight rows w0, w1 with activation rows a0, a1 (n elements):
// out = {w0.a0, w0.a1, w1.a0, w1.a1}, each the bits of vec_dot.
void gemm_2x2(DType weight_type, int64_t n, const void* w0, const void* w1, const void* a0, const void* a1,
              float out[4]);
}  // namespace neon_i8mm

}  // namespace pagellm::cpu
