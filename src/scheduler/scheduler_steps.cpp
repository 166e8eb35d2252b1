// Scheduler::schedule() and its steps (see scheduler.h): each step reads the
// queues and the KV cache, takes the blocks it decides on (transactionally,
// one sequence at a time) and records its decisions in a StepDecisions;
// build_plan() writes the StepPlan from those at the end.
#include <algorithm>

#include "core/error.h"
#include "scheduler/scheduler.h"

namespace pagellm {

StepPlan Scheduler::schedule() {
  ++step_;
  order_queues();
  StepDecisions step(config_.max_num_batched_tokens);
  schedule_running(step);
  // Memory was short this step: nobody comes back or joins before the next.
  if (step.preempted.empty()) resume_swapped(step);
  // Waiting sequences join only when no swapped one is left to come back first.
  if (step.preempted.empty() && swapped_.empty()) admit_waiting(step);
  StepPlan plan = build_plan(step, kv_, config_.attention_sinks);
  // Verifying drafts runs the linear-attention state past tokens that may be
  // rejected: keep the state before them (on_step_done restores it).
  if (kv_.has_state())
    for (const ScheduledSeq& s : plan.seqs)
      if (s.num_draft_tokens() > 0) kv_.snapshot_state(s.seq_id);
  plan.state_copies = kv_.take_state_copies();
#ifndef NDEBUG
  check_invariants();
#endif
  return plan;
}

// ---- 1. order ----

void Scheduler::order_queues() {
  if (config_.policy != SchedulingPolicy::Priority || config_.priority_aging_steps <= 0) return;
  // Aging moves effective priorities: keep both queues in policy order.
  std::vector<int32_t> priorities;
  priorities.reserve(live_.size());
  for (const auto& [id, seq] : live_) priorities.push_back(seq->priority);
  priority_levels_ = priority_levels(std::move(priorities));
  const auto before = [this](const Sequence* a, const Sequence* b) { return runs_before(a, b); };
  std::stable_sort(running_.begin(), running_.end(), before);
  std::stable_sort(waiting_.begin(), waiting_.end(), before);
}

int64_t Scheduler::priority_class(const Sequence& seq) const {
  return config_.policy == SchedulingPolicy::Priority ? effective_priority(seq) : 0;
}

SeatHolder Scheduler::seat_holder(const Sequence& seq) const {
  return {.priority_class = priority_class(seq), .seats = seats_held(seq.request_id)};
}

// ---- 2. running sequences: composition, then capacity ----

// Decodes (one token behind) first, then prefill chunks (several behind: new
// prompts, recompute after preemption), so decodes never wait behind a long
// prompt.
void Scheduler::schedule_running(StepDecisions& step) {
  int32_t decodes_to_come = count_decodes(running_);
  for (const bool decodes : {true, false}) {
    for (Sequence* seq : running_pass(running_, decodes, config_.composition == StepComposition::LengthAware)) {
      if (step.budget <= 0) break;
      if (seq->status != SeqStatus::Running) continue;  // preempted for an earlier one's blocks
      if (config_.kv_eviction == KvEviction::None && seq->num_computed_tokens >= config_.max_model_len) {
        finish_at_length_cap(seq, step);
        continue;
      }
      if (decodes) --decodes_to_come;
      TokenGrant want = compose_running(seq, decodes, decodes_to_come, budget_for(*seq, step));
      if (want.num_new_tokens > 0) allocate_running(std::move(want), step);
    }
  }
}

// A length-aware prefill in its turn leaves room for the waiting prompts
// shorter than what it has left; a decode with speculative tokens takes them
// too, as far as the budget allows after one token for every decode still
// to come.
TokenGrant Scheduler::compose_running(Sequence* seq, bool decode, int32_t decodes_to_come, int32_t budget) const {
  const int32_t behind = seq->num_tokens() - seq->num_computed_tokens;
  int32_t room = budget;
  if (!decode && config_.composition == StepComposition::LengthAware &&
      step_ - seq->arrival_step < config_.length_aware_max_wait_steps) {
    const int64_t free_seats = config_.max_num_seqs - static_cast<int64_t>(running_.size());
    room -= waiting_tokens_shorter_than(waiting_, free_seats, behind);
  }
  TokenGrant want{.seq = seq};
  want.num_new_tokens = tokens_to_compute(token_limits(*seq), seq->num_tokens(), seq->num_computed_tokens, room);
  if (decode && want.num_new_tokens > 0 && !seq->spec_token_ids.empty()) {
    want.num_draft_tokens = drafts_to_verify(
        static_cast<int32_t>(seq->spec_token_ids.size()), budget - want.num_new_tokens, decodes_to_come,
        config_.max_model_len - seq->num_tokens(), config_.kv_eviction == KvEviction::Sliding);
  }
  return want;
}

// A whole-prompt sequence (an encoder's) is never chunked: it waits until
// its prompt fits a step's budget.
TokenLimits Scheduler::token_limits(const Sequence& seq) const {
  return {.max_model_len = config_.max_model_len,
          .chunked_prefill = config_.enable_chunked_prefill && !seq.whole_prompt,
          .long_prefill_threshold = config_.long_prefill_token_threshold,
          .sliding = config_.kv_eviction == KvEviction::Sliding,
          .window_tokens = window_tokens()};
}

// A sequence that needs its prompt's logits gets a row of logits per token it
// computes: with chunked prefill, the step's rows stay under the cap (0: it
// waits for the next step).
int32_t Scheduler::budget_for(const Sequence& seq, const StepDecisions& step) const {
  if (!seq.needs_prompt_logits || config_.max_prompt_logit_rows <= 0 || !config_.enable_chunked_prefill)
    return step.budget;
  return std::max(0, std::min(step.budget, config_.max_prompt_logit_rows - step.prompt_logit_rows));
}

int32_t Scheduler::window_tokens() const {
  return sliding_window_tokens(config_.attention_sinks, config_.max_model_len, kv_.block_size());
}

// When the pool is short, the drafts go first (verify nothing rather than
// preempt anyone), then kv victims, until the slots fit or `want.seq` is the
// victim itself (the others may still fit).
void Scheduler::allocate_running(TokenGrant want, StepDecisions& step) {
  Sequence* seq = want.seq;
  if (config_.kv_eviction == KvEviction::Sliding)
    num_evicted_blocks_ += kv_.slide_window(seq->id, config_.attention_sinks, config_.max_model_len,
                                            seq->num_computed_tokens + want.num_new_tokens);
  std::optional<SlotAllocation> alloc;
  while (!(alloc = kv_.allocate_slots(seq->id, seq->num_computed_tokens, want.num_tokens()))) {
    if (want.num_draft_tokens > 0) {
      want.num_draft_tokens = 0;
      continue;
    }
    Sequence* victim = pick_kv_victim();
    preempt_running(victim, step);
    if (victim == seq) return;
  }
  want.copies = std::move(alloc->copies);
  step.grant(std::move(want));
}

// No position left for its next token; the engine should have finished it
// (reached_max_model_len).
void Scheduler::finish_at_length_cap(Sequence* seq, StepDecisions& step) {
  erase_running(seq);
  kv_.free(seq->id);
  seq->status = SeqStatus::FinishedLength;
  forget(seq);
  step.length_capped.push_back(seq->id);
}

Sequence* Scheduler::pick_kv_victim() const {
  if (fair_share() == 0) return running_.back();
  std::vector<SeatHolder> holders;
  holders.reserve(running_.size());
  for (const Sequence* s : running_) holders.push_back(seat_holder(*s));
  return running_[kv_victim(holders, /*fair=*/true)];
}

// A running sequence gives up its blocks. Its grant, when it had one this
// step already, goes after the preemption: a swap-out reads a block's
// contents through the grant's copy-on-write copies.
void Scheduler::preempt_running(Sequence* victim, StepDecisions& step) {
  erase_running(victim);
  preempt(victim, step);
  step.withdraw(victim);
}

void Scheduler::preempt(Sequence* seq, StepDecisions& step) {
  ++seq->num_preemptions;
  ++num_preemptions_;
  step.preempted.push_back(seq->id);
  if (config_.preemption_mode == PreemptionMode::Swap && swap_out(seq, step)) return;
  kv_.free(seq->id);
  seq->num_computed_tokens = 0;
  seq->status = SeqStatus::Preempted;
  insert_waiting(seq, /*at_head=*/true);
}

// The blocks holding the sequence's computed tokens go to host blocks (the
// runner copies them before this step's forward pass, so the device blocks
// may be handed to another sequence in the same step). False, with nothing
// changed, when the host pool cannot hold them.
bool Scheduler::swap_out(Sequence* seq, StepDecisions& step) {
  // Every group's blocks that a query from here on can see, in group order
  // (swap_in's allocate_restored gives the same blocks back in that order).
  const int32_t n = kv_.blocks_held(seq->num_computed_tokens);
  if (n == 0 || n > static_cast<int32_t>(free_host_blocks_.size())) return false;
  const int32_t len = blocks_for_tokens(seq->num_computed_tokens, kv_.block_size());
  std::vector<int32_t> host;
  host.reserve(static_cast<size_t>(n));
  for (int g = 0; g < kv_.num_groups(); ++g) {
    const auto table = kv_.block_table(seq->id, g);
    for (int32_t i = kv_.first_visible_block(g, seq->num_computed_tokens); i < len; ++i) {
      host.push_back(free_host_blocks_.back());
      free_host_blocks_.pop_back();
      // A block given a copy-on-write copy this step is not filled yet.
      step.swap_out.push_back({step.contents_of(table[i]), host.back()});
    }
  }
  kv_.free(seq->id);
  host_blocks_[seq->id] = std::move(host);
  blocks_swapped_out_ += n;
  ++num_preemptions_swap_;
  seq->status = SeqStatus::Swapped;
  swapped_.push_front(seq);  // the newest victim resumes first (its peers stay put)
  step.swapped_out.push_back(seq->id);
  return true;
}

// ---- 3. swapped sequences back, waiting ones in ----

// Swapped sequences come back (in resume order) before any waiting one is
// admitted; they then run as any running sequence.
void Scheduler::resume_swapped(StepDecisions& step) {
  while (!swapped_.empty() && step.budget > 0 && num_running() < config_.max_num_seqs) {
    Sequence* seq = swapped_.front();
    if (!lora_fits(*seq, running_loras())) break;
    const int32_t n =
        tokens_to_compute(token_limits(*seq), seq->num_tokens(), seq->num_computed_tokens, budget_for(*seq, step));
    if (n == 0 || !swap_in(seq, step)) break;
    swapped_.pop_front();
    step.joined.push_back(seq);
    auto alloc = kv_.allocate_slots(seq->id, seq->num_computed_tokens, n);
    if (!alloc) break;  // back in, but no room for its new tokens: it runs next step
    step.grant({.seq = seq, .num_new_tokens = n, .copies = std::move(alloc->copies)});
  }
}

// Fresh device blocks for the swapped tokens, filled from the host pool
// before the forward pass; the sequence runs again from where it stopped.
// False, with nothing changed, when the device has too few free blocks.
bool Scheduler::swap_in(Sequence* seq, StepDecisions& step) {
  auto it = host_blocks_.find(seq->id);
  PAGELLM_CHECK(it != host_blocks_.end(), "swap_in: sequence {} has no host blocks", seq->id);
  if (!kv_.allocate_restored(seq->id, seq->num_computed_tokens)) return false;
  size_t next = 0;
  const int32_t len = blocks_for_tokens(seq->num_computed_tokens, kv_.block_size());
  for (int g = 0; g < kv_.num_groups(); ++g) {
    const auto table = kv_.block_table(seq->id, g);
    for (int32_t i = kv_.first_visible_block(g, seq->num_computed_tokens); i < len; ++i) {
      step.swap_in.push_back({it->second[next], table[i]});
      host_blocks_reading_.push_back(it->second[next++]);
    }
  }
  PAGELLM_CHECK(next == it->second.size(), "swap_in: sequence {} swapped {} blocks out but {} come back", seq->id,
                it->second.size(), next);
  blocks_swapped_in_ += static_cast<int64_t>(it->second.size());
  host_blocks_.erase(it);
  // The tokens are back: full blocks join the prefix cache again.
  if (!seq->whole_prompt)
    kv_.commit_computed(seq->id, seq->token_ids, seq->num_computed_tokens, static_cast<uint64_t>(seq->lora_id));
  seq->status = SeqStatus::Running;
  insert_running(seq);
  return true;
}

// Waiting sequences in admission order while the budget, the seats and the
// blocks allow. When a seat or blocks are short, one may take a running
// sequence's (make_room_for) and try again.
void Scheduler::admit_waiting(StepDecisions& step) {
  while (!waiting_.empty() && step.budget > 0) {
    const std::optional<size_t> next = next_waiting();
    if (!next) break;
    const size_t at = *next;
    Sequence* seq = waiting_[at];
    // A victim of this step waits at least until the next one.
    if (step.was_preempted(seq->id)) break;
    PrefixMatch match;
    int32_t n = 0;
    std::optional<SlotAllocation> alloc;
    if (num_running() < config_.max_num_seqs) {
      match = cached_prefix(*seq);
      n = tokens_to_compute(token_limits(*seq), seq->num_tokens(), match.num_tokens, budget_for(*seq, step));
      if (n == 0) break;  // does not fit the budget whole (chunked prefill off)
      alloc = allocate_admission(*seq, match, n);
    }
    if (!alloc) {  // no seat or no blocks
      if (make_room_for(*seq, step)) continue;
      break;
    }
    admit(at, match.num_tokens, step);
    step.grant({.seq = seq, .num_new_tokens = n, .copies = std::move(alloc->copies)});
  }
}

std::optional<size_t> Scheduler::next_waiting() const {
  // Those of an adapter with no slot now are passed over (vLLM's rule).
  std::vector<size_t> eligible;
  const bool all = config_.max_loras == 0;
  if (!all) {
    const std::vector<int32_t> running = running_loras();  // once, not per waiting sequence
    for (size_t i = 0; i < waiting_.size(); ++i)
      if (lora_fits(*waiting_[i], running)) eligible.push_back(i);
    if (eligible.empty()) return std::nullopt;
  }
  const auto index = [&](size_t i) { return all ? i : eligible[i]; };
  const auto candidate = [&](size_t i) {
    const Sequence& s = *waiting_[index(i)];
    return AdmissionCandidate{
        .priority_class = priority_class(s),
        .seats = seats_held(s.request_id),
        .keeps_turn = s.status == SeqStatus::Preempted || step_ - s.arrival_step >= config_.length_aware_max_wait_steps,
        .num_tokens = s.num_tokens()};
  };
  return index(next_to_admit(all ? waiting_.size() : eligible.size(), candidate, fair_share() > 0,
                             config_.composition == StepComposition::LengthAware));
}

std::vector<int32_t> Scheduler::running_loras() const {
  std::vector<int32_t> running;
  for (const Sequence* s : running_)
    if (s->lora_id != 0 && std::find(running.begin(), running.end(), s->lora_id) == running.end())
      running.push_back(s->lora_id);
  return running;
}

bool Scheduler::lora_fits(const Sequence& seq, const std::vector<int32_t>& running) const {
  if (config_.max_loras == 0 || seq.lora_id == 0) return true;
  return static_cast<int32_t>(running.size()) < config_.max_loras ||
         std::find(running.begin(), running.end(), seq.lora_id) != running.end();
}

// A sequence past its window recomputes through the window, not from cached
// blocks; one that needs its prompt's logits (or mean / first-row pooling)
// computes every prompt position.
PrefixMatch Scheduler::cached_prefix(const Sequence& seq) const {
  if (seq.needs_every_prompt_position()) return {};
  if (config_.kv_eviction == KvEviction::Sliding && seq.num_tokens() > config_.max_model_len) return {};
  return kv_.match_prefix(seq.token_ids, static_cast<uint64_t>(seq.lora_id));
}

// Counts the blocks it would hold, matched ones included (they may sit in
// the cache, so counting them errs on the safe side).
std::optional<SlotAllocation> Scheduler::allocate_admission(const Sequence& seq, const PrefixMatch& match,
                                                            int32_t num_new) {
  const int32_t blocks = kv_.blocks_for_step(match.num_tokens, num_new);
  if (!leaves_reserve(config_.admission_policy == AdmissionPolicy::Conservative, config_.admission_watermark,
                      kv_.num_usable_blocks(), kv_.num_available_blocks(), num_running(), blocks))
    return std::nullopt;
  return kv_.allocate_slots(seq.id, match.num_tokens, num_new, &match);
}

void Scheduler::admit(size_t waiting_index, int32_t num_cached, StepDecisions& step) {
  Sequence* seq = waiting_[waiting_index];
  waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(waiting_index));
  seq->num_computed_tokens = num_cached;
  if (seq->num_cached_tokens < 0) seq->num_cached_tokens = num_cached;
  seq->status = SeqStatus::Running;
  insert_running(seq);
  step.joined.push_back(seq);
}

