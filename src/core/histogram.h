// A cumulative histogram with fixed upper bounds (Prometheus semantics), for
// the engine's latency metrics and the grammar compiler's compile times.
#pragma once

#include <cstdint>
#include <vector>

namespace pagellm {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds = {});
  void observe(double v);
  const std::vector<double>& bounds() const { return bounds_; }
  const std::vector<uint64_t>& counts() const { return counts_; }  // per bucket, last = +Inf
  uint64_t count() const { return count_; }
  double sum() const { return sum_; }
  // Value below which a fraction q of the observations fall (bucket interpolation).
  double quantile(double q) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  uint64_t count_ = 0;
  double sum_ = 0;
};

}  // namespace pagellm
