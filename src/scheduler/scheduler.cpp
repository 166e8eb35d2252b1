#include "scheduler/scheduler.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "core/error.h"

namespace pagellm {

void SchedulerConfig::validate() const {
  PAGELLM_CHECK(max_num_seqs >= 1, "max_num_seqs must be >= 1, got {}", max_num_seqs);
  PAGELLM_CHECK(max_num_batched_tokens >= 1, "max_num_batched_tokens must be >= 1, got {}",
                max_num_batched_tokens);
  PAGELLM_CHECK(max_model_len >= 1, "max_model_len must be >= 1, got {}", max_model_len);
  PAGELLM_CHECK(long_prefill_token_threshold >= 0,
                "long_prefill_token_threshold must be >= 0 (0: off), got {}",
                long_prefill_token_threshold);
  PAGELLM_CHECK(enable_chunked_prefill || max_num_batched_tokens >= max_model_len,
                "without chunked prefill a prompt must fit one step whole: max_num_batched_tokens "
                "({}) must be >= max_model_len ({})",
                max_num_batched_tokens, max_model_len);
  PAGELLM_CHECK(admission_watermark >= 0 && admission_watermark < 1,
                "admission_watermark must be in [0, 1), got {}", admission_watermark);
  PAGELLM_CHECK(priority_aging_steps >= 0, "priority_aging_steps must be >= 0 (0: off), got {}",
                priority_aging_steps);
  PAGELLM_CHECK(kv_eviction == KvEviction::None || (attention_sinks >= 0 && attention_sinks < max_model_len / 2),
                "attention_sinks ({}) must be in [0, max_model_len / 2) with sliding KV eviction", attention_sinks);
  PAGELLM_CHECK(kv_eviction == KvEviction::None || preemption_mode == PreemptionMode::Recompute,
                "sliding KV eviction needs --preemption-mode recompute");
  PAGELLM_CHECK(length_aware_max_wait_steps >= 0, "length_aware_max_wait_steps must be >= 0, got {}",
                length_aware_max_wait_steps);
  PAGELLM_CHECK(preemption_mode == PreemptionMode::Recompute || num_swap_blocks >= 1,
                "swap preemption needs a host pool of at least one block (num_swap_blocks {})",
                num_swap_blocks);
}

const char* to_string(PreemptionMode m) { return m == PreemptionMode::Swap ? "swap" : "recompute"; }

Scheduler::Scheduler(const SchedulerConfig& config, const KVCacheConfig& kv_config)
    : config_(config), kv_(kv_config) {
  config_.validate();
  const int64_t capacity = int64_t{kv_.num_usable_blocks()} * kv_.block_size();
  PAGELLM_CHECK(config_.max_model_len <= capacity,
                "max_model_len {} exceeds the KV cache capacity of {} tokens ({} blocks of {})",
                config_.max_model_len, capacity, kv_.num_usable_blocks(), kv_.block_size());
  PAGELLM_CHECK(config_.kv_eviction == KvEviction::None || window_tokens() >= 2 * kv_.block_size(),
                "sliding KV eviction: max_model_len {} leaves fewer than 2 blocks of {} tokens besides {} attention "
                "sinks",
                config_.max_model_len, kv_.block_size(), config_.attention_sinks);
  if (config_.preemption_mode == PreemptionMode::Swap) {
    // Popped from the back: lowest ids first.
    for (int32_t b = config_.num_swap_blocks - 1; b >= 0; --b) free_host_blocks_.push_back(b);
  }
}

int64_t Scheduler::effective_priority(const Sequence& seq) const {
  if (config_.priority_aging_steps <= 0) return seq.priority;
  // Ranks from the last schedule(): fixed between steps, so the queues stay
  // sorted while sequences come and go. A value that arrived since then
  // shares the rank of the next one above it (the value breaks the tie).
  const auto rank = std::lower_bound(priority_levels_.begin(), priority_levels_.end(), seq.priority) -
                    priority_levels_.begin();
  return int64_t{rank} - (step_ - seq.arrival_step) / config_.priority_aging_steps;
}

bool Scheduler::runs_before(const Sequence* a, const Sequence* b) const {
  if (config_.policy == SchedulingPolicy::Priority) {
    const int64_t pa = effective_priority(*a), pb = effective_priority(*b);
    if (pa != pb) return pa < pb;
    if (a->priority != b->priority) return a->priority < b->priority;
  }
  return a->arrival < b->arrival;
}

int32_t Scheduler::seats_held(uint64_t request_id) const {
  const auto it = running_per_request_.find(request_id);
  return it == running_per_request_.end() ? 0 : it->second;
}

int32_t Scheduler::fair_share() const {
  if (live_per_request_.size() < 2) return 0;
  return std::max<int32_t>(1, config_.max_num_seqs / static_cast<int32_t>(live_per_request_.size()));
}

// The KV-pressure victim: among the last policy class, the newest sequence of
// the request holding the most seats; the last one when no request holds
// more than the last one's. (Seats, as the fair share counts them.)
Sequence* Scheduler::kv_victim() const {
  Sequence* last = running_.back();
  if (fair_share() == 0) return last;
  Sequence* best = last;
  int32_t most = seats_held(last->request_id);
  for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
    if (config_.policy == SchedulingPolicy::Priority && effective_priority(**it) != effective_priority(*last)) break;
    const int32_t held = seats_held((*it)->request_id);
    if (held > most) {  // from the back: the first one seen is its request's newest
      most = held;
      best = *it;
    }
  }
  return best;
}

