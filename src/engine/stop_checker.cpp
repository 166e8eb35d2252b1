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

// The longest suffix of pending_ that is a proper prefix of a stop string.
size_t StopChecker::holdback_length() const {
  const std::string_view text = pending_;
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
  pending_.append(delta);

  if (can_stop) {
    // A match must end in the new text: earlier ends were searched already or
    // were not allowed.
    size_t best_start = 0, best_end = std::string::npos;
    for (size_t i = 0; i < stop_.size(); ++i) {
      const std::string& s = stop_[i];
      const size_t from = no_match_end_ >= s.size() ? no_match_end_ - s.size() + 1 : 0;
      const size_t pos = pending_.find(s, from);
      if (pos == std::string::npos) continue;
      const size_t end = pos + s.size();
      if (end < best_end || (end == best_end && pos < best_start)) {
        best_start = pos;
        best_end = end;
        result.stop_index = static_cast<int32_t>(i);
      }
    }
    if (result.stop_index >= 0) {
      stop_index_ = result.stop_index;
      result.stopped = true;
      result.text = pending_.substr(0, include_stop_ ? best_end : best_start);
      pending_.clear();
      no_match_end_ = 0;
      return result;
    }
  }
  no_match_end_ = pending_.size();  // nothing may match (again) up to here

  // With include_stop_str_in_output a later match only ever adds text, so
  // nothing needs holding back for stop strings.
  size_t emit = pending_.size() - (include_stop_ ? 0 : holdback_length());
  emit = utf8_complete_prefix(std::string_view(pending_).substr(0, emit));
  result.text = pending_.substr(0, emit);
  pending_.erase(0, emit);
  no_match_end_ = no_match_end_ > emit ? no_match_end_ - emit : 0;
  return result;
}

std::string StopChecker::flush() {
  std::string rest;
  rest.swap(pending_);
  no_match_end_ = 0;
  return rest;
}

}  // namespace pagellm
