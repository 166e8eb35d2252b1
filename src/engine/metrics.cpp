#include "engine/metrics.h"

#include <algorithm>

namespace pagellm {

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  const size_t i = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  counts_[i]++;
  count_++;
  sum_ += v;
}

double Histogram::quantile(double q) const {
  if (count_ == 0) return 0;
  const double target = q * static_cast<double>(count_);
  double seen = 0;
  for (size_t i = 0; i < counts_.size(); ++i) {
    if (seen + counts_[i] >= target && counts_[i] > 0) {
      const double lo = i == 0 ? 0 : bounds_[i - 1];
      const double hi = i < bounds_.size() ? bounds_[i] : lo;
      return lo + (hi - lo) * (target - seen) / static_cast<double>(counts_[i]);
    }
    seen += counts_[i];
  }
  return bounds_.empty() ? 0 : bounds_.back();
}

EngineMetrics::EngineMetrics()
    // Bucket bounds as vLLM's, extended for slow CPU runs.
    : time_to_first_token({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                           10.0, 20.0, 40.0, 80.0, 160.0, 640.0}),
      inter_token_latency({0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                           20.0, 40.0, 80.0}),
      e2e_request_latency({0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                           240.0, 480.0, 960.0, 1920.0, 7680.0}),
      request_queue_time({0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                          240.0, 480.0, 960.0, 1920.0, 7680.0}),
      iteration_tokens({1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384}),
      scheduler_seconds({1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1}),
      batch_fill_ratio({0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0}) {}

}  // namespace pagellm
