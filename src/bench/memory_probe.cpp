#include "bench/memory_probe.h"

#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <memory>

#include "core/aligned_buffer.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "core/util.h"

namespace pagellm::bench {

void MemoryProbeOptions::validate() const {
  PAGELLM_CHECK(buffer_bytes >= 4096, "--size must be at least 4 KiB, got {}", buffer_bytes);
  PAGELLM_CHECK(threads >= 0, "--threads must not be negative, got {}", threads);
  PAGELLM_CHECK(reps > 0, "--reps must be positive, got {}", reps);
}

uint64_t sum_words(const uint64_t* data, int64_t n_words) {
  // Eight independent sums: no loop-carried dependency limits the loads.
  uint64_t s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n_words; i += 8)
    for (int k = 0; k < 8; ++k) s[k] += data[i + k];
  for (; i < n_words; ++i) s[0] += data[i];
  return s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}

MemoryProbeResult run_memory_probe(const MemoryProbeOptions& opts, const Log& log) {
  opts.validate();
  ThreadPool pool(opts.threads);
  const int nth = pool.size();
  const int64_t n_words = opts.buffer_bytes / 8;
  // Huge pages like the weights get (core/aligned_buffer.h): the probe
  // measures the stream the decode kernels see.
  const size_t alloc = static_cast<size_t>((n_words * 8 + 63) / 64 * 64);
  const AlignedBuffer buf = allocate_aligned(alloc);
  auto* data = reinterpret_cast<uint64_t*>(buf.get());
  // Each thread writes the slice it will read (first touch places the pages
  // near it) with non-zero values.
  pool.run([&](int ith, int n) {
    int64_t b, e;
    split_range(n_words, ith, n, 8, b, e);
    for (int64_t i = b; i < e; ++i) data[i] = static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull + 1;
  });
  const int64_t passes = std::max<int64_t>(1, (opts.min_bytes_per_rep + n_words * 8 - 1) / (n_words * 8));
  MemoryProbeResult r;
  r.threads = nth;
  r.buffer_bytes = n_words * 8;
  r.bytes_per_rep = passes * n_words * 8;
  std::vector<uint64_t> partial(static_cast<size_t>(nth) * 8, 0);  // one cache line per thread
  for (int rep = 0; rep < opts.reps; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.run([&](int ith, int n) {
      int64_t b, e;
      split_range(n_words, ith, n, 8, b, e);
      uint64_t s = 0;
      for (int64_t p = 0; p < passes; ++p) {
        // The compiler must not fold repeated sums of unchanged memory into one.
        asm volatile("" : : "r"(data) : "memory");
        s += sum_words(data + b, e - b);
      }
      partial[static_cast<size_t>(ith) * 8] += s;
    });
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.gb_per_s.push_back(static_cast<double>(r.bytes_per_rep) / sec / 1e9);
    if (log) log(fmt::format("rep {}: {:.2f} GB/s", rep + 1, r.gb_per_s.back()));
  }
  for (size_t i = 0; i < partial.size(); i += 8) r.checksum += partial[i];
  return r;
}

nlohmann::json memory_probe_json(const MemoryProbeResult& r) {
  return {{"threads", r.threads},
          {"buffer_bytes", r.buffer_bytes},
          {"bytes_per_rep", r.bytes_per_rep},
          {"read_gb_per_s", to_json(summarize(r.gb_per_s))},
          {"reps", r.gb_per_s},
          {"checksum", r.checksum}};
}

std::string memory_probe_summary(const MemoryProbeResult& r) {
  return fmt::format("memory: read {} with {} thread{}, {} reps: {} GB/s (median [min, max])\n",
                     format_bytes(r.buffer_bytes), r.threads, r.threads == 1 ? "" : "s", r.gb_per_s.size(),
                     median_range(summarize(r.gb_per_s), 2));
}

}  // namespace pagellm::bench