// Under the priority policy a waiting sequence that outranks the last running
// one takes that one's seat or blocks; one of a request below its fair share
// takes those of the request furthest above it. False: it waits.
bool Scheduler::make_room_for(const Sequence& waiting, StepDecisions& step) {
  if (outranks_last_running(waiting, step)) {
    ++num_preemptions_priority_;
    preempt_running(running_.back(), step);
    return true;
  }
  if (Sequence* victim = pick_fair_victim(waiting, step)) {
    ++num_preemptions_fair_;
    preempt_running(victim, step);
    return true;
  }
  return false;
}

bool Scheduler::outranks_last_running(const Sequence& waiting, const StepDecisions& step) const {
  if (config_.policy != SchedulingPolicy::Priority || running_.empty()) return false;
  const Sequence* last = running_.back();
  return effective_priority(waiting) < effective_priority(*last) && !step.joined_now(last);
}

Sequence* Scheduler::pick_fair_victim(const Sequence& waiting, const StepDecisions& step) const {
  const int32_t share = fair_share();
  if (share == 0) return nullptr;
  std::vector<SeatHolder> holders;
  holders.reserve(running_.size());
  for (const Sequence* s : running_) {
    holders.push_back(seat_holder(*s));
    holders.back().spared = step.joined_now(s);
  }
  const std::optional<size_t> victim = fair_victim(holders, seat_holder(waiting), share);
  return victim ? running_[*victim] : nullptr;
}

}  // namespace pagellm