// For `waiting`, of a request below its fair share: the newest running
// sequence of the request furthest above its share that is neither of a
// better priority class nor in `spared`; null when there is none.
Sequence* Scheduler::fair_victim(const Sequence& waiting, const std::vector<const Sequence*>& spared) const {
  const int32_t share = fair_share();
  if (share == 0 || seats_held(waiting.request_id) >= share) return nullptr;
  Sequence* best = nullptr;
  int32_t most = share;
  for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
    Sequence* s = *it;
    if (config_.policy == SchedulingPolicy::Priority && effective_priority(*s) < effective_priority(waiting)) continue;
    if (std::find(spared.begin(), spared.end(), s) != spared.end()) continue;
    const int32_t held = seats_held(s->request_id);
    if (held > most) {
      most = held;
      best = s;
    }
  }
  return best;
}

bool Scheduler::admission_leaves_reserve(int32_t new_blocks) const {
  // With nothing running there is nobody to keep a reserve for (and a prompt
  // that needs the whole pool must still run).
  if (config_.admission_policy == AdmissionPolicy::Aggressive || running_.empty()) return true;
  const auto watermark =
      static_cast<int32_t>(std::ceil(config_.admission_watermark * static_cast<double>(kv_.num_usable_blocks())));
  // One block per running sequence (the admitted one included) for its next tokens.
  const int32_t reserve = std::max(watermark, static_cast<int32_t>(running_.size()) + 1);
  return kv_.num_available_blocks() - new_blocks >= reserve;
}

size_t Scheduler::next_waiting() const {
  const bool fair = fair_share() > 0;
  const bool length_aware = config_.composition == StepComposition::LengthAware;
  if (!fair && !length_aware) return 0;
  // Within the first policy class (priority), the request holding the fewest
  // seats first (fairness). Then, length-aware: a preempted sequence, or one
  // passed over for length_aware_max_wait_steps, in queue order (a long prompt
  // waits a bounded time), else the shortest prompt, so short requests are not
  // stuck behind a long one's prefill. Ties: queue order.
  const auto key = [&](const Sequence* s) {
    const int32_t seats = fair ? seats_held(s->request_id) : 0;
    if (!length_aware) return std::tuple<int32_t, int32_t, int32_t>(seats, 0, 0);
    if (s->status == SeqStatus::Preempted || step_ - s->arrival_step >= config_.length_aware_max_wait_steps)
      return std::tuple<int32_t, int32_t, int32_t>(seats, 0, 0);
    return std::tuple<int32_t, int32_t, int32_t>(seats, 1, s->num_tokens());
  };
  size_t best = 0;
  auto best_key = key(waiting_[0]);
  for (size_t i = 1; i < waiting_.size(); ++i) {
    if (best_key == std::tuple<int32_t, int32_t, int32_t>(0, 0, 0)) break;  // nothing comes before it
    const Sequence* s = waiting_[i];
    if (config_.policy == SchedulingPolicy::Priority && effective_priority(*s) != effective_priority(*waiting_[0]))
      break;  // a lower priority class
    const auto k = key(s);
    if (k < best_key) {
      best = i;
      best_key = k;
    }
  }
  return best;
}

