// Quantized block formats (GGUF / ggml layouts, bit for bit) and their scalar
// reference conversions. The references are the ground truth: every backend's
// kernels are tested against them on random data, and a backend that cannot
// multiply a format converts it at load with them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/dtype.h"

namespace pagellm {

constexpr int QK4_0 = 32, QK4_1 = 32, QK5_0 = 32, QK5_1 = 32, QK8_0 = 32, QK8_1 = 32;
constexpr int QK_K = 256, K_SCALE_SIZE = 12;
constexpr int QK4_NL = 32, QK_MXFP4 = 32;

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
// 2-bit K-quant: 16 sub-blocks of 16; scales[j] = scale (low nibble) | min
// (high nibble); value = d * sc * q - dmin * m. Element 128h + 32s + l is bits
// 2s..2s+1 of qs[32h + l].
struct BlockQ2_K { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; uint16_t d, dmin; };
// 3-bit K-quant: levels q - 4 in [-4, 3] (qs as Q2_K; hmask bit 32h+s of
// element 128h + 32s + l set means "no -4"), 16 signed 6-bit scales packed
// in 12 bytes (q3k_scales): value = d * (sc - 32) * (q - 4).
struct BlockQ3_K { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; uint16_t d; };
// Non-linear 4-bit: value = d * kIQ4NLValues[q]; low nibbles are elements 0..15.
struct BlockIQ4_NL { uint16_t d; uint8_t qs[QK4_NL / 2]; };
// IQ4_NL levels in super-blocks of 256 with 8 signed 6-bit sub-block scales
// (low 4 bits in scales_l nibbles, high 2 bits in scales_h): value =
// d * (ls - 32) * kIQ4NLValues[q]; sub-block j's nibbles are qs[16j..16j+16).
struct BlockIQ4_XS { uint16_t d; uint16_t scales_h; uint8_t scales_l[QK_K / 64]; uint8_t qs[QK_K / 2]; };
// OCP microscaling FP4: e8m0 shared exponent, 32 e2m1 values (as IQ4_NL's
// nibble order); value = e8m0_to_fp32_half(e) * kMXFP4Values[q].
struct BlockMXFP4 { uint8_t e; uint8_t qs[QK_MXFP4 / 2]; };
// Activation format for K-quant dots: float scale, int8 values, sums of 16.
struct BlockQ8_K { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; };

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 &&
              sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34 && sizeof(BlockQ8_1) == 36);
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110 && sizeof(BlockIQ4_NL) == 18 &&
              sizeof(BlockIQ4_XS) == 136 && sizeof(BlockMXFP4) == 17);
static_assert(sizeof(BlockQ4_K) == 144 && sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210 &&
              sizeof(BlockQ8_K) == 292);

// The 16 IQ4_NL / IQ4_XS levels, and the e2m1 values of MXFP4 doubled (so
// they are integers; e8m0_to_fp32_half halves the scale to match).
inline constexpr int8_t kIQ4NLValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};
inline constexpr int8_t kMXFP4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// 2^(e - 127) / 2 as a float (e < 2 gives the subnormals), as ggml does it.
inline float e8m0_to_fp32_half(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// The 16 sub-block scales of a Q3_K block, minus their offset 32.
void q3k_scales(const uint8_t* packed, int8_t* out);
// Sub-block j's (0..7) 6-bit scale of an IQ4_XS block, minus its offset 32.
// Element e (0..255) of a Q2_K / Q3_K block: its 2 low bits are bits
// 2 * ((e / 32) % 4) of qs[32 * (e / 128) + e % 32]; Q3_K's third bit is bit
// e / 32 of hmask[e % 32].
inline int q2k_low_bits(const uint8_t* qs, int e) { return (qs[32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3; }
inline int q3k_high_bit(const uint8_t* hmask, int e) { return (hmask[e % 32] >> (e / 32)) & 1; }

inline int iq4xs_scale(const BlockIQ4_XS& b, int j) {
  const int lo = (b.scales_l[j / 2] >> (4 * (j % 2))) & 0x0F, hi = (b.scales_h >> (2 * j)) & 3;
  return (lo | (hi << 4)) - 32;
}

// Scalar reference: n elements of `type` at src -> float. Supports F32, F16,
// BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
// Q8_K, IQ4_NL, IQ4_XS, MXFP4.
void dequantize_row_ref(DType type, const void* src, float* dst, int64_t n);
// A [rows, cols] tensor of `type` (rows of dtype_row_bytes(type, cols)) as
// float, row by row: host copies of weights (dense heads, LoRA adapters).
std::vector<float> dequantize_rows_ref(DType type, const void* src, int64_t rows, int64_t cols);
// Scalar reference quantizer (round to nearest, per-block scale search as in
// the GGUF reference quantizers). Same types as above. Deterministic: the
// same input gives the same bytes on every machine. Q2_K, Q3_K, IQ4_NL and
// IQ4_XS use our own (simpler) scale searches, so their bytes differ from
// llama.cpp's quantizer; their dequantization is bit-exact.
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
