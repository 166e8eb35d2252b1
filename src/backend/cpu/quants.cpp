// Runtime dispatch of the quantization and dot-product kernels.
#include <fmt/format.h>

#include <atomic>

#include "backend/cpu/quants.h"
#include "backend/cpu/matmul_kernels.h"
#include "backend/cpu/quants_kernels.h"
#include "core/error.h"

namespace pagellm::cpu {
namespace {

constexpr int kNoOverride = -1;
std::atomic<int> g_isa_override{kNoOverride};

bool use_avx2() { return kernel_isa() >= Isa::Avx2; }

void check_row(DType type, int64_t n, const char* what) {
  const int bs = dtype_block_size(type);
  PAGELLM_CHECK(n >= 0 && n % bs == 0, "{}: {} elements is not a multiple of {}'s block size {}", what, n,
                dtype_name(type), bs);
}

}  // namespace

bool isa_supported(Isa isa) {
  const CpuFeatures& f = cpu_features();
  switch (isa) {
    case Isa::Scalar: return true;
    case Isa::Avx2: return f.avx2 && f.fma && f.f16c;
    case Isa::Avx512:
    case Isa::Avx512Vnni: return f.detected() >= isa;
  }
  return false;
}

Isa kernel_isa() {
  const int forced = g_isa_override.load(std::memory_order_relaxed);
  if (forced != kNoOverride) return static_cast<Isa>(forced);
  return cpu_features().best();  // not cached: a backend made after PAGELLM_ISA changes follows it
}

Isa kernel_isa_for(Isa isa, DType weight_type) {
  if (isa >= Isa::Avx512Vnni && (avx512::has_vec_dot(weight_type) || avx512::has_gemm_x16(weight_type)))
    return Isa::Avx512Vnni;
  return isa >= Isa::Avx2 ? Isa::Avx2 : Isa::Scalar;
}

std::string describe_kernels(Isa isa) {
  if (isa < Isa::Avx512Vnni) {
    if (isa == Isa::Avx512) return "avx2 kernels (avx512 without vnni: no kernels of its own yet)";
    return std::string(isa_name(isa)) + " kernels";
  }
  std::string types, decode_avx2;
  for (DType type : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q2_K, DType::Q3_K,
                     DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS, DType::MXFP4}) {
    if (kernel_isa_for(isa, type) != Isa::Avx512Vnni) continue;
    types += (types.empty() ? "" : " ") + dtype_name(type);
    if (avx512::has_gemm_x16(type) && !avx512::has_gemv_x8(type))
      decode_avx2 += (decode_avx2.empty() ? "" : " ") + dtype_name(type);
  }
  std::string text = fmt::format("{} kernels for {}", isa_name(isa), types);
  // Decode is bound by memory: where the 512-bit kernel measured no faster, AVX2's runs.
  if (!decode_avx2.empty()) text += fmt::format(" (one-token steps of {}: avx2)", decode_avx2);
  return text + ", avx2 for the other types and ops";
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
  const bool avx2 = use_avx2();
  switch (type) {
    case DType::Q8_0:
      return avx2 ? avx2::quantize_q8_0(src, static_cast<BlockQ8_0*>(dst), n)
                  : scalar::quantize_q8_0(src, static_cast<BlockQ8_0*>(dst), n);
    case DType::Q8_1:
      return avx2 ? avx2::quantize_q8_1(src, static_cast<BlockQ8_1*>(dst), n)
                  : scalar::quantize_q8_1(src, static_cast<BlockQ8_1*>(dst), n);
    case DType::Q8_K:
      return avx2 ? avx2::quantize_q8_K(src, static_cast<BlockQ8_K*>(dst), n)
                  : scalar::quantize_q8_K(src, static_cast<BlockQ8_K*>(dst), n);
    default: return quantize_row_ref(type, src, dst, n);
  }
}

float vec_dot(DType weight_type, int64_t n, const void* w, const void* a) {
  PAGELLM_CHECK(vec_dot_supported(weight_type), "vec_dot: no kernel for weight type {}", dtype_name(weight_type));
  check_row(weight_type, n, "vec_dot");
  if (vec_dot_type(weight_type) == DType::Q8_K) check_row(DType::Q8_K, n, "vec_dot");
  // Types with VNNI matrix kernels but no VNNI row dot run AVX2's.
  const Isa isa = kernel_isa_for(kernel_isa(), weight_type);
  if (isa == Isa::Avx512Vnni && avx512::has_vec_dot(weight_type)) return avx512::vec_dot(weight_type, n, w, a);
  if (isa >= Isa::Avx2) return avx2::vec_dot(weight_type, n, w, a);
  return scalar::vec_dot(weight_type, n, w, a);
}

void dequantize_row(DType type, const void* src, float* dst, int64_t n) {
  check_row(type, n, "dequantize_row");
  if (use_avx2() && avx2::dequantize_row(type, src, dst, n)) return;
  dequantize_row_ref(type, src, dst, n);
}

}  // namespace pagellm::cpu
