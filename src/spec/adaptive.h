// Per-sequence control of speculation: verifying drafts costs a little more
// than a plain decode, so a sequence whose drafts keep being rejected (free
// text with nothing to copy, a draft model that disagrees) stops proposing
// for a while, for longer each time acceptance stays low, and tries again.
#pragma once

#include <cstdint>

namespace pagellm {

class AdaptiveSpeculation {
 public:
  // Below this share of accepted drafts (a moving average over recent
  // verifications) speculation pauses.
  static constexpr double kMinAcceptance = 0.3;
  static constexpr int32_t kFirstPause = 4;   // steps
  static constexpr int32_t kLongestPause = 64;

  // Whether to propose drafts this step; counts a pause down.
  bool should_propose() {
    if (pause_ == 0) return true;
    --pause_;
    return false;
  }

  // One verification: `proposed` drafts ran, the first `accepted` were kept.
  void record(int32_t proposed, int32_t accepted);

  double acceptance() const { return rate_; }
  bool paused() const { return pause_ > 0; }

 private:
  double rate_ = 1.0;
  int32_t pause_ = 0;
  int32_t next_pause_ = kFirstPause;
};

}  // namespace pagellm
