// The rules Scheduler::schedule()'s steps apply, as pure functions of what
// they look at (no scheduler state, no KV cache), so each can be tested with
// a table of cases. In step order:
//   1. order:       aged priorities (aged_priority)
//   2. capacity:    whose blocks go when the pool is short (kv_victim), and the
//                   free-block reserve an admission must leave (leaves_reserve)
//   3. admission:   which waiting sequence goes next (next_to_admit), and who
//                   gives up a seat for it (fair_victim, fair_share)
//   4. composition: which running sequences a pass takes (running_pass), how
//                   many tokens one computes (tokens_to_compute) and how many
//                   drafts it verifies (drafts_to_verify)
// Step 5 (the plan) is build_plan in step_decisions.h.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "scheduler/sequence.h"

namespace pagellm {

// ---- 1. order ----

// With aging (aging_steps > 0): the rank of `priority` among the sorted
// distinct `levels` (a value not among them shares the rank of the next one
// above it), less one for every aging_steps steps of `age_steps`. Without
// aging: the priority itself.
int64_t aged_priority(int32_t priority, int64_t age_steps, std::span<const int32_t> levels, int32_t aging_steps);

// The sorted distinct values of `priorities` (the levels aging ranks by).
std::vector<int32_t> priority_levels(std::vector<int32_t> priorities);

// ---- 2. capacity ----

// A running sequence as the victim rules see it, in policy order.
// priority_class: its effective priority under the priority policy, 0 under
// FCFS (one class). seats: the running sequences of its request.
struct SeatHolder {
  int64_t priority_class = 0;
  int32_t seats = 0;
  bool spared = false;  // joined running this step: never a fair victim now
};

// When blocks run short: among the last priority class, the newest sequence
// of the request holding the most seats; the last one when no request there
// holds more than the last one's, or without fairness (`fair` false).
// `running` must not be empty. Returns an index into it.
size_t kv_victim(std::span<const SeatHolder> running, bool fair);

// Whether admitting a sequence that needs `new_blocks` leaves the reserve the
// admission policy keeps (AdmissionPolicy): aggressive always; conservative
// when max(ceil(watermark x usable_blocks), num_running + 1) blocks stay
// available (one per running sequence, the admitted one included, for its
// next tokens). With nothing running there is nobody to keep a reserve for.
bool leaves_reserve(bool conservative, double watermark, int32_t usable_blocks, int32_t available_blocks,
                    int32_t num_running, int32_t new_blocks);

// ---- 3. admission ----

// A request's fair share of seats with `num_requests` requests present:
// max(1, max_num_seqs / num_requests); 0 with fewer than two (no fairness).
int32_t fair_share(int32_t max_num_seqs, int32_t num_requests);

// For a waiting sequence of a request holding waiting.seats seats, below
// `share`: the newest running sequence, not spared and of no better priority
// class than the waiting one, of the request furthest above the share.
// Nothing when the share is 0, the request is not below it, or nobody is above it.
std::optional<size_t> fair_victim(std::span<const SeatHolder> running, const SeatHolder& waiting, int32_t share);

// A waiting sequence as admission order sees it.
struct AdmissionCandidate {
  int64_t priority_class = 0;  // as SeatHolder
  int32_t seats = 0;           // its request's running sequences
  // Length-aware composition: it keeps its queue place (preempted, or passed
  // over for length_aware_max_wait_steps) instead of going by length.
  bool keeps_turn = false;
  int32_t num_tokens = 0;
};

// The index of the waiting sequence to admit next. Without fairness or
// length-aware composition: the head. Otherwise, within the head's priority
// class: the fewest seats first (fair), then (length-aware) those keeping
// their turn in queue order, then the shortest; ties in queue order.
// candidate(i) describes waiting sequence i of `count` (count >= 1); it is
// asked only for as many as the answer needs.
size_t next_to_admit(size_t count, const std::function<AdmissionCandidate(size_t)>& candidate, bool fair,
                     bool length_aware);

// ---- 4. composition ----

// What bounds one sequence's tokens in a step (from SchedulerConfig).
struct TokenLimits {
  int32_t max_model_len = 0;
  bool chunked_prefill = true;
  int32_t long_prefill_threshold = 0;  // 0: off
  bool sliding = false;                // sliding KV eviction: no length cap
  int32_t window_tokens = 0;           // sliding: recent tokens the window keeps
};

// The tokens a sequence of num_tokens tokens, num_computed of them computed,
// computes in a step with `budget` tokens left: all it lacks up to
// max_model_len, cut to the budget and the long-prefill threshold (chunked
// prefill), or 0 when that does not fit whole (no chunked prefill). Sliding:
// no length cap, and at most half the window (its first token still sees
// half a window of recent keys).
int32_t tokens_to_compute(const TokenLimits& limits, int32_t num_tokens, int32_t num_computed, int32_t budget);

// Drafts a decode verifies along with its token: as many of the `proposed`
// as the budget leaves after its token (budget_after) and one token for each
// decode still to come, and no more than fit before max_model_len
// (room_to_max_len). None with sliding KV eviction (its window moves by whole
// chunks only).
int32_t drafts_to_verify(int32_t proposed, int32_t budget_after, int32_t decodes_to_come, int32_t room_to_max_len,
                         bool sliding);

// The running sequences one pass takes, in the order it takes them: decodes
// (one token behind) or prefills (several behind), in policy order; with
// length-aware composition, prefills closest to done first.
std::vector<Sequence*> running_pass(const std::vector<Sequence*>& running, bool decodes, bool length_aware);

// Running sequences one token behind.
int32_t count_decodes(const std::vector<Sequence*>& running);

// Length-aware composition: the tokens of the waiting prompts shorter than
// `remaining` that this step would admit (the first free_seats of them in
// queue order). A long prefill's chunk leaves them room.
int32_t waiting_tokens_shorter_than(const std::deque<Sequence*>& waiting, int64_t free_seats, int32_t remaining);

}  // namespace pagellm
