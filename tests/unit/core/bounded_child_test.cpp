// run_bounded_child: results come back, and every way a child can go wrong
// (too slow, too big, thrown, crashed, no longer wanted) ends in a status,
// with no child left behind.
#include "core/bounded_child.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <vector>

namespace pagellm {
namespace {

using Status = ChildResult::Status;
using namespace std::chrono_literals;

ChildBudget budget(std::chrono::milliseconds time, size_t memory = size_t{256} << 20) {
  ChildBudget b;
  b.time = time;
  b.memory_bytes = memory;
  return b;
}

// No child of ours is left: waitpid finds nothing to reap.
void expect_no_children() {
  int st = 0;
  EXPECT_EQ(waitpid(-1, &st, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);
}

TEST(BoundedChild, ReturnsTheBytesOfTheFunction) {
  const std::vector<int> inherited = {1, 2, 3};  // the child sees the parent's memory
  const ChildResult r = run_bounded_child(
      [&] {
        std::string out(3 << 20, 'x');  // larger than a pipe's buffer
        out += std::to_string(inherited[0] + inherited[1] + inherited[2]);
        return out;
      },
      budget(10s));
  ASSERT_EQ(r.status, Status::Ok) << r.output.substr(0, 200);
  EXPECT_EQ(r.output.size(), (size_t{3} << 20) + 1);
  EXPECT_EQ(r.output.back(), '6');
  expect_no_children();
}

TEST(BoundedChild, AThrownErrorComesBackAsItsMessage) {
  const ChildResult r = run_bounded_child([]() -> std::string { throw std::runtime_error("no such rule"); }, budget(10s));
  EXPECT_EQ(r.status, Status::Failed);
  EXPECT_EQ(r.output, "no such rule");
}

TEST(BoundedChild, StopsAtTheTimeBudget) {
  const auto t0 = std::chrono::steady_clock::now();
  const ChildResult r = run_bounded_child(
      []() -> std::string {
        for (;;) std::this_thread::sleep_for(1ms);
      },
      budget(200ms));
  EXPECT_EQ(r.status, Status::OverTime);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  expect_no_children();
}

TEST(BoundedChild, StopsAtTheMemoryBudget) {
  const ChildResult r = run_bounded_child(
      []() -> std::string {
        std::vector<std::vector<char>> hog;
        for (;;) {
          hog.emplace_back(size_t{8} << 20);
          std::memset(hog.back().data(), 1, hog.back().size());  // resident, not only reserved
        }
      },
      budget(30s, size_t{64} << 20));
  EXPECT_EQ(r.status, Status::OverMemory) << to_string(r.status) << ": " << r.output;
  expect_no_children();
}

TEST(BoundedChild, StopsWhenCancelled) {
  std::atomic<bool> cancel{false};
  std::thread canceller([&] {
    std::this_thread::sleep_for(100ms);
    cancel = true;
  });
  const ChildResult r = run_bounded_child(
      []() -> std::string {
        for (;;) std::this_thread::sleep_for(1ms);
      },
      budget(30s), [&] { return cancel.load(); });
  canceller.join();
  EXPECT_EQ(r.status, Status::Cancelled);
  EXPECT_LT(r.seconds, 5.0);
  expect_no_children();
}

TEST(BoundedChild, ACrashIsReportedNotInherited) {
  const ChildResult r = run_bounded_child(
      []() -> std::string {
        ::raise(SIGKILL);  // (a sanitizer would turn SIGSEGV into an exit status)
        return "unreachable";
      },
      budget(10s));
  EXPECT_EQ(r.status, Status::Crashed);
  EXPECT_NE(r.output.find("signal 9"), std::string::npos) << r.output;
  expect_no_children();
}

TEST(BoundedChild, ManyAtOnceFromSeveralThreads) {
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 5; ++i) {
        const ChildResult r = run_bounded_child([&] { return std::to_string(t * 100 + i); }, budget(10s));
        if (r.status == Status::Ok && r.output == std::to_string(t * 100 + i)) ok++;
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok.load(), 20);
  expect_no_children();
}

}  // namespace
}  // namespace pagellm
