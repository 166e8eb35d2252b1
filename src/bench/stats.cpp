#include "bench/stats.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace pagellm::bench {

double percentile(std::vector<double> values, double p) {
  PAGELLM_CHECK(!values.empty(), "percentile of no values");
  PAGELLM_CHECK(p >= 0 && p <= 100, "percentile {} is outside [0, 100]", p);
  std::sort(values.begin(), values.end());
  // Rank on a 0..n-1 scale, interpolated between its two neighbours.
  const double rank = p / 100.0 * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  const double frac = rank - static_cast<double>(lo);
  return values[lo] + (values[hi] - values[lo]) * frac;
}

Summary summarize(const std::vector<double>& values) {
  Summary s;
  if (values.empty()) return s;
  s.count = values.size();
  double sum = 0;
  for (double v : values) sum += v;
  s.mean = sum / static_cast<double>(s.count);
  double sq = 0;
  for (double v : values) sq += (v - s.mean) * (v - s.mean);
  s.stddev = std::sqrt(sq / static_cast<double>(s.count));
  const auto [mn, mx] = std::minmax_element(values.begin(), values.end());
  s.min = *mn;
  s.max = *mx;
  s.median = percentile(values, 50);
  s.p90 = percentile(values, 90);
  s.p99 = percentile(values, 99);
  return s;
}

nlohmann::json to_json(const Summary& s, double scale) {
  return {{"count", s.count},         {"mean", s.mean * scale},     {"stddev", s.stddev * scale},
          {"min", s.min * scale},     {"median", s.median * scale}, {"max", s.max * scale},
          {"p90", s.p90 * scale},     {"p99", s.p99 * scale}};
}

}  // namespace pagellm::bench
