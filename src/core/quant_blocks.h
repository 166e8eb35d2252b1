// Quantized block formats (GGUF / ggml layouts, bit for bit) and their scalar
// reference conversions. The references are the ground truth: every backend's
// kernels are tested against them on random data, and a backend that cannot
// multiply a format converts it at load with them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace pagellm {

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

// Unpacks the 6-bit scale and min of sub-block j (0..7) from a Q4_K / Q5_K
// 12-byte scales field.
void kquant_scale_min(int j, const uint8_t* scales, uint8_t& sc, uint8_t& m);

// The 8-bit activation quantizers (n a multiple of the block size): the same
// bytes as quantize_row_ref for Q8_0, Q8_1 and Q8_K.
namespace quant_ref {
void quantize_q8_0(const float* x, BlockQ8_0* y, int64_t n);
void quantize_q8_1(const float* x, BlockQ8_1* y, int64_t n);
void quantize_q8_K(const float* x, BlockQ8_K* y, int64_t n);
}  // namespace quant_ref

}  // namespace pagellm
