#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <numeric>
#include <vector>

namespace pagellm {

TEST(ThreadPool, EveryThreadRunsOncePerJob) {
  ThreadPool pool(4);
  for (int job = 0; job < 1000; ++job) {
    std::vector<std::atomic<int>> hits(4);
    pool.run([&](int ith, int nth) {
      EXPECT_EQ(nth, 4);
      hits[ith].fetch_add(1);
    });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1);
  }
}

TEST(ThreadPool, ParallelForCoversRangeExactlyOnce) {
  ThreadPool pool(3);
  for (int64_t n : {0, 1, 5, 31, 32, 33, 1000}) {
    std::vector<int> seen(static_cast<size_t>(n), 0);
    pool.parallel_for(n, [&](int64_t b, int64_t e) {
      EXPECT_EQ(b % 8, 0);
      for (int64_t i = b; i < e; ++i) seen[i]++;
    }, 8);
    for (int v : seen) ASSERT_EQ(v, 1);
  }
}

TEST(ThreadPool, SleepsAndWakesUp) {
  ThreadPool pool(2);
  std::atomic<int> total{0};
  pool.run([&](int, int) { total++; });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // workers go to sleep
  pool.run([&](int, int) { total++; });
  EXPECT_EQ(total.load(), 4);
}

// A dynamic job (late workers skip it) right before a run() job (every
// worker exactly once): a worker late for the first must run the second once,
// not twice, and run() must not return before every worker is done.
TEST(ThreadPool, MixedJobKindsRunEveryWorkerOnce) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> hits(3);
  for (int rep = 0; rep < 5000; ++rep) {
    pool.parallel_for(64, [](int64_t, int64_t) {});
    for (auto& h : hits) h.store(0);
    pool.run([&](int ith, int) { hits[ith].fetch_add(1); });
    for (int i = 0; i < 3; ++i) ASSERT_EQ(hits[i].load(), 1) << "worker " << i << ", round " << rep;
  }
}

TEST(ThreadPool, SplitRangeIsBalanced) {
  int64_t b, e;
  split_range(10, 0, 3, 1, b, e);
  EXPECT_EQ(b, 0);
  EXPECT_EQ(e, 4);
  split_range(10, 2, 3, 1, b, e);
  EXPECT_EQ(b, 7);
  EXPECT_EQ(e, 10);
}

}  // namespace pagellm