int32_t Scheduler::waiting_tokens_shorter_than(int32_t remaining) const {
  // The prompts that would be admitted this step (as many as there are
  // free seats) and are shorter: their tokens are kept out of a long
  // prefill's chunk so they run now.
  int64_t seats = config_.max_num_seqs - static_cast<int64_t>(running_.size());
  int64_t tokens = 0;
  for (const Sequence* s : waiting_) {
    if (seats <= 0) break;
    if (s->num_tokens() >= remaining) continue;
    tokens += s->num_tokens();
    --seats;
  }
  return static_cast<int32_t>(std::min<int64_t>(tokens, INT32_MAX));
}

void Scheduler::insert_running(Sequence* seq) {
  auto at = std::upper_bound(running_.begin(), running_.end(), seq,
                             [this](const Sequence* a, const Sequence* b) { return runs_before(a, b); });
  running_.insert(at, seq);
  ++running_per_request_[seq->request_id];
}

void Scheduler::erase_running(Sequence* seq) {
  running_.erase(std::find(running_.begin(), running_.end(), seq));
  const auto it = running_per_request_.find(seq->request_id);
  if (--it->second == 0) running_per_request_.erase(it);
}

void Scheduler::make_live(Sequence* seq) {
  live_.emplace(seq->id, seq);
  ++live_per_request_[seq->request_id];
}

void Scheduler::forget(Sequence* seq) {
  live_.erase(seq->id);
  const auto it = live_per_request_.find(seq->request_id);
  if (--it->second == 0) live_per_request_.erase(it);
}

void Scheduler::insert_waiting(Sequence* seq, bool at_head) {
  if (config_.policy == SchedulingPolicy::Priority) {
    auto at = std::upper_bound(waiting_.begin(), waiting_.end(), seq,
                               [this](const Sequence* a, const Sequence* b) { return runs_before(a, b); });
    waiting_.insert(at, seq);
  } else if (at_head) {
    waiting_.push_front(seq);
  } else {
    waiting_.push_back(seq);
  }
}

Sequence* Scheduler::find(SeqId id) const {
  const auto it = live_.find(id);
  return it == live_.end() ? nullptr : it->second;
}

void Scheduler::add(Sequence* seq) {
  PAGELLM_CHECK(seq != nullptr, "Scheduler::add: null sequence");
  PAGELLM_CHECK(!live_.count(seq->id), "Scheduler::add: sequence {} is already queued or running",
                seq->id);
  if (seq->token_ids.empty()) throw InvalidRequest("the prompt is empty", "prompt");
  if (seq->num_tokens() > config_.max_model_len) {
    throw InvalidRequest(fmt::format("the prompt has {} tokens, more than the model's context of "
                                     "{} (max_model_len)",
                                     seq->num_tokens(), config_.max_model_len),
                         "prompt");
  }
  PAGELLM_CHECK(seq->num_prompt_tokens >= 1 && seq->num_prompt_tokens <= seq->num_tokens(),
                "sequence {}: num_prompt_tokens {} not in [1, {}]", seq->id, seq->num_prompt_tokens,
                seq->num_tokens());
  seq->num_computed_tokens = 0;
  seq->status = SeqStatus::Waiting;
  seq->arrival = next_arrival_++;
  seq->arrival_step = step_;
  make_live(seq);
  insert_waiting(seq, /*at_head=*/false);
}

void Scheduler::fork(SeqId parent_id, Sequence* child) {
  PAGELLM_CHECK(child != nullptr, "Scheduler::fork: null child sequence");
  Sequence* parent = find(parent_id);
  PAGELLM_CHECK(parent && parent->status == SeqStatus::Running,
                "Scheduler::fork: parent sequence {} is not running", parent_id);
  PAGELLM_CHECK(!live_.count(child->id), "Scheduler::fork: sequence {} is already live", child->id);
  const int32_t computed = parent->num_computed_tokens;
  PAGELLM_CHECK(child->num_tokens() >= computed &&
                    std::equal(parent->token_ids.begin(), parent->token_ids.begin() + computed,
                               child->token_ids.begin()),
                "Scheduler::fork: sequence {} does not start with the {} computed tokens of {}",
                child->id, computed, parent_id);
  PAGELLM_CHECK(child->num_tokens() <= config_.max_model_len + 1,
                "Scheduler::fork: sequence {} has {} tokens, past max_model_len {}", child->id,
                child->num_tokens(), config_.max_model_len);
  PAGELLM_CHECK(child->num_prompt_tokens >= 1 && child->num_prompt_tokens <= child->num_tokens(),
                "sequence {}: num_prompt_tokens {} not in [1, {}]", child->id,
                child->num_prompt_tokens, child->num_tokens());
  child->parent = parent_id;
  child->num_cached_tokens = parent->num_cached_tokens;
  child->arrival = next_arrival_++;
  child->arrival_step = step_;
  make_live(child);
  if (num_running() >= config_.max_num_seqs) {
    // No seat: it waits like a new prompt (recomputing what the cache lacks).
    child->num_computed_tokens = 0;
    child->status = SeqStatus::Waiting;
    insert_waiting(child, /*at_head=*/false);
    return;
  }
  kv_.fork(parent_id, child->id);
  child->num_computed_tokens = computed;
  child->status = SeqStatus::Running;
  insert_running(child);
}

