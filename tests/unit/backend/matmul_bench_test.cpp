// Matmul throughput on TinyLlama-shaped weights. Not part of the default run:
//   ./build/pagellm_tests --gtest_also_run_disabled_tests --gtest_filter='*MatmulBench*'
// Optional: PAGELLM_BENCH_TYPES=q4_0,q8_0,q4_k  PAGELLM_BENCH_NS=1,128,512
//           PAGELLM_BENCH_COPIES=1 (weights stay in L3: kernel speed alone)
//           PAGELLM_BENCH_THREADS=1,2  PAGELLM_BENCH_SECONDS=0.5 (per configuration)
//
// n = 1 reports GB/s of weight bytes streamed. The weights of one matrix fit
// in this machine's 32 MiB L3, so decode rotates over enough copies (> 96 MiB)
// that every call reads from DRAM, as in a real model. n > 1 reports GOP/s
// (2 * rows * cols * n operations per call). Rates from the best and the
// median call (wall time), and for one thread from the median thread CPU time
// (the kernel's cost even when other processes share the cores).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <random>
#include <sstream>

#include "backend/cpu/matmul.h"
#include "backend/cpu/quants.h"
#include "core/fp16.h"
#include "core/util.h"

namespace pagellm::cpu {
namespace {

// Random blocks with a small fixed scale: timing does not depend on values.
std::vector<uint8_t> random_blocks(DType type, int64_t rows, int64_t cols, uint32_t seed) {
  const size_t row_bytes = dtype_row_bytes(type, cols);
  std::vector<uint8_t> data(row_bytes * static_cast<size_t>(rows));
  std::mt19937 rng(seed);
  for (size_t i = 0; i < data.size(); i += 4) {
    const uint32_t v = rng();
    std::memcpy(data.data() + i, &v, std::min<size_t>(4, data.size() - i));
  }
  const int bs = dtype_block_size(type);
  const size_t block_bytes = row_bytes / static_cast<size_t>(cols / bs);
  const uint16_t d = fp32_to_fp16(0.001f);
  for (size_t off = 0; off < data.size(); off += block_bytes) {
    // The fp16 scale fields: first for most types, last for Q6_K / Q3_K,
    // last two for Q2_K (MXFP4's e8m0 byte takes the half's low byte).
    if (type == DType::Q6_K || type == DType::Q3_K) {
      std::memcpy(data.data() + off + block_bytes - 2, &d, 2);
    } else if (type == DType::Q2_K) {
      std::memcpy(data.data() + off + block_bytes - 4, &d, 2);
      std::memcpy(data.data() + off + block_bytes - 2, &d, 2);
    } else {
      std::memcpy(data.data() + off, &d, 2);
      if (type == DType::Q4_1 || type == DType::Q5_1 || type == DType::Q4_K || type == DType::Q5_K)
        std::memcpy(data.data() + off + 2, &d, 2);
    }
  }
  return data;
}

template <typename T>
std::vector<T> env_list(const char* name, std::vector<T> fallback, T (*parse)(const std::string&)) {
  const std::string s = env_or(name, "");
  if (s.empty()) return fallback;
  std::vector<T> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(parse(item));
  return out;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// CPU time of the calling thread: with one thread, the kernel's own cost
// even while other processes take turns on the cores.
double thread_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

TEST(MatmulBench, DISABLED_TinyLlamaShapes) {
  const auto types = env_list<DType>("PAGELLM_BENCH_TYPES", {DType::Q4_0, DType::Q8_0, DType::Q4_K},
                                     [](const std::string& s) { return dtype_from_name(s); });
  const auto ns = env_list<int64_t>("PAGELLM_BENCH_NS", {1, 128, 512},
                                    [](const std::string& s) { return static_cast<int64_t>(std::stoll(s)); });
  const int64_t shapes[2][2] = {{5632, 2048}, {2048, 5632}};  // rows (out) x cols (in)
  const double seconds = std::stod(env_or("PAGELLM_BENCH_SECONDS", "0.5"));
  const auto thread_counts = env_list<int>("PAGELLM_BENCH_THREADS", {1, 2}, [](const std::string& s) { return std::stoi(s); });
  std::printf("isa %s\n%-5s %-10s %-7s %5s %9s %9s %14s %14s %14s\n", isa_name(kernel_isa()), "type",
              "rows x cols", "threads", "n", "best ms", "median ms", "best rate", "median rate", "cpu rate (1t)");
  for (DType type : types) {
    for (const auto& shape : shapes) {
      const int64_t rows = shape[0], cols = shape[1];
      const size_t bytes = dtype_row_bytes(type, cols) * static_cast<size_t>(rows);
      int copies = static_cast<int>(std::max<size_t>(1, (96u << 20) / bytes + 1));
      if (const std::string c = env_or("PAGELLM_BENCH_COPIES", ""); !c.empty()) copies = std::stoi(c);
      std::vector<std::vector<uint8_t>> data;
      std::vector<std::unique_ptr<MatmulWeight>> w;
      for (int c = 0; c < copies; ++c) {
        data.push_back(random_blocks(type, rows, cols, static_cast<uint32_t>(c)));
        w.push_back(prepare_matmul_weight(type, rows, cols, data.back().data()));
      }
      const int64_t max_n = *std::max_element(ns.begin(), ns.end());
      std::vector<float> x(static_cast<size_t>(max_n * cols));
      std::mt19937 rng(1);
      std::normal_distribution<float> dist;
      for (float& v : x) v = dist(rng);
      std::vector<float> y(static_cast<size_t>(max_n * rows));
      for (int threads : thread_counts) {
        ThreadPool pool(threads);
        for (int64_t n : ns) {
          // Warm-up, then enough calls for ~0.5 s, each timed: the best call
          // is the kernel's speed, the median what this (shared) machine gave.
          matmul(pool, *w[0], x.data(), n, y.data());
          std::vector<double> times, cpu_times;
          const auto t0 = std::chrono::steady_clock::now();
          while (seconds_since(t0) < seconds || times.size() < 5) {
            const double cpu0 = thread_cpu_seconds();
            const auto c0 = std::chrono::steady_clock::now();
            matmul(pool, *w[times.size() % copies], x.data(), n, y.data());
            times.push_back(seconds_since(c0));
            cpu_times.push_back(thread_cpu_seconds() - cpu0);
          }
          std::sort(times.begin(), times.end());
          std::sort(cpu_times.begin(), cpu_times.end());
          const double best = times.front(), median = times[times.size() / 2];
          const double cpu = threads == 1 ? cpu_times[cpu_times.size() / 2] : 0;
          const double work = n == 1 ? static_cast<double>(bytes) : 2.0 * rows * cols * n;
          const char* unit = n == 1 ? "GB/s" : "GOP/s";
          std::printf("%-5s %4lldx%-5lld %-7d %5lld %9.3f %9.3f %8.1f %-5s %8.1f %-5s", dtype_name(type).c_str(),
                      static_cast<long long>(rows), static_cast<long long>(cols), threads, static_cast<long long>(n),
                      best * 1e3, median * 1e3, work / best / 1e9, unit, work / median / 1e9, unit);
          if (cpu > 0) std::printf(" %8.1f %-5s", work / cpu / 1e9, unit);
          std::printf("\n");
          std::fflush(stdout);
        }
      }
    }
  }
}

}  // namespace
}  // namespace pagellm::cpu
