// Stop strings for one sequence's streamed text.
//
// Text arrives as deltas from the incremental detokenizer. Whatever could
// still turn out to be the start of a stop string is held back, so a client
// never sees text that is later cut off; everything else is released at once.
// The match rule is the stop string that ENDS first in the text (the longest
// one on a tie), which gives the same answer however the text was split into
// deltas.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace pagellm {

struct StopCheckResult {
  std::string text;         // safe to emit now (may be empty)
  bool stopped = false;     // a stop string matched: finish with reason "stop"
  int32_t stop_index = -1;  // which entry of the stop list, when stopped
};

class StopChecker {
 public:
  // Empty stop strings are ignored (SamplingParams::validate rejects them).
  explicit StopChecker(std::vector<std::string> stop, bool include_stop_str_in_output = false);

  // Appends `delta` and returns what may be emitted. On a match the text ends
  // just before the stop string (or just after it with
  // include_stop_str_in_output) and later calls return nothing.
  // can_stop = false (fewer than min_tokens generated): no stop string may end
  // inside this delta; one that starts here and ends in a later delta counts.
  StopCheckResult feed(std::string_view delta, bool can_stop = true);

  // The sequence ended for another reason (length, EOS): releases the
  // held-back text. Empty after a stop.
  std::string flush();

  bool stopped() const { return stop_index_ >= 0; }
  int32_t stop_index() const { return stop_index_; }
  // The matched stop string; empty when not stopped.
  const std::string& matched_stop() const;
  // Bytes received but not yet emitted.
  size_t held_bytes() const { return window_.size() - emitted_; }

 private:
  size_t holdback_length() const;

  std::vector<std::string> stop_;
  bool include_stop_;
  // The tail of the text a match could still involve: window_[0, emitted_)
  // went out already (only with include_stop_str_in_output), the rest is held.
  std::string window_;
  size_t emitted_ = 0;
  size_t no_match_end_ = 0;  // a match must end after this offset of window_
  int32_t stop_index_ = -1;
};

}  // namespace pagellm
