// Runtime dispatch of the quantization and dot-product kernels.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>

#include "backend/cpu/kernels_neon.h"
#include "backend/cpu/quants.h"
#include "backend/cpu/matmul_kernels.h"
#include "backend/cpu/quants_kernels.h"
#include "core/error.h"

namespace pagellm::cpu {
namespace {

constexpr int kNoOverride = -1;
std::atomic<int> g_isa_override{kNoOverride};

#if defined(PAGELLM_CPU_X86)
bool use_avx2() { return kernel_isa() >= Isa::Avx2; }
#elif defined(PAGELLM_CPU_ARM)
bool use_neon() { return kernel_isa() >= Isa::Neon; }
#endif

void check_row(DType type, int64_t n, const char* what) {
  const int bs = dtype_block_size(type);
  PAGELLM_CHECK(n >= 0 && n % bs == 0, "{}: {} elements is not a multiple of {}'s block size {}", what, n,
                dtype_name(type), bs);
}

}  // namespace

bool isa_supported(Isa isa) { return cpu_features().supports(isa); }

Isa kernel_isa() {
  const int forced = g_isa_override.load(std::memory_order_relaxed);
  if (forced != kNoOverride) return static_cast<Isa>(forced);
  return cpu_features().best();  // not cached: a backend made after PAGELLM_ISA changes follows it
}

Isa kernel_isa_for(Isa isa, DType weight_type) {
#if defined(PAGELLM_CPU_X86)
  if (isa >= Isa::Avx512Vnni && (avx512::has_vec_dot(weight_type) || avx512::gemm_group_count(weight_type) > 0))
    return Isa::Avx512Vnni;
  return isa >= Isa::Avx2 ? Isa::Avx2 : Isa::Scalar;
#elif defined(PAGELLM_CPU_ARM)
  if (isa >= Isa::NeonI8mm && neon_i8mm::has_gemm_2x2(weight_type)) return Isa::NeonI8mm;
  if (isa < Isa::Neon || !neon::has_vec_dot(weight_type)) return Isa::Scalar;
  return std::min(isa, Isa::NeonDotprod);
#else
  return Isa::Scalar;
#endif
}

std::string describe_kernels(Isa isa) {
#if defined(PAGELLM_CPU_ARM)
  // e.g. "neon-i8mm kernels for Q4_0 Q8_0 (steps of 2+ tokens), neon-dotprod for one-token steps and Q4_1
  // ... MXFP4, scalar for the other types" (the float types; the ops are the baseline build,
  // auto-vectorised for NEON).
  if (isa < Isa::Neon) return "scalar kernels";
  auto types_at = [&](Isa level) {
    std::string types;
    for (DType type : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q2_K, DType::Q3_K,
                       DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS, DType::MXFP4})
      if (kernel_isa_for(isa, type) == level) types += (types.empty() ? "" : " ") + std::string(dtype_name(type));
    return types;
  };
  const Isa dot = std::min(isa, Isa::NeonDotprod);
  if (isa < Isa::NeonI8mm)
    return fmt::format("{} kernels for {}, scalar for the other types", isa_name(dot), types_at(dot));
  return fmt::format("{} kernels for {} (steps of 2+ tokens), {} for one-token steps and {}, scalar for the other "
                     "types", isa_name(isa), types_at(Isa::NeonI8mm), isa_name(dot), types_at(dot));
#endif
  // F16 / BF16 weights: the 512-bit panel GEMM (matmul_float_avx512.cpp) at both AVX-512 levels.
  const std::string float_types = cpu_features().avx512bf16 ? "F16 BF16" : "F16";
  if (isa < Isa::Avx512Vnni) {
    if (isa == Isa::Avx512) return "avx512 kernels for " + float_types + " and attention, avx2 kernels for the other types and ops";
    return std::string(isa_name(isa)) + " kernels";
  }
  std::string types, decode_avx2;
  for (DType type : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q2_K, DType::Q3_K,
                     DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS, DType::MXFP4}) {
    if (kernel_isa_for(isa, type) != Isa::Avx512Vnni) continue;
    types += (types.empty() ? "" : " ") + dtype_name(type);
    if (avx512::gemm_group_count(type) > 0 && !avx512::has_gemv_x8(type))
      decode_avx2 += (decode_avx2.empty() ? "" : " ") + dtype_name(type);
  }
  std::string text = fmt::format("{} kernels for {}", isa_name(isa), types);
  // Decode is bound by memory: where the 512-bit kernel measured no faster, AVX2's runs.
  if (!decode_avx2.empty()) text += fmt::format(" (one-token steps of {}: avx2)", decode_avx2);
  return text + ", avx512 for " + float_types + " and attention, avx2 for the other types and ops";
}

