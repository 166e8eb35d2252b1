#include "scheduler/step_rules.h"

#include <algorithm>
#include <cmath>
#include <tuple>

namespace pagellm {

int64_t aged_priority(int32_t priority, int64_t age_steps, std::span<const int32_t> levels, int32_t aging_steps) {
  if (aging_steps <= 0) return priority;
  const auto rank = std::lower_bound(levels.begin(), levels.end(), priority) - levels.begin();
  return int64_t{rank} - age_steps / aging_steps;
}

std::vector<int32_t> priority_levels(std::vector<int32_t> priorities) {
  std::sort(priorities.begin(), priorities.end());
  priorities.erase(std::unique(priorities.begin(), priorities.end()), priorities.end());
  return priorities;
}

size_t kv_victim(std::span<const SeatHolder> running, bool fair) {
  const size_t last = running.size() - 1;
  if (!fair) return last;
  size_t best = last;
  int32_t most = running[last].seats;
  for (size_t i = running.size(); i-- > 0;) {
    if (running[i].priority_class != running[last].priority_class) break;
    if (running[i].seats > most) {  // from the back: the first one seen is its request's newest
      most = running[i].seats;
      best = i;
    }
  }
  return best;
}

bool leaves_reserve(bool conservative, double watermark, int32_t usable_blocks, int32_t available_blocks,
                    int32_t num_running, int32_t new_blocks) {
  // A prompt that needs the whole pool must still run when nothing else does.
  if (!conservative || num_running == 0) return true;
  const auto kept = static_cast<int32_t>(std::ceil(watermark * static_cast<double>(usable_blocks)));
  return available_blocks - new_blocks >= std::max(kept, num_running + 1);
}

int32_t fair_share(int32_t max_num_seqs, int32_t num_requests) {
  if (num_requests < 2) return 0;
  return std::max<int32_t>(1, max_num_seqs / num_requests);
}

std::optional<size_t> fair_victim(std::span<const SeatHolder> running, const SeatHolder& waiting, int32_t share) {
  if (share == 0 || waiting.seats >= share) return std::nullopt;
  std::optional<size_t> best;
  int32_t most = share;
  for (size_t i = running.size(); i-- > 0;) {
    const SeatHolder& s = running[i];
    if (s.priority_class < waiting.priority_class || s.spared) continue;
    if (s.seats > most) {
      most = s.seats;
      best = i;
    }
  }
  return best;
}

size_t next_to_admit(size_t count, const std::function<AdmissionCandidate(size_t)>& candidate, bool fair,
                     bool length_aware) {
  if (!fair && !length_aware) return 0;
  using Key = std::tuple<int32_t, int32_t, int32_t>;  // seats, goes by length, length
  const auto key = [&](const AdmissionCandidate& c) {
    const int32_t seats = fair ? c.seats : 0;
    if (!length_aware || c.keeps_turn) return Key(seats, 0, 0);
    return Key(seats, 1, c.num_tokens);
  };
  const AdmissionCandidate head = candidate(0);
  size_t best = 0;
  Key best_key = key(head);
  for (size_t i = 1; i < count; ++i) {
    if (best_key == Key(0, 0, 0)) break;  // nothing comes before it
    const AdmissionCandidate c = candidate(i);
    if (c.priority_class != head.priority_class) break;  // a lower priority class
    if (const Key k = key(c); k < best_key) {
      best = i;
      best_key = k;
    }
  }
  return best;
}

int32_t tokens_to_compute(const TokenLimits& limits, int32_t num_tokens, int32_t num_computed, int32_t budget) {
  if (limits.sliding) {
    const int32_t n = std::min({num_tokens - num_computed, budget, std::max(1, limits.window_tokens / 2)});
    return std::max(n, 0);
  }
  int32_t n = std::min(num_tokens, limits.max_model_len) - num_computed;
  if (n <= 0 || budget <= 0) return 0;
  if (!limits.chunked_prefill) return n <= budget ? n : 0;
  if (limits.long_prefill_threshold > 0) n = std::min(n, limits.long_prefill_threshold);
  return std::min(n, budget);
}

int32_t drafts_to_verify(int32_t proposed, int32_t budget_after, int32_t decodes_to_come, int32_t room_to_max_len,
                         bool sliding) {
  if (sliding) return 0;
  return std::max(std::min({proposed, budget_after - decodes_to_come, room_to_max_len}), 0);
}

std::vector<Sequence*> running_pass(const std::vector<Sequence*>& running, bool decodes, bool length_aware) {
  std::vector<Sequence*> pass;
  for (Sequence* seq : running) {
    const int32_t behind = seq->num_tokens() - seq->num_computed_tokens;
    if (behind > 0 && (behind == 1) == decodes) pass.push_back(seq);
  }
  if (!decodes && length_aware) {
    // A short prompt finishes its prefill in this step instead of waiting
    // behind a long one's chunks.
    std::stable_sort(pass.begin(), pass.end(), [](const Sequence* a, const Sequence* b) {
      return a->num_tokens() - a->num_computed_tokens < b->num_tokens() - b->num_computed_tokens;
    });
  }
  return pass;
}

int32_t count_decodes(const std::vector<Sequence*>& running) {
  int32_t n = 0;
  for (const Sequence* seq : running) n += seq->num_tokens() - seq->num_computed_tokens == 1;
  return n;
}

int32_t waiting_tokens_shorter_than(const std::deque<Sequence*>& waiting, int64_t free_seats, int32_t remaining) {
  int64_t tokens = 0;
  for (const Sequence* s : waiting) {
    if (free_seats <= 0) break;
    if (s->num_tokens() >= remaining) continue;
    tokens += s->num_tokens();
    --free_seats;
  }
  return static_cast<int32_t>(std::min<int64_t>(tokens, INT32_MAX));
}

}  // namespace pagellm
