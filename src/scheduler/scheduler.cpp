#include "scheduler/scheduler.h"

#include <algorithm>

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
  PAGELLM_CHECK(max_prompt_logit_rows >= 0, "max_prompt_logit_rows must be >= 0, got {}", max_prompt_logit_rows);
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
  // One sequence of max_model_len must fit alone (with KV-cache groups, its
  // tables in every group).
  const int32_t per_seq = kv_.max_blocks_per_seq(config_.max_model_len, config_.max_num_batched_tokens);
  PAGELLM_CHECK(per_seq <= kv_.num_usable_blocks(),
                "max_model_len {} exceeds the KV cache capacity: a sequence that long holds {} blocks of {} tokens "
                "({} KV-cache groups), the cache has {}",
                config_.max_model_len, per_seq, kv_.block_size(), kv_.num_groups(), kv_.num_usable_blocks());
  PAGELLM_CHECK(config_.kv_eviction == KvEviction::None || window_tokens() >= 2 * kv_.block_size(),
                "sliding KV eviction: max_model_len {} leaves fewer than 2 blocks of {} tokens besides {} attention "
                "sinks",
                config_.max_model_len, kv_.block_size(), config_.attention_sinks);
  if (kv_.has_state()) {
    // A state is one slot per running sequence, rebuilt from token 0 when lost.
    PAGELLM_CHECK(config_.preemption_mode == PreemptionMode::Recompute && config_.kv_eviction == KvEviction::None,
                  "linear-attention layers keep a state that is neither swapped nor slid: they need "
                  "--preemption-mode recompute and no --kv-eviction");
    PAGELLM_CHECK(kv_.num_state_slots() >= config_.max_num_seqs,
                  "{} linear-attention state slots for max_num_seqs {}", kv_.num_state_slots(),
                  config_.max_num_seqs);
  }
  if (config_.preemption_mode == PreemptionMode::Swap) {
    // Popped from the back: lowest ids first.
    for (int32_t b = config_.num_swap_blocks - 1; b >= 0; --b) free_host_blocks_.push_back(b);
  }
}

int64_t Scheduler::effective_priority(const Sequence& seq) const {
  // Ranks from the last schedule(): fixed between steps, so the queues stay
  // sorted while sequences come and go. A value that arrived since then
  // shares the rank of the next one above it (the value breaks the tie).
  return aged_priority(seq.priority, step_ - seq.arrival_step, priority_levels_, config_.priority_aging_steps);
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
  return pagellm::fair_share(config_.max_num_seqs, static_cast<int32_t>(live_per_request_.size()));
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
  if (num_running() >= config_.max_num_seqs || (kv_.has_state() && kv_.num_free_state_slots() == 0)) {
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
      if (kv_.has_state() && computed < s.end_pos()) {
        // A linear-attention state cannot drop the rejected tokens: it goes
        // back to its snapshot from before this step, and the next step
        // recomputes the accepted tokens (their KV is written again, the same).
        computed = s.start_pos;
        kv_.restore_state(seq->id);
      }
    }
    seq->num_computed_tokens = computed;
    PAGELLM_CHECK(seq->num_computed_tokens <= seq->num_tokens(),
                  "on_step_done: sequence {} lost tokens ({} computed, {} token ids)", seq->id,
                  seq->num_computed_tokens, seq->num_tokens());
    // (A whole-prompt sequence's K/V depend on its later tokens: no prefix cache.)
    if (!seq->whole_prompt)
    kv_.commit_computed(seq->id, seq->token_ids, seq->num_computed_tokens, static_cast<uint64_t>(seq->lora_id));
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
                      static_cast<int32_t>(h->second.size()) == kv_.blocks_held(s->num_computed_tokens),
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
