#include "core/fp16.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/cpu_features.h"

#if defined(__x86_64__)
#include <immintrin.h>
__attribute__((target("f16c"))) static uint16_t hw_to_half(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}
__attribute__((target("f16c"))) static float hw_from_half(uint16_t h) { return _cvtsh_ss(h); }
#endif

namespace pagellm {

TEST(Fp16, EveryHalfRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = fp16_to_fp32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(fp32_to_fp16(f), h) << std::hex << h;
  }
}

TEST(Fp16, MatchesF16cHardware) {
  if (!cpu_features().f16c) GTEST_SKIP() << "no F16C";
#if defined(__x86_64__)
  for (uint32_t h = 0; h < 65536; ++h) {
    const float a = fp16_to_fp32(static_cast<uint16_t>(h)), b = hw_from_half(static_cast<uint16_t>(h));
    if (std::isnan(a)) {
      EXPECT_TRUE(std::isnan(b));
      continue;
    }
    EXPECT_EQ(fp32_to_bits(a), fp32_to_bits(b)) << std::hex << h;
  }
  std::mt19937 rng(42);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 2000000; ++i) {
    const float f = fp32_from_bits(bits(rng));
    if (std::isnan(f)) continue;
    ASSERT_EQ(fp32_to_fp16(f), hw_to_half(f)) << f;
  }
#endif
}

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(fp32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_fp32(0x3f80), 1.0f);
  EXPECT_EQ(fp32_to_bf16(fp32_from_bits(0x3f808000u)), 0x3f80);  // tie -> even
  EXPECT_EQ(fp32_to_bf16(fp32_from_bits(0x3f818000u)), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(fp32_to_bf16(fp32_from_bits(0x3f808001u)), 0x3f81);
  EXPECT_TRUE(std::isnan(bf16_to_fp32(fp32_to_bf16(std::nanf("")))));
}

}  // namespace pagellm
