// The int8 peak of AVX-512 VNNI: back-to-back independent vpdpbusd, the
// ceiling the quantized GEMM kernels are measured against (bench ops); and
// the float peaks of 512-bit FMA and vdpbf16ps for the F16 / BF16 panels.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <atomic>
#include <ctime>
#include <thread>
#include <vector>

#include "backend/cpu/peak.h"

namespace pagellm::cpu::avx512 {
namespace {

// 12 independent chains (more than latency x throughput on current cores),
// in named registers: an array of accumulators would live on the stack.
template <typename V, V (*Dp)(V, V, V)>
int64_t dpbusd_loop(int64_t iters, V u, V s, int32_t& sink) {
  V a0 = u, a1 = u, a2 = u, a3 = u, a4 = u, a5 = u, a6 = u, a7 = u, a8 = u, a9 = u, a10 = u, a11 = u;
  for (int64_t i = 0; i < iters; ++i) {
    a0 = Dp(a0, u, s), a1 = Dp(a1, u, s), a2 = Dp(a2, u, s), a3 = Dp(a3, u, s);
    a4 = Dp(a4, u, s), a5 = Dp(a5, u, s), a6 = Dp(a6, u, s), a7 = Dp(a7, u, s);
    a8 = Dp(a8, u, s), a9 = Dp(a9, u, s), a10 = Dp(a10, u, s), a11 = Dp(a11, u, s);
    asm("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6), "+v"(a7), "+v"(a8), "+v"(a9),
        "+v"(a10), "+v"(a11));
  }
  const V total = Dp(Dp(Dp(Dp(Dp(Dp(Dp(Dp(Dp(Dp(Dp(a0, a1, s), a2, s), a3, s), a4, s), a5, s), a6, s), a7, s), a8, s),
                             a9, s), a10, s), a11, s);
  int32_t lanes[sizeof(V) / 4];
  __builtin_memcpy(lanes, &total, sizeof(V));
  sink += lanes[0];
  return iters * 12;
}

double thread_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

__m512i dp512(__m512i a, __m512i u, __m512i s) { return _mm512_dpbusd_epi32(a, u, s); }
__m256i dp256(__m256i a, __m256i u, __m256i s) { return _mm256_dpbusd_epi32(a, u, s); }
__m512 fma512(__m512 a, __m512 u, __m512 s) { return _mm512_fmadd_ps(u, s, a); }
__m512 bf16dp512(__m512 a, __m512 u, __m512 s) { return _mm512_dpbf16_ps(a, (__m512bh)u, (__m512bh)s); }

// Each thread runs `loop` (returning instructions issued) until it has used
// `seconds` of its CPU time (its own rate while it runs, even when other
// processes share the cores); the sum of the threads' instructions per second.
template <typename Loop>
double per_second(int threads, double seconds, Loop loop) {
  std::atomic<int> ready{0};
  std::vector<double> rates(static_cast<size_t>(threads), 0);
  std::vector<int32_t> sinks(static_cast<size_t>(threads) * 16, 0);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      ready.fetch_add(1);
      while (ready.load() < threads) {
      }
      const double t0 = thread_cpu_seconds();
      int64_t instructions = 0;
      double elapsed = 0;
      do {
        instructions += loop(sinks[static_cast<size_t>(t) * 16]);
        elapsed = thread_cpu_seconds() - t0;
      } while (elapsed < seconds);
      rates[static_cast<size_t>(t)] = static_cast<double>(instructions) / elapsed;
    });
  }
  for (auto& th : pool) th.join();
  double total = 0;
  for (double r : rates) total += r;
  return total;
}

}  // namespace

double float_peak_gflops(int threads, bool bf16, double seconds) {
  // Small values: 12 x 2^16 chained FMAs per call stay finite.
  const __m512 u = _mm512_set1_ps(bf16 ? 1e-3f : 1e-6f), s = _mm512_set1_ps(1e-3f);
  const double per_second_instr = per_second(threads, seconds, [&](int32_t& sink) {
    return bf16 ? dpbusd_loop<__m512, bf16dp512>(1 << 16, u, s, sink) : dpbusd_loop<__m512, fma512>(1 << 16, u, s, sink);
  });
  // FMA: 16 lanes; vdpbf16ps: 32 products into 16 lanes. A multiply and an add each.
  return per_second_instr * (bf16 ? 32 : 16) * 2 / 1e9;
}

double int8_peak_gops(int threads, int bits, double seconds) {
  const double per_second_instr = per_second(threads, seconds, [&](int32_t& sink) {
    return bits == 512 ? dpbusd_loop<__m512i, dp512>(1 << 16, _mm512_set1_epi8(3), _mm512_set1_epi8(-5), sink)
                       : dpbusd_loop<__m256i, dp256>(1 << 16, _mm256_set1_epi8(3), _mm256_set1_epi8(-5), sink);
  });
  // bits / 8 products per instruction, a multiply and an add each.
  return per_second_instr * (bits / 8) * 2 / 1e9;
}

}  // namespace pagellm::cpu::avx512
