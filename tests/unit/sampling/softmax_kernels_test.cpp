#include "sampling/softmax_kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "sampling/fast_exp.h"

namespace pagellm {
namespace {

const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<float> random_values(int32_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 5.0f);
  std::vector<float> x(n);
  for (float& v : x) v = dist(gen);
  // Some specials at odd positions, also in the scalar tail.
  for (int32_t i = 3; i < n; i += 97) x[i] = -kInf;
  for (int32_t i = 5; i < n; i += 131) x[i] = kNaN;
  for (int32_t i = 7; i < n; i += 211) x[i] = kInf;
  return x;
}

// The documented order, written plainly.
double reference_sum(const std::vector<float>& w) {
  double total = 0.0;
  for (size_t start = 0; start < w.size(); start += kSumBlock) {
    float lane[4] = {0, 0, 0, 0};
    for (size_t i = start; i < std::min(w.size(), start + kSumBlock); ++i) lane[(i - start) % 4] += w[i];
    total += (lane[0] + lane[1]) + (lane[2] + lane[3]);
  }
  return total;
}

TEST(SoftmaxKernels, FiniteMaxSkipsNonFinite) {
  for (int32_t n : {0, 1, 3, 4, 7, 1000, 1001}) {
    const std::vector<float> x = random_values(n, n);
    float max = -kInf;
    size_t count = 0;
    for (float v : x)
      if (std::isfinite(v)) {
        max = std::max(max, v);
        ++count;
      }
    const FiniteMax got = finite_max(x.data(), n);
    EXPECT_EQ(got.max, max) << n;
    EXPECT_EQ(got.count, count) << n;
  }
  const std::vector<float> none = {kNaN, -kInf, kInf, kNaN, kNaN};
  EXPECT_EQ(finite_max(none.data(), 5).max, -kInf);
  EXPECT_EQ(finite_max(none.data(), 5).count, 0u);
}

TEST(SoftmaxKernels, ExpWeightsEqualScalarFormulaBitForBit) {
  for (int32_t n : {1, 5, 256, 257, 1003, 5000}) {
    const std::vector<float> x = random_values(n, 100 + n);
    const FiniteMax fm = finite_max(x.data(), n);
    for (float threshold : {-kInf, 0.0f}) {
      const float scale = 1.0f / 0.7f;
      std::vector<float> w(n), expected(n);
      for (int32_t i = 0; i < n; ++i)
        expected[i] = std::isfinite(x[i]) && x[i] >= threshold ? exp_nonpositive((x[i] - fm.max) * scale) : 0.0f;
      const double total = exp_weights(x.data(), n, fm.max, scale, threshold, w.data());
      for (int32_t i = 0; i < n; ++i) ASSERT_EQ(w[i], expected[i]) << "n " << n << " i " << i;
      EXPECT_EQ(total, reference_sum(expected));
      EXPECT_EQ(total, sum_weights(w.data(), n));
      EXPECT_EQ(total, exp_weights(x.data(), n, fm.max, scale, threshold, nullptr));
    }
  }
}

}  // namespace
}  // namespace pagellm
