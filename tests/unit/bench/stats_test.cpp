#include "bench/stats.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace pagellm::bench {
namespace {

// Expected values from numpy.percentile (default linear method) on the same input.
TEST(BenchStats, PercentileMatchesNumpyLinear) {
  const std::vector<double> v = {3.5, 1.0, 7.25, 2.0, 9.0, 4.0, 0.5};
  EXPECT_DOUBLE_EQ(percentile(v, 0), 0.5);
  EXPECT_NEAR(percentile(v, 10), 0.8, 1e-12);
  EXPECT_DOUBLE_EQ(percentile(v, 25), 1.5);
  EXPECT_DOUBLE_EQ(percentile(v, 50), 3.5);
  EXPECT_NEAR(percentile(v, 90), 7.95, 1e-12);
  EXPECT_NEAR(percentile(v, 99), 8.895, 1e-12);
  EXPECT_DOUBLE_EQ(percentile(v, 100), 9.0);
}

TEST(BenchStats, PercentileEdgeCases) {
  EXPECT_DOUBLE_EQ(percentile({42.0}, 0), 42.0);
  EXPECT_DOUBLE_EQ(percentile({42.0}, 99), 42.0);
  EXPECT_DOUBLE_EQ(percentile({1.0, 2.0}, 50), 1.5);  // even count: mean of the middle two
  EXPECT_THROW(percentile({}, 50), Error);
  EXPECT_THROW(percentile({1.0}, -1), Error);
  EXPECT_THROW(percentile({1.0}, 100.5), Error);
}

TEST(BenchStats, SummarizeMatchesNumpy) {
  const Summary s = summarize({3.5, 1.0, 7.25, 2.0, 9.0, 4.0, 0.5});
  EXPECT_EQ(s.count, 7u);
  EXPECT_NEAR(s.mean, 3.892857142857143, 1e-12);
  EXPECT_NEAR(s.stddev, 2.951564787342055, 1e-12);  // numpy.std: population
  EXPECT_DOUBLE_EQ(s.min, 0.5);
  EXPECT_DOUBLE_EQ(s.max, 9.0);
  EXPECT_DOUBLE_EQ(s.median, 3.5);
  EXPECT_NEAR(s.p90, 7.95, 1e-12);
  EXPECT_NEAR(s.p99, 8.895, 1e-12);
}

TEST(BenchStats, SummarizeEmptyIsZero) {
  const Summary s = summarize({});
  EXPECT_EQ(s.count, 0u);
  EXPECT_EQ(s.median, 0);
}

TEST(BenchStats, JsonShapeAndScale) {
  const nlohmann::json j = to_json(summarize({0.001, 0.002, 0.003}), 1000);
  for (const char* key : {"count", "mean", "stddev", "min", "median", "max", "p90", "p99"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_EQ(j.size(), 8u);
  EXPECT_EQ(j["count"], 3);
  EXPECT_NEAR(j["median"].get<double>(), 2.0, 1e-9);
  EXPECT_NEAR(j["max"].get<double>(), 3.0, 1e-9);
}

}  // namespace
}  // namespace pagellm::bench
