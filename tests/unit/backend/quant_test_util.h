// Shared helpers of the quantization and matmul tests.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "backend/cpu/quants.h"
#include "backend_test_util.h"

namespace pagellm::cpu::test {

// Normally distributed values (mean 0, stddev `scale`), seeded.
inline std::vector<float> normal_values(size_t n, uint32_t seed, float scale = 1.0f) {
  return backend_test::randn(n, seed, scale);
}

// ||a - b|| / ||b||.
inline double normalized_error(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

inline std::vector<uint8_t> quantize_ref(DType type, const std::vector<float>& x) {
  std::vector<uint8_t> q(dtype_row_bytes(type, static_cast<int64_t>(x.size())));
  quantize_row_ref(type, x.data(), q.data(), static_cast<int64_t>(x.size()));
  return q;
}

// Forces the kernels of one ISA for the lifetime of the guard.
class IsaGuard {
 public:
  explicit IsaGuard(Isa isa) { set_isa_override(isa); }
  ~IsaGuard() { clear_isa_override(); }
  IsaGuard(const IsaGuard&) = delete;
  IsaGuard& operator=(const IsaGuard&) = delete;
};

// The ISA levels this machine can run, scalar first (x86-64: Isa::Avx512 runs
// the AVX2 kernels, Isa::Avx512Vnni its own for some types; aarch64: neon,
// neon-dotprod, neon-i8mm).
inline std::vector<Isa> testable_isas() {
  std::vector<Isa> isas;
  for (Isa isa : isa_levels())
    if (isa_supported(isa)) isas.push_back(isa);
  return isas;
}

// Every weight type with a matmul kernel.
inline const std::vector<DType>& weight_types() {
  static const std::vector<DType> types{DType::F32,  DType::F16,    DType::BF16,   DType::Q4_0, DType::Q4_1,
                                        DType::Q5_0, DType::Q5_1,   DType::Q8_0,   DType::Q2_K, DType::Q3_K,
                                        DType::Q4_K, DType::Q5_K,   DType::Q6_K,   DType::IQ4_NL, DType::IQ4_XS,
                                        DType::MXFP4};
  return types;
}

}  // namespace pagellm::cpu::test
