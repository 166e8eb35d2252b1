// `pagellm bench memory --kv-report`: a mixed workload through an engine, and
// the KV pool as it looks at its fullest: block usage, fragmentation, the
// sizes of the runs of available blocks, and how often a growing sequence got
// the block next to its last one (contiguous placement).
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"

namespace pagellm::bench {

struct KvReportOptions {
  int32_t num_prompts = 64;
  int32_t min_input = 16, max_input = 512;
  int32_t min_output = 16, max_output = 256;
  uint64_t seed = 0;
};

struct KvReport {
  int32_t block_size = 0, total_blocks = 0;
  int64_t steps = 0, preemptions = 0;
  // At the step with the most used blocks:
  int32_t peak_used = 0, peak_cached = 0, peak_free = 0;
  double peak_fragmentation = 0;
  std::vector<std::pair<int32_t, int32_t>> peak_runs;  // run length -> count
  int64_t following_allocations = 0, contiguous_allocations = 0;
  double contiguous_hit_rate() const {
    return following_allocations ? double(contiguous_allocations) / double(following_allocations) : 0.0;
  }
};

KvReport run_kv_report(Engine& engine, const KvReportOptions& o, const std::function<void(const std::string&)>& log);
std::string kv_report_summary(const KvReport& r);
nlohmann::json kv_report_json(const KvReport& r);

}  // namespace pagellm::bench