int32_t Scheduler::tokens_to_schedule(const Sequence& seq, int32_t num_computed,
                                      int32_t budget) const {
  if (config_.kv_eviction == KvEviction::Sliding) {
    // No length cap; a chunk at most half the window, so that its first
    // token still sees half a window of recent keys.
    const int32_t n = std::min({seq.num_tokens() - num_computed, budget, std::max(1, window_tokens() / 2)});
    return std::max(n, 0);
  }
  int32_t n = std::min(seq.num_tokens(), config_.max_model_len) - num_computed;
  if (n <= 0 || budget <= 0) return 0;
  if (!config_.enable_chunked_prefill) return n <= budget ? n : 0;
  if (config_.long_prefill_token_threshold > 0) n = std::min(n, config_.long_prefill_token_threshold);
  return std::min(n, budget);
}

int32_t Scheduler::window_tokens() const {
  return sliding_window_tokens(config_.attention_sinks, config_.max_model_len, kv_.block_size());
}

void Scheduler::add_to_plan(StepPlan& plan, Sequence* seq, int32_t num_new, SlotAllocation& alloc,
                            int32_t num_drafts) {
  ScheduledSeq s;
  s.seq = seq;
  s.seq_id = seq->id;
  s.start_pos = seq->num_computed_tokens;
  s.num_new_tokens = num_new + num_drafts;
  s.block_table = kv_.block_table(seq->id);
  s.sample = seq->num_computed_tokens + num_new == seq->num_tokens();
  s.draft_tokens.assign(seq->spec_token_ids.begin(), seq->spec_token_ids.begin() + num_drafts);
  if (const int32_t end = kv_.evicted_end(seq->id); end > 0) {
    s.kv_sinks = config_.attention_sinks;
    s.kv_evicted_to = end * kv_.block_size();
  }
  plan.seqs.push_back(std::move(s));
  plan.block_copies.insert(plan.block_copies.end(), alloc.copies.begin(), alloc.copies.end());
  plan.num_batched_tokens += num_new + num_drafts;
  plan.num_draft_tokens += num_drafts;
}

void Scheduler::preempt(Sequence* seq, StepPlan& plan) {
  ++seq->num_preemptions;
  ++num_preemptions_;
  plan.preempted.push_back(seq->id);
  if (config_.preemption_mode == PreemptionMode::Swap && swap_out(seq, plan)) return;
  kv_.free(seq->id);
  seq->num_computed_tokens = 0;
  seq->status = SeqStatus::Preempted;
  insert_waiting(seq, /*at_head=*/true);
}

// The blocks holding the sequence's computed tokens go to host blocks (the
// runner copies them before this step's forward pass, so the device blocks
// may be handed to another sequence in the same step). False, with nothing
// changed, when the host pool cannot hold them.
bool Scheduler::swap_out(Sequence* seq, StepPlan& plan) {
  const int32_t n = blocks_for_tokens(seq->num_computed_tokens, kv_.block_size());
  if (n == 0 || n > static_cast<int32_t>(free_host_blocks_.size())) return false;
  const auto table = kv_.block_table(seq->id);
  std::vector<int32_t> host(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    host[i] = free_host_blocks_.back();
    free_host_blocks_.pop_back();
    // A block given a copy-on-write copy this step is not filled yet: its
    // contents are still in the copy's source.
    BlockId src = table[i];
    for (const BlockCopy& c : plan.block_copies)
      if (c.dst == src) src = c.src;
    plan.swap_out.push_back({src, host[i]});
  }
  kv_.free(seq->id);
  host_blocks_[seq->id] = std::move(host);
  blocks_swapped_out_ += n;
  ++num_preemptions_swap_;
  seq->status = SeqStatus::Swapped;
  swapped_.push_front(seq);  // the newest victim resumes first (its peers stay put)
  plan.swapped_out.push_back(seq->id);
  return true;
}

