#include "spec/adaptive.h"

#include <algorithm>

namespace pagellm {

void AdaptiveSpeculation::record(int32_t proposed, int32_t accepted) {
  if (proposed <= 0) return;
  successes_ = 0.9 * successes_ + accepted;
  trials_ = 0.9 * trials_ + accepted + (accepted < proposed ? 1 : 0);
  const double rate = static_cast<double>(accepted) / proposed;
  rate_ = 0.5 * rate_ + 0.5 * rate;
  if (rate >= 0.5) next_pause_ = kFirstPause;
  if (rate_ >= kMinAcceptance) return;
  pause_ = next_pause_;
  next_pause_ = std::min(2 * next_pause_, kLongestPause);
  // After the pause one good verification keeps it going, one bad pauses again.
  rate_ = kMinAcceptance + 0.1;
}

}  // namespace pagellm
