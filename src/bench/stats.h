// Summary statistics for benchmark samples: percentiles as numpy computes
// them by default (linear interpolation between closest ranks), so figures
// compare with vLLM's benchmark scripts.
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

namespace pagellm::bench {

// The p-th percentile (p in [0, 100]) of `values` (any order). Throws Error
// for an empty input or p out of range.
double percentile(std::vector<double> values, double p);

struct Summary {
  size_t count = 0;
  double mean = 0, stddev = 0;  // population standard deviation
  double min = 0, median = 0, max = 0;
  double p90 = 0, p99 = 0;
};

// All zeros (count 0) for an empty input.
Summary summarize(const std::vector<double>& values);

// {"count", "mean", "stddev", "min", "median", "max", "p90", "p99"}, each
// scaled by `scale` (e.g. 1000 for seconds -> milliseconds) except count.
nlohmann::json to_json(const Summary& s, double scale = 1.0);

}  // namespace pagellm::bench