// Fresh device blocks for the swapped tokens, filled from the host pool
// before the forward pass; the sequence runs again from where it stopped.
// False, with nothing changed, when the device has too few free blocks.
bool Scheduler::swap_in(Sequence* seq, StepPlan& plan) {
  auto it = host_blocks_.find(seq->id);
  PAGELLM_CHECK(it != host_blocks_.end(), "swap_in: sequence {} has no host blocks", seq->id);
  auto alloc = kv_.allocate_slots(seq->id, 0, seq->num_computed_tokens);
  if (!alloc) return false;
  PAGELLM_CHECK(alloc->copies.empty(), "swap_in: fresh blocks needed no copy-on-write");
  const auto table = kv_.block_table(seq->id);
  for (size_t i = 0; i < it->second.size(); ++i) {
    plan.swap_in.push_back({it->second[i], table[i]});
    host_blocks_reading_.push_back(it->second[i]);
  }
  blocks_swapped_in_ += static_cast<int64_t>(it->second.size());
  host_blocks_.erase(it);
  // The tokens are back: full blocks join the prefix cache again.
  kv_.commit_computed(seq->id, seq->token_ids, seq->num_computed_tokens);
  seq->status = SeqStatus::Running;
  insert_running(seq);
  return true;
}

StepPlan Scheduler::schedule() {
  StepPlan plan;
  plan.block_size = kv_.block_size();
  int32_t budget = config_.max_num_batched_tokens;
  ++step_;
  if (config_.policy == SchedulingPolicy::Priority && config_.priority_aging_steps > 0) {
    // Aging moves effective priorities: keep both queues in policy order.
    priority_levels_.clear();
    for (const auto& [id, seq] : live_) priority_levels_.push_back(seq->priority);
    std::sort(priority_levels_.begin(), priority_levels_.end());
    priority_levels_.erase(std::unique(priority_levels_.begin(), priority_levels_.end()), priority_levels_.end());
    const auto before = [this](const Sequence* a, const Sequence* b) { return runs_before(a, b); };
    std::stable_sort(running_.begin(), running_.end(), before);
    std::stable_sort(waiting_.begin(), waiting_.end(), before);
  }

  // Preempt a running sequence (for blocks: kv_victim()). When it already ran
  // in this plan (a decode, when a prefill chunk needs its blocks), take it
  // out again with its budget and its copies.
  auto preempt_running = [&](Sequence* victim) -> Sequence* {
    erase_running(victim);
    const auto entry = std::find_if(plan.seqs.begin(), plan.seqs.end(),
                                    [&](const ScheduledSeq& s) { return s.seq == victim; });
    std::vector<BlockId> table;
    if (entry != plan.seqs.end()) {
      budget += entry->num_new_tokens;
      plan.num_batched_tokens -= entry->num_new_tokens;
      plan.num_draft_tokens -= entry->num_draft_tokens();
      table.assign(entry->block_table.begin(), entry->block_table.end());
      plan.seqs.erase(entry);
    }
    // Its copy-on-write copies go after the preemption: a swap-out reads a
    // block's source through them.
    preempt(victim, plan);
    std::erase_if(plan.block_copies, [&](const BlockCopy& c) {
      return std::find(table.begin(), table.end(), c.dst) != table.end();
    });
    return victim;
  };

  // Running sequences: decodes (one token behind) first, then prefill chunks
  // (several behind: new prompts, recompute after preemption), so decodes
  // never wait behind a long prompt. A decode with speculative tokens takes
  // them too, as far as the budget allows after one token for every decode
  // still to come.
  int32_t decodes_left = 0;
  for (const Sequence* seq : running_) decodes_left += seq->num_tokens() - seq->num_computed_tokens == 1;
  std::vector<Sequence*> order;
  for (const bool decodes : {true, false}) {
    order.clear();
    for (Sequence* seq : running_) {
      const int32_t behind = seq->num_tokens() - seq->num_computed_tokens;
      if (behind > 0 && (behind == 1) == decodes) order.push_back(seq);
    }
    if (!decodes && config_.composition == StepComposition::LengthAware) {
      // Prefills closest to done first: a short prompt finishes its prefill
      // in this step instead of waiting behind a long one's chunks.
      std::stable_sort(order.begin(), order.end(), [](const Sequence* a, const Sequence* b) {
        return a->num_tokens() - a->num_computed_tokens < b->num_tokens() - b->num_computed_tokens;
      });
    }
    for (Sequence* seq : order) {
      if (budget <= 0) break;
      if (seq->status != SeqStatus::Running) continue;  // preempted for an earlier one's blocks
      if (config_.kv_eviction == KvEviction::None && seq->num_computed_tokens >= config_.max_model_len) {
        // No position left for its next token; the engine should have
        // finished it (reached_max_model_len).
        erase_running(seq);
        kv_.free(seq->id);
        seq->status = SeqStatus::FinishedLength;
        forget(seq);
        plan.length_capped.push_back(seq->id);
        continue;
      }
      int32_t room = budget;
      if (!decodes && config_.composition == StepComposition::LengthAware &&
          step_ - seq->arrival_step < config_.length_aware_max_wait_steps)
        room -= waiting_tokens_shorter_than(seq->num_tokens() - seq->num_computed_tokens);
      const int32_t n = tokens_to_schedule(*seq, seq->num_computed_tokens, room);
      if (decodes) --decodes_left;
      if (n == 0) continue;
      int32_t drafts = 0;
      if (decodes && !seq->spec_token_ids.empty()) {
        drafts = std::min({static_cast<int32_t>(seq->spec_token_ids.size()), budget - n - decodes_left,
                           config_.max_model_len - seq->num_tokens()});
        drafts = std::max(drafts, 0);
      }
      if (config_.kv_eviction == KvEviction::Sliding) drafts = 0;  // the window moves by whole chunks only
      if (config_.kv_eviction == KvEviction::Sliding)
        num_evicted_blocks_ += kv_.slide_window(seq->id, config_.attention_sinks, config_.max_model_len,
                                                seq->num_computed_tokens + n);
      std::optional<SlotAllocation> alloc;
      while (!(alloc = kv_.allocate_slots(seq->id, seq->num_computed_tokens, n + drafts))) {
        if (drafts > 0) {
          drafts = 0;  // memory is short: verify nothing rather than preempt anyone
          continue;
        }
        if (preempt_running(kv_victim()) == seq) break;
      }
      if (!alloc) continue;  // it was the victim itself; the others may still fit
      add_to_plan(plan, seq, n, *alloc, drafts);
      budget -= n + drafts;
    }
  }

  // Sequences that join running in this step: never priority victims in the
  // same step (one swapped in now has its blocks copied back only when the
  // step runs; one admitted now has computed nothing to give back yet).
  std::vector<const Sequence*> admitted_now;

  // Swapped sequences come back before any waiting one is admitted, unless
  // memory was short this step; they then run as any running sequence.
  if (plan.preempted.empty()) {
    while (!swapped_.empty() && budget > 0 && static_cast<int32_t>(running_.size()) < config_.max_num_seqs) {
      Sequence* seq = swapped_.front();
      const int32_t n = tokens_to_schedule(*seq, seq->num_computed_tokens, budget);
      if (n == 0) break;
      if (!swap_in(seq, plan)) break;
      swapped_.pop_front();
      admitted_now.push_back(seq);
      auto alloc = kv_.allocate_slots(seq->id, seq->num_computed_tokens, n);
      if (!alloc) break;  // back in, but no room for its new tokens: it runs next step
      add_to_plan(plan, seq, n, *alloc);
      budget -= n;
    }
  }

  // Waiting sequences, unless memory was short this step or some are still swapped out.
  // Under the priority policy one that outranks the last running sequence
  // takes that one's seat or blocks; one of a request below its fair share
  // takes those of a request above it.
  if (plan.preempted.empty() && swapped_.empty()) {
    const auto outranks_last_running = [&](const Sequence* seq) {
      if (config_.policy != SchedulingPolicy::Priority || running_.empty()) return false;
      const Sequence* last = running_.back();
      return effective_priority(*seq) < effective_priority(*last) &&
             std::find(admitted_now.begin(), admitted_now.end(), last) == admitted_now.end();
    };
    while (!waiting_.empty() && budget > 0) {
      const size_t at = next_waiting();
      Sequence* seq = waiting_[at];
      // A victim of this step waits at least until the next one.
      if (std::find(plan.preempted.begin(), plan.preempted.end(), seq->id) != plan.preempted.end()) break;
      PrefixMatch match;
      int32_t n = 0;
      std::optional<SlotAllocation> alloc;
      if (static_cast<int32_t>(running_.size()) < config_.max_num_seqs) {
        // (A sequence past its window recomputes through the window, not from cached blocks.)
        if (config_.kv_eviction == KvEviction::None || seq->num_tokens() <= config_.max_model_len)
          match = kv_.match_prefix(seq->token_ids);
        n = tokens_to_schedule(*seq, match.num_tokens, budget);
        if (n == 0) break;  // does not fit the budget whole (chunked prefill off)
        // Blocks it would hold, matched ones included (they may sit in the
        // cache, so counting them errs on the safe side).
        const int32_t bs = kv_.block_size();
        const int32_t blocks = (match.num_tokens + n + bs - 1) / bs;
        if (admission_leaves_reserve(blocks)) alloc = kv_.allocate_slots(seq->id, match.num_tokens, n, &match);
      }
      if (!alloc) {  // no seat or no blocks
        if (outranks_last_running(seq)) {
          ++num_preemptions_priority_;
          preempt_running(running_.back());
        } else if (Sequence* victim = fair_victim(*seq, admitted_now)) {
          ++num_preemptions_fair_;
          preempt_running(victim);
        } else {
          break;
        }
        continue;
      }
      waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(at));
      seq->num_computed_tokens = match.num_tokens;
      if (seq->num_cached_tokens < 0) seq->num_cached_tokens = match.num_tokens;
      seq->status = SeqStatus::Running;
      insert_running(seq);
      admitted_now.push_back(seq);
      add_to_plan(plan, seq, n, *alloc);
      budget -= n;
    }
  }
