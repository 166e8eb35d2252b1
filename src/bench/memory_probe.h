// Memory read bandwidth probe: N threads stream disjoint slices of one buffer
// and sum them. Decode at batch 1 reads every weight once per token, so this
// figure over the weight bytes is the decode roofline.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/offline.h"

namespace pagellm::bench {

struct MemoryProbeOptions {
  int64_t buffer_bytes = int64_t{1} << 30;  // larger than any cache: DRAM bandwidth
  int threads = 0;                          // 0: all cores
  int reps = 5;
  // Each rep reads at least this much (small buffers are swept several times
  // so the time is long enough to measure).
  int64_t min_bytes_per_rep = int64_t{1} << 30;
  void validate() const;
};

struct MemoryProbeResult {
  int threads = 0;
  int64_t buffer_bytes = 0;
  int64_t bytes_per_rep = 0;
  std::vector<double> gb_per_s;  // one per rep, 1 GB = 1e9 bytes
  uint64_t checksum = 0;         // keeps the reads from being optimised away
};

MemoryProbeResult run_memory_probe(const MemoryProbeOptions& opts, const Log& log = {});
nlohmann::json memory_probe_json(const MemoryProbeResult& r);
std::string memory_probe_summary(const MemoryProbeResult& r);

// Sum of the 64-bit words of [data, data + n_words): the read kernel, exposed
// for its test.
uint64_t sum_words(const uint64_t* data, int64_t n_words);

}  // namespace pagellm::bench
