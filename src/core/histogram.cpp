#include "core/histogram.h"

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

}  // namespace pagellm