#ifndef NDEBUG
  check_invariants();
#endif
  return plan;
}

void Scheduler::on_step_done(const StepPlan& plan) {
  free_host_blocks_.insert(free_host_blocks_.end(), host_blocks_reading_.begin(), host_blocks_reading_.end());
  host_blocks_reading_.clear();
  for (const ScheduledSeq& s : plan.seqs) {
    Sequence* seq = find(s.seq_id);
    if (!seq || seq != s.seq || seq->status != SeqStatus::Running) continue;
    PAGELLM_CHECK(seq->num_computed_tokens == s.start_pos,
                  "on_step_done: sequence {} has {} computed tokens, the plan started it at {} "
                  "(plan applied twice?)",
                  seq->id, seq->num_computed_tokens, s.start_pos);
    int32_t computed = s.end_pos();
    if (s.num_draft_tokens() > 0) {
      // The engine appended the accepted drafts and one token after them:
      // positions past the accepted drafts hold rejected ones, whose slots
      // go back (their blocks were never committed).
      computed = std::min(computed, seq->num_tokens() - 1);
      PAGELLM_CHECK(computed >= s.end_pos() - s.num_draft_tokens(),
                    "on_step_done: sequence {} verified {} drafts but no token was appended", seq->id,
                    s.num_draft_tokens());
    }
    seq->num_computed_tokens = computed;
    PAGELLM_CHECK(seq->num_computed_tokens <= seq->num_tokens(),
                  "on_step_done: sequence {} lost tokens ({} computed, {} token ids)", seq->id,
                  seq->num_computed_tokens, seq->num_tokens());
    kv_.commit_computed(seq->id, seq->token_ids, seq->num_computed_tokens);
    if (s.num_draft_tokens() > 0) kv_.truncate(seq->id, seq->num_tokens());
  }
#ifndef NDEBUG
  check_invariants();
#endif
}

