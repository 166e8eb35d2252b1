#include "engine/stop_checker.h"

#include <algorithm>

#include "core/util.h"

namespace pagellm {

StopChecker::StopChecker(std::vector<std::string> stop, bool include_stop_str_in_output)
    : include_stop_(include_stop_str_in_output) {
  for (auto& s : stop)
    if (!s.empty()) stop_.push_back(std::move(s));
}

const std::string& StopChecker::matched_stop() const {
  static const std::string kNone;
  return stopped() ? stop_[stop_index_] : kNone;
}

// The longest suffix of window_ that is a proper prefix of a stop string:
// the only text a later match can still start in.
size_t StopChecker::holdback_length() const {
  const std::string_view text = window_;
  size_t hold = 0;
  for (const std::string& s : stop_) {
    for (size_t len = std::min(s.size() - 1, text.size()); len > hold; --len) {
      if (text.ends_with(std::string_view(s).substr(0, len))) {
        hold = len;
        break;
      }
    }
  }
  return hold;
}

StopCheckResult StopChecker::feed(std::string_view delta, bool can_stop) {
  StopCheckResult result;
  if (stopped()) return result;
  window_.append(delta);

  if (can_stop) {
    // A match must end in the new text: earlier ends were searched already or
    // were not allowed.
    size_t best_start = 0, best_end = std::string::npos;
    for (size_t i = 0; i < stop_.size(); ++i) {
      const std::string& s = stop_[i];
      const size_t from = no_match_end_ >= s.size() ? no_match_end_ - s.size() + 1 : 0;
      const size_t pos = window_.find(s, from);
      if (pos == std::string::npos) continue;
      const size_t end = pos + s.size();
      if (end < best_end || (end == best_end && pos < best_start)) {
        best_start = pos;
        best_end = end;
        result.stop_index = static_cast<int32_t>(i);
      }
    }
    if (result.stop_index >= 0) {
      // Without include_stop_str_in_output nothing from best_start on was
      // emitted (it was held back), so emitted_ <= best_start.
      stop_index_ = result.stop_index;
      result.stopped = true;
      const size_t cut = include_stop_ ? best_end : best_start;
      if (cut > emitted_) result.text = window_.substr(emitted_, cut - emitted_);
      window_.clear();
      emitted_ = 0;
      no_match_end_ = 0;
      return result;
    }
  }

  // Text before keep_from can no longer be part of a match. Without
  // include_stop_str_in_output the rest is held back; with it a match only
  // ever extends the output, so everything goes out now.
  const size_t keep_from = window_.size() - holdback_length();
  size_t emit_to = include_stop_ ? window_.size() : keep_from;
  emit_to = std::max(emitted_, utf8_complete_prefix(std::string_view(window_).substr(0, emit_to)));
  result.text = window_.substr(emitted_, emit_to - emitted_);
  emitted_ = emit_to;
  const size_t drop = std::min(keep_from, emitted_);
  window_.erase(0, drop);
  emitted_ -= drop;
  no_match_end_ = window_.size();  // nothing may match (again) up to here
  return result;
}

std::string StopChecker::flush() {
  std::string rest = window_.substr(emitted_);
  window_.clear();
  emitted_ = 0;
  no_match_end_ = 0;
  return rest;
}

}  // namespace pagellm
