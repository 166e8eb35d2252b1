// The CPU's fast conversions and dot products over the GGUF block formats of
// core/quant_blocks.h (bit-identical to the scalar references there).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/cpu_features.h"
#include "core/dtype.h"
#include "core/quant_blocks.h"

namespace pagellm::cpu {

// The block formats and references live in core (core/quant_blocks.h).
using pagellm::QK4_0;
using pagellm::QK4_1;
using pagellm::QK5_0;
using pagellm::QK5_1;
using pagellm::QK8_0;
using pagellm::QK8_1;
using pagellm::QK_K;
using pagellm::K_SCALE_SIZE;
using pagellm::BlockQ4_0;
using pagellm::BlockQ4_1;
using pagellm::BlockQ5_0;
using pagellm::BlockQ5_1;
using pagellm::BlockQ8_0;
using pagellm::BlockQ8_1;
using pagellm::BlockQ4_K;
using pagellm::BlockQ5_K;
using pagellm::BlockQ6_K;
using pagellm::BlockQ8_K;
using pagellm::BlockQ2_K;
using pagellm::BlockQ3_K;
using pagellm::BlockIQ4_NL;
using pagellm::BlockIQ4_XS;
using pagellm::BlockMXFP4;
using pagellm::QK4_NL;
using pagellm::QK_MXFP4;
using pagellm::dequantize_row_ref;
using pagellm::quantize_row_ref;
using pagellm::kquant_scale_min;

// Fast dequantization with the best ISA (embedding lookups). Bit-identical to
// dequantize_row_ref.
void dequantize_row(DType type, const void* src, float* dst, int64_t n);

// ---- Dot products of a weight row with an activation row -------------------
// Activations are quantized to the 8-bit format that pairs with the weight
// type: Q8_0 for Q4_0 / Q5_0 / Q8_0 / IQ4_NL / MXFP4, Q8_1 for Q4_1 / Q5_1,
// Q8_K for the K-quants and IQ4_XS (as llama.cpp pairs them); float weights (F32, F16, BF16) take F32 activations as they are.
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
// Isa::Avx512 runs the AVX2 kernels (no kernels without VNNI yet);
// Isa::Avx512Vnni runs VNNI kernels for some weight types (kernel_isa_for)
// and the AVX2 ones for the rest. On aarch64 (backend/cpu/kernels_neon.h):
// Isa::Neon and Isa::NeonDotprod run NEON dots for Q4_0 Q8_0 Q4_K Q6_K and
// the scalar ones for the rest; Isa::NeonI8mm adds 2x2 i8mm tiles for Q4_0 and
// Q8_0 in steps of 2+ tokens.
Isa kernel_isa();
// The level whose kernels run weight_type's dot products and matrix
// products when the kernels of `isa` are chosen.
Isa kernel_isa_for(Isa isa, DType weight_type);
// What runs at `isa`, for start-up lines: e.g. "avx512-vnni kernels for Q4_0
// Q8_0 Q4_K Q6_K, avx512 for F16 and attention, avx2 for the other types and ops".
std::string describe_kernels(Isa isa);
bool isa_supported(Isa isa);
// Forces the kernels of one ISA (tests, benchmarks). Throws Error if this CPU
// cannot run it. Process-wide; not meant to change while kernels run.
void set_isa_override(Isa isa);
void clear_isa_override();

}  // namespace pagellm::cpu
