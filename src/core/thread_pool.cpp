#include "core/thread_pool.h"

#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define PAGELLM_PAUSE() _mm_pause()
#else
#define PAGELLM_PAUSE() std::this_thread::yield()
#endif

namespace pagellm {
namespace {
// About 50-100 us of spinning before a thread sleeps. Jobs of one forward
// pass come back to back, so workers usually catch the next one spinning; when
// the machine is oversubscribed, sleeping (futex) beats spinning against the
// very thread we wait for.
constexpr int kSpinIterations = 20000;
// parallel_for: chunks per thread, so that a slow thread's share is picked up.
constexpr int64_t kChunksPerThread = 4;
}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::thread::hardware_concurrency());
  if (n_threads <= 0) n_threads = 1;
  n_threads_ = n_threads;
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  generation_.fetch_add(2);  // a new job number; workers see stop_ first
  generation_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker_loop(int ith) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t gen = generation_.load(std::memory_order_acquire);
    for (int spin = 0; gen == seen && spin < kSpinIterations; ++spin) {
      PAGELLM_PAUSE();
      gen = generation_.load(std::memory_order_acquire);
    }
    if (gen == seen) {
      sleepers_.fetch_add(1);
      generation_.wait(seen);
      sleepers_.fetch_sub(1);
      continue;
    }
    seen = gen;
    if (stop_.load()) return;
    if (gen & 1) {
      // Join only while this very job is open; seq_cst pairs with the
      // caller's close-then-check in run_dynamic().
      active_.fetch_add(1);
      if (open_generation_.load() == gen) (*job_)(ith, n_threads_);
      if (active_.fetch_sub(1) == 1 && caller_sleeping_.load()) active_.notify_one();
    } else {
      (*job_)(ith, n_threads_);
      if (pending_.fetch_sub(1) == 1 && caller_sleeping_.load()) pending_.notify_one();
    }
  }
}

void ThreadPool::wait_for_zero(std::atomic<int>& counter) {
  for (int spin = 0; counter.load(std::memory_order_acquire) != 0; ++spin) {
    if (spin < kSpinIterations) {
      PAGELLM_PAUSE();
      continue;
    }
    // seq_cst store/load pair with the worker's decrement / caller_sleeping_ load.
    caller_sleeping_.store(true);
    const int left = counter.load();
    if (left != 0) counter.wait(left);
    caller_sleeping_.store(false);
  }
}

void ThreadPool::start(const FunctionRef<void(int, int)>* job, bool dynamic) {
  job_ = job;
  const uint64_t gen = ((generation_.load() >> 1) + 1) << 1 | (dynamic ? 1 : 0);
  if (dynamic) open_generation_.store(gen);
  else pending_.store(n_threads_ - 1);
  generation_.store(gen);  // seq_cst: pairs with sleepers_ (Dekker)
  if (sleepers_.load() > 0) generation_.notify_all();
}

void ThreadPool::run(FunctionRef<void(int, int)> fn) {
  if (n_threads_ == 1) {
    fn(0, 1);
    return;
  }
  start(&fn, false);
  fn(0, n_threads_);
  wait_for_zero(pending_);
  job_ = nullptr;
}

void ThreadPool::run_dynamic(FunctionRef<void(int, int)> fn) {
  if (n_threads_ == 1) {
    fn(0, 1);
    return;
  }
  start(&fn, true);
  fn(0, n_threads_);
  // Every chunk is taken: close the job to late joiners, then wait only for
  // the workers already inside it.
  open_generation_.store(0);
  wait_for_zero(active_);
  job_ = nullptr;
}

void ThreadPool::parallel_for(int64_t n, FunctionRef<void(int64_t, int64_t)> fn, int64_t align,
                              int64_t min_parallel) {
  if (n <= 0) return;
  if (n_threads_ == 1 || n <= align || n < min_parallel) {
    fn(0, n);
    return;
  }
  const int64_t units = (n + align - 1) / align;
  const int64_t chunks = std::min<int64_t>(units, n_threads_ * kChunksPerThread);
  std::atomic<int64_t> next{0};
  run_dynamic([&](int, int) {
    for (int64_t c = next.fetch_add(1, std::memory_order_relaxed); c < chunks;
         c = next.fetch_add(1, std::memory_order_relaxed)) {
      int64_t b, e;
      split_range(n, static_cast<int>(c), static_cast<int>(chunks), align, b, e);
      if (b < e) fn(b, e);
    }
  });
}

int64_t ThreadPool::now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace pagellm
