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

  bool paused() const { return pause_ > 0; }
  // The chance that a draft is accepted once the ones before it were: each
  // verification counts its accepted drafts as successes and its first
  // rejection, if any, as a failure (recent ones weigh most). What the engine
  // expects the next draft at position j to yield: this to the power j.
  double per_draft_acceptance() const { return successes_ / trials_; }
  // A step in which it was given no drafts: the estimate drifts back toward
  // the prior, so that a sequence whose text changes is tried again.
  void idle() {
    successes_ = 0.95 * successes_ + 0.05 * kPriorSuccesses;
    trials_ = 0.95 * trials_ + 0.05 * kPriorTrials;
  }

 private:
  double rate_ = 1.0;
  static constexpr double kPriorSuccesses = 1.2, kPriorTrials = 2.0;  // 0.6, worth two drafts
  double successes_ = kPriorSuccesses, trials_ = kPriorTrials;
  int32_t pause_ = 0;
  int32_t next_pause_ = kFirstPause;
};

}  // namespace pagellm
