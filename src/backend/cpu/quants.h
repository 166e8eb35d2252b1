// Quantized block formats (GGUF / ggml layouts, bit for bit) and their scalar
// reference conversions. The references are the ground truth: every fast
// kernel is tested against them on random data.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/cpu_features.h"
#include "core/dtype.h"

namespace pagellm::cpu {

constexpr int QK4_0 = 32, QK4_1 = 32, QK5_0 = 32, QK5_1 = 32, QK8_0 = 32, QK8_1 = 32;
constexpr int QK_K = 256, K_SCALE_SIZE = 12;

// d: fp16 scale. 32 x 4-bit: value = d * (q - 8); low nibbles are elements 0..15.
struct BlockQ4_0 { uint16_t d; uint8_t qs[QK4_0 / 2]; };
// value = d * q + m.
struct BlockQ4_1 { uint16_t d, m; uint8_t qs[QK4_1 / 2]; };
// 5th bits in qh: value = d * (q - 16).
struct BlockQ5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; };
struct BlockQ5_1 { uint16_t d, m; uint8_t qh[4]; uint8_t qs[QK5_1 / 2]; };
struct BlockQ8_0 { uint16_t d; int8_t qs[QK8_0]; };
// Activation format for Q4_1 / Q5_1 dots: s = d * sum(qs).
struct BlockQ8_1 { uint16_t d, s; int8_t qs[QK8_1]; };
// K-quants: super-blocks of 256 with 6-bit packed sub-block scales / mins.
struct BlockQ4_K { uint16_t d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qs[QK_K / 2]; };
struct BlockQ5_K { uint16_t d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; };
struct BlockQ6_K { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; uint16_t d; };
// Activation format for K-quant dots: float scale, int8 values, sums of 16.
struct BlockQ8_K { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; };

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 &&
              sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34 && sizeof(BlockQ8_1) == 36);
static_assert(sizeof(BlockQ4_K) == 144 && sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210 &&
              sizeof(BlockQ8_K) == 292);

// Scalar reference: n elements of `type` at src -> float. Supports F32, F16,
// BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q4_K, Q5_K, Q6_K, Q8_K.
void dequantize_row_ref(DType type, const void* src, float* dst, int64_t n);
// Scalar reference quantizer (round to nearest, per-block scale search as in
// the GGUF reference quantizers). Same types as above. Deterministic: the
// same input gives the same bytes on every machine.
void quantize_row_ref(DType type, const float* src, void* dst, int64_t n);

// Fast dequantization with the best ISA (embedding lookups). Bit-identical to
// dequantize_row_ref.
void dequantize_row(DType type, const void* src, float* dst, int64_t n);

// ---- Dot products of a weight row with an activation row -------------------
// Activations are quantized to the 8-bit format that pairs with the weight
// type: Q8_0 for Q4_0 / Q5_0 / Q8_0, Q8_1 for Q4_1 / Q5_1, Q8_K for the
// K-quants; float weights (F32, F16, BF16) take F32 activations as they are.
DType vec_dot_type(DType weight_type);
// True if vec_dot / matmul have kernels for this weight type.
bool vec_dot_supported(DType weight_type);

// Fast activation quantization (Q8_0, Q8_1, Q8_K), byte-identical to
// quantize_row_ref on every ISA; other types fall back to quantize_row_ref.
void quantize_row(DType type, const float* src, void* dst, int64_t n);

// sum_i w[i] * a[i] over n elements: w is a row of weight_type, a a row of
// vec_dot_type(weight_type) (a float* for float weights).
float vec_dot(DType weight_type, int64_t n, const void* w, const void* a);

// ---- Which ISA the fast kernels use ---------------------------------------
// cpu_features().best() (which honours PAGELLM_ISA), unless overridden.
// Isa::Avx512 currently runs the AVX2 kernels (no AVX-512 kernels yet).
Isa kernel_isa();
bool isa_supported(Isa isa);
// Forces the kernels of one ISA (tests, benchmarks). Throws Error if this CPU
// cannot run it. Process-wide; not meant to change while kernels run.
void set_isa_override(Isa isa);
void clear_isa_override();

}  // namespace pagellm::cpu
