// Per-ISA entry points behind the dispatching functions of quants.h. Only the
// CPU backend includes this; everything else goes through quants.h.
#pragma once

#include <cstdint>

#include "backend/cpu/quants.h"

namespace pagellm::cpu {

// n is a multiple of the block size in every function below.
namespace scalar {
using pagellm::quant_ref::quantize_q8_0;
using pagellm::quant_ref::quantize_q8_1;
using pagellm::quant_ref::quantize_q8_K;
float vec_dot(DType weight_type, int64_t n, const void* w, const void* a);
}  // namespace scalar

// Per-block extras of a quantized activation row that the GEMM kernels read
// beside the blocks, so the inner loops need no half-float conversions.
struct ActSideQ8_0 {
  float d;    // the block's scale (its fp16 value, as float)
  int32_t c;  // offset * sum(qs): the weight zero point times the activation sum
};
struct ActSideQ8_1 {
  float d, s;  // the block's d and s (fp16 values, as float)
};
struct ActSideQ8_K {
  int16_t bs32[8];  // sums of qs over each 32-element sub-block
};

// The dot-product kernel vec_dot runs for weight_type at level isa (the
// row-dot path of matmul calls it directly, without vec_dot's checks).
using VecDotFn = float (*)(DType weight_type, int64_t n, const void* w, const void* a);
VecDotFn vec_dot_kernel(Isa isa, DType weight_type);

// Compiled with -mavx2 -mfma -mf16c; call only when isa_supported(Isa::Avx2).
namespace avx2 {
void quantize_q8_0(const float* x, BlockQ8_0* y, int64_t n);
void quantize_q8_1(const float* x, BlockQ8_1* y, int64_t n);
void quantize_q8_K(const float* x, BlockQ8_K* y, int64_t n);
float vec_dot(DType weight_type, int64_t n, const void* w, const void* a);
// False if the type has no AVX2 dequantizer (the caller uses the reference).
bool dequantize_row(DType type, const void* src, float* dst, int64_t n);
// One activation row for the GEMM kernels: blocks of act_type (Q8_0, Q8_1 or
// Q8_K, the same bytes as quantize_row) and one ActSide* per block. For Q8_0,
// `offset` is the weight zero point folded into ActSideQ8_0::c.
void quantize_act_row(DType act_type, int offset, const float* x, int64_t n, void* blocks, void* side);
}  // namespace avx2

// Compiled with the AVX-512 flags; call only when isa_supported(Isa::Avx512Vnni).
namespace avx512 {
// True if vec_dot has a VNNI kernel for the type (the others run avx2::vec_dot).
bool has_vec_dot(DType weight_type);
float vec_dot(DType weight_type, int64_t n, const void* w, const void* a);
}  // namespace avx512

}  // namespace pagellm::cpu