void set_isa_override(Isa isa) {
  PAGELLM_CHECK(isa_supported(isa), "cannot force ISA {}: this CPU lacks it ({})", isa_name(isa),
                cpu_features().describe());
  g_isa_override.store(static_cast<int>(isa), std::memory_order_relaxed);
}

void clear_isa_override() { g_isa_override.store(kNoOverride, std::memory_order_relaxed); }

DType vec_dot_type(DType weight_type) {
  switch (weight_type) {
    case DType::F32:
    case DType::F16:
    case DType::BF16: return DType::F32;
    case DType::Q4_0:
    case DType::Q5_0:
    case DType::Q8_0:
    case DType::IQ4_NL:
    case DType::MXFP4: return DType::Q8_0;
    case DType::Q4_1:
    case DType::Q5_1: return DType::Q8_1;
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
    case DType::IQ4_XS: return DType::Q8_K;
    default: fail("no dot-product kernel for weight type {}", dtype_name(weight_type));
  }
}

bool vec_dot_supported(DType weight_type) {
  switch (weight_type) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
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

void quantize_row(DType type, const float* src, void* dst, int64_t n) {
  check_row(type, n, "quantize_row");
#if defined(PAGELLM_CPU_X86)
  if (use_avx2()) {
    switch (type) {
      case DType::Q8_0: return avx2::quantize_q8_0(src, static_cast<BlockQ8_0*>(dst), n);
      case DType::Q8_1: return avx2::quantize_q8_1(src, static_cast<BlockQ8_1*>(dst), n);
      case DType::Q8_K: return avx2::quantize_q8_K(src, static_cast<BlockQ8_K*>(dst), n);
      default: return quantize_row_ref(type, src, dst, n);
    }
  }
#elif defined(PAGELLM_CPU_ARM)
  if (use_neon()) {
    switch (type) {
      case DType::Q8_0: return neon::quantize_q8_0(src, static_cast<BlockQ8_0*>(dst), n);
      case DType::Q8_1: return neon::quantize_q8_1(src, static_cast<BlockQ8_1*>(dst), n);
      case DType::Q8_K: return neon::quantize_q8_K(src, static_cast<BlockQ8_K*>(dst), n);
      default: return quantize_row_ref(type, src, dst, n);
    }
  }
#endif
  switch (type) {
    case DType::Q8_0: return scalar::quantize_q8_0(src, static_cast<BlockQ8_0*>(dst), n);
    case DType::Q8_1: return scalar::quantize_q8_1(src, static_cast<BlockQ8_1*>(dst), n);
    case DType::Q8_K: return scalar::quantize_q8_K(src, static_cast<BlockQ8_K*>(dst), n);
    default: return quantize_row_ref(type, src, dst, n);
  }
}

VecDotFn vec_dot_kernel(Isa isa, DType weight_type) {
  switch (kernel_isa_for(isa, weight_type)) {
#if defined(PAGELLM_CPU_X86)
    // Types with VNNI matrix kernels but no VNNI row dot run AVX2's.
    case Isa::Avx512Vnni: return avx512::has_vec_dot(weight_type) ? avx512::vec_dot : avx2::vec_dot;
    case Isa::Avx2: return avx2::vec_dot;
#elif defined(PAGELLM_CPU_ARM)
    case Isa::NeonI8mm:  // its one-row dots are dotprod's
    case Isa::NeonDotprod: return neon_dotprod::vec_dot;
    case Isa::Neon: return neon::vec_dot;
#endif
    default: return scalar::vec_dot;
  }
}

float vec_dot(DType weight_type, int64_t n, const void* w, const void* a) {
  PAGELLM_CHECK(vec_dot_supported(weight_type), "vec_dot: no kernel for weight type {}", dtype_name(weight_type));
  check_row(weight_type, n, "vec_dot");
  if (vec_dot_type(weight_type) == DType::Q8_K) check_row(DType::Q8_K, n, "vec_dot");
  return vec_dot_kernel(kernel_isa(), weight_type)(weight_type, n, w, a);
}

void dequantize_row(DType type, const void* src, float* dst, int64_t n) {
  check_row(type, n, "dequantize_row");
#if defined(PAGELLM_CPU_X86)
  if (use_avx2() && avx2::dequantize_row(type, src, dst, n)) return;
#endif
  dequantize_row_ref(type, src, dst, n);
}

}  // namespace pagellm::cpu
