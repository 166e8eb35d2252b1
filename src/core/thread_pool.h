// A fixed pool of worker threads for data-parallel kernels. The calling thread
// is worker 0, so a pool of size 1 runs everything inline. Workers spin briefly
// between jobs (a forward pass issues jobs back to back) and then sleep, so an
// idle server burns no CPU.
//
// Work is best split dynamically (run_dynamic / parallel_for): participants
// take chunks from a shared counter and the job ends when every chunk is
// done, without waiting for a worker the OS has not scheduled yet. On a busy
// machine that is the difference between microseconds and a scheduler tick
// per op.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>
#include <type_traits>
#include <vector>

namespace pagellm {

// Non-owning reference to a callable: no allocation per job.
template <typename Sig>
class FunctionRef;
template <typename R, typename... Args>
class FunctionRef<R(Args...)> {
 public:
  template <typename F, typename = std::enable_if_t<!std::is_same_v<std::decay_t<F>, FunctionRef>>>
  FunctionRef(F&& f)  // NOLINT: implicit by design
      : obj_(const_cast<void*>(static_cast<const void*>(&f))),
        call_([](void* o, Args... a) -> R { return (*static_cast<std::remove_reference_t<F>*>(o))(a...); }) {}
  R operator()(Args... a) const { return call_(obj_, a...); }

 private:
  void* obj_;
  R (*call_)(void*, Args...);
};

class ThreadPool {
 public:
  // n_threads <= 0 means all hardware threads.
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Runs fn(ith, nth) once on every thread; returns when all are done.
  // Not reentrant: call from one thread at a time, never from inside a job.
  void run(FunctionRef<void(int, int)> fn);

  // Runs fn(ith, nth) on the caller and on every worker that joins before the
  // caller's own call returns; a worker arriving later skips the job. So fn
  // must take its work from a shared counter until none is left. ith is
  // unique among the participants (per-thread scratch stays safe).
  void run_dynamic(FunctionRef<void(int, int)> fn);

  // Calls fn(begin, end) over chunks covering [0, n) (each a multiple of
  // `align` except the last), taken dynamically by the participating threads.
  // Runs inline when n < min_parallel: waking threads costs more than tiny work.
  void parallel_for(int64_t n, FunctionRef<void(int64_t, int64_t)> fn, int64_t align = 1, int64_t min_parallel = 1);

  static int64_t now_ns();

 private:
  void worker_loop(int ith);
  void wait_for_zero(std::atomic<int>& counter);
  void start(const FunctionRef<void(int, int)>* job, bool dynamic);

  int n_threads_;
  std::vector<std::thread> workers_;
  // Job number << 1 | (1 for run_dynamic): a worker learns a job's kind from
  // the very value that announced it. (A separate flag could already belong
  // to the next job when a late worker read it, and the worker would then run
  // that job twice.)
  std::atomic<uint64_t> generation_{0};
  std::atomic<uint64_t> open_generation_{0};  // the dynamic job accepting joiners, 0: none
  std::atomic<int> pending_{0};  // run(): workers yet to finish
  std::atomic<int> active_{0};   // run_dynamic(): workers inside the job
  std::atomic<int> sleepers_{0};
  std::atomic<bool> caller_sleeping_{false};
  std::atomic<bool> stop_{false};
  const FunctionRef<void(int, int)>* job_ = nullptr;
};

// Range of [0, n) that thread ith of nth owns, in multiples of align.
inline void split_range(int64_t n, int ith, int nth, int64_t align, int64_t& begin, int64_t& end) {
  const int64_t units = (n + align - 1) / align;
  const int64_t per = units / nth, extra = units % nth;
  const int64_t ub = ith * per + (ith < extra ? ith : extra);
  const int64_t ue = ub + per + (ith < extra ? 1 : 0);
  begin = ub * align < n ? ub * align : n;
  end = ue * align < n ? ue * align : n;
}

}  // namespace pagellm
