// The aarch64 kernels against the scalar reference, bit for bit: each NEON
// level computes the reference's integer sums and float steps (kernels_neon.h).
// Nothing to test on other architectures.
#include <gtest/gtest.h>

#include <cstring>

#include "core/cpu_features.h"

#if defined(PAGELLM_CPU_ARM)
#include "backend/cpu/kernels_neon.h"
#include "backend/cpu/quants_kernels.h"
#include "quant_test_util.h"

namespace pagellm::cpu {
namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

TEST(QuantsNeon, DotsAreTheReferenceBitsAtEveryLevel) {
  for (DType type : {DType::Q4_0, DType::Q8_0, DType::Q4_K, DType::Q6_K}) {
    for (int64_t n : {256, 2048}) {
      for (uint32_t trial = 0; trial < 4; ++trial) {
        const auto w = test::quantize_ref(type, test::normal_values(static_cast<size_t>(n), 300 + trial));
        const auto a = test::quantize_ref(vec_dot_type(type), test::normal_values(static_cast<size_t>(n), 400 + trial));
        const float want = scalar::vec_dot(type, n, w.data(), a.data());
        EXPECT_EQ(bits(neon::vec_dot(type, n, w.data(), a.data())), bits(want)) << dtype_name(type) << " n=" << n;
        if (isa_supported(Isa::NeonDotprod)) {
          EXPECT_EQ(bits(neon_dotprod::vec_dot(type, n, w.data(), a.data())), bits(want)) << dtype_name(type);
        }
      }
    }
  }
}

TEST(QuantsNeon, I8mmTilesAreTheReferenceBits) {
  if (!isa_supported(Isa::NeonI8mm)) GTEST_SKIP() << "this CPU has no i8mm";
  const int64_t n = 1024;
  for (DType type : {DType::Q4_0, DType::Q8_0}) {
    ASSERT_TRUE(neon_i8mm::has_gemm_2x2(type));
    std::vector<std::vector<uint8_t>> w, a;
    for (uint32_t k = 0; k < 2; ++k) {
      w.push_back(test::quantize_ref(type, test::normal_values(n, 500 + k)));
      a.push_back(test::quantize_ref(DType::Q8_0, test::normal_values(n, 600 + k, 3.0f)));
    }
    float out[4];
    neon_i8mm::gemm_2x2(type, n, w[0].data(), w[1].data(), a[0].data(), a[1].data(), out);
    for (int r = 0; r < 2; ++r)
      for (int t = 0; t < 2; ++t)
        EXPECT_EQ(bits(out[2 * r + t]), bits(scalar::vec_dot(type, n, w[r].data(), a[t].data())))
            << dtype_name(type) << " row " << r << " token " << t;
  }
}

}  // namespace
}  // namespace pagellm::cpu
#endif
