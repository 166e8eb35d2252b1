#include "bench/memory_probe.h"

#include <gtest/gtest.h>

#include <random>

#include "core/error.h"

namespace pagellm::bench {
namespace {

TEST(BenchMemory, SumWordsMatchesPlainSum) {
  std::mt19937_64 rng(1);
  for (int64_t n : {0, 1, 7, 8, 9, 1000, 1027}) {
    std::vector<uint64_t> v(static_cast<size_t>(n));
    uint64_t want = 0;
    for (auto& x : v) want += (x = rng());
    EXPECT_EQ(sum_words(v.data(), n), want) << n;
  }
}

TEST(BenchMemory, SmallProbeRuns) {
  MemoryProbeOptions o;
  o.buffer_bytes = 256 << 10;
  o.min_bytes_per_rep = 1 << 20;  // 4 passes
  o.threads = 2;
  o.reps = 2;
  const MemoryProbeResult r = run_memory_probe(o);
  EXPECT_EQ(r.threads, 2);
  EXPECT_EQ(r.buffer_bytes, 256 << 10);
  EXPECT_EQ(r.bytes_per_rep, 1 << 20);
  ASSERT_EQ(r.gb_per_s.size(), 2u);
  for (double g : r.gb_per_s) EXPECT_GT(g, 0);
  // The data is a fixed function of the index: the sum is known.
  uint64_t want = 0;
  for (int64_t i = 0; i < r.buffer_bytes / 8; ++i) want += static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull + 1;
  EXPECT_EQ(r.checksum, want * 4 * 2);  // 4 passes x 2 reps
  const nlohmann::json j = memory_probe_json(r);
  EXPECT_EQ(j["read_gb_per_s"]["count"], 2);
  EXPECT_THROW(run_memory_probe(MemoryProbeOptions{.buffer_bytes = 100}), Error);
}

}  // namespace
}  // namespace pagellm::bench