bool Scheduler::finish(SeqId id, SeqStatus status) {
  PAGELLM_CHECK(is_finished(status), "Scheduler::finish: {} is not a finished status",
                to_string(status));
  const auto it = live_.find(id);
  if (it == live_.end()) return false;
  Sequence* seq = it->second;
  if (seq->status == SeqStatus::Running) {
    erase_running(seq);
  } else if (seq->status == SeqStatus::Swapped) {
    swapped_.erase(std::find(swapped_.begin(), swapped_.end(), seq));
    auto host = host_blocks_.find(id);
    free_host_blocks_.insert(free_host_blocks_.end(), host->second.begin(), host->second.end());
    host_blocks_.erase(host);
  } else {
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), seq));
  }
  kv_.free(id);
  seq->status = status;
  forget(seq);
  return true;
}

void Scheduler::check_invariants() const {
  kv_.check_invariants();
  PAGELLM_CHECK(live_.size() == running_.size() + waiting_.size() + swapped_.size(),
                "{} live sequences but {} running + {} waiting + {} swapped", live_.size(), running_.size(),
                waiting_.size(), swapped_.size());
  size_t host_held = 0;
  for (const Sequence* s : swapped_) {
    PAGELLM_CHECK(find(s->id) == s && s->status == SeqStatus::Swapped && !kv_.has_seq(s->id),
                  "swapped sequence {} is not live, not marked swapped, or holds device blocks", s->id);
    const auto h = host_blocks_.find(s->id);
    PAGELLM_CHECK(h != host_blocks_.end() &&
                      static_cast<int32_t>(h->second.size()) ==
                          blocks_for_tokens(s->num_computed_tokens, kv_.block_size()),
                  "swapped sequence {} holds the wrong number of host blocks", s->id);
    host_held += h->second.size();
  }
  PAGELLM_CHECK(host_blocks_.size() == swapped_.size() &&
                    host_held + free_host_blocks_.size() + host_blocks_reading_.size() ==
                        static_cast<size_t>(config_.preemption_mode == PreemptionMode::Swap ? config_.num_swap_blocks : 0),
                "host blocks leaked: {} held + {} free of {}", host_held, free_host_blocks_.size(),
                config_.num_swap_blocks);
  PAGELLM_CHECK(kv_.num_seqs() == static_cast<int32_t>(running_.size()),
                "{} sequences hold KV blocks but {} are running", kv_.num_seqs(), running_.size());
  std::unordered_map<uint64_t, int32_t> live_per_request, running_per_request;
  for (const auto& [id, s] : live_) ++live_per_request[s->request_id];
  for (const Sequence* s : running_) ++running_per_request[s->request_id];
  PAGELLM_CHECK(live_per_request == live_per_request_ && running_per_request == running_per_request_,
                "per-request counts are stale: {} requests live ({} counted), {} running ({} counted)",
                live_per_request.size(), live_per_request_.size(), running_per_request.size(),
                running_per_request_.size());
  const int32_t bs = kv_.block_size();
  for (size_t i = 0; i < running_.size(); ++i) {
    const Sequence* s = running_[i];
    PAGELLM_CHECK(find(s->id) == s, "running sequence {} is not live (or listed twice)", s->id);
    PAGELLM_CHECK(s->status == SeqStatus::Running, "sequence {} is in the running list as {}",
                  s->id, to_string(s->status));
    PAGELLM_CHECK(int64_t(kv_.block_table(s->id).size()) * bs >= s->num_computed_tokens,
                  "running sequence {} has {} computed tokens in {} blocks", s->id,
                  s->num_computed_tokens, kv_.block_table(s->id).size());
    PAGELLM_CHECK(s->num_computed_tokens <= s->num_tokens() &&
                      (s->num_computed_tokens <= config_.max_model_len || config_.kv_eviction == KvEviction::Sliding),
                  "running sequence {} has {} computed of {} tokens", s->id,
                  s->num_computed_tokens, s->num_tokens());
    PAGELLM_CHECK(i == 0 || !runs_before(s, running_[i - 1]),
                  "running list is out of policy order at sequence {}", s->id);
  }
  for (const Sequence* s : waiting_) {
    PAGELLM_CHECK(find(s->id) == s, "waiting sequence {} is not live", s->id);
    PAGELLM_CHECK(s->status == SeqStatus::Waiting || s->status == SeqStatus::Preempted,
                  "sequence {} is in the waiting queue as {}", s->id, to_string(s->status));
    PAGELLM_CHECK(!kv_.has_seq(s->id) && s->num_computed_tokens == 0,
                  "waiting sequence {} holds KV state", s->id);
  }
  for (size_t i = 1; i < waiting_.size() && config_.policy == SchedulingPolicy::Priority; ++i) {
    PAGELLM_CHECK(!runs_before(waiting_[i], waiting_[i - 1]),
                  "waiting queue is out of priority order at sequence {}", waiting_[i]->id);
  }
}

}  // namespace pagellm
