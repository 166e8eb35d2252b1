// Scheduler: iteration-level (continuous) batching over a paged KV cache.
//
// One rule for prefill and decode (vLLM V1): every running sequence's
// num_computed_tokens catches up with its num_tokens under the step's token
// budget. A decode is a sequence one token behind; a prefill (or a recompute
// after preemption, or a prompt partly found in the prefix cache) is one many
// tokens behind. schedule() is a chain of steps (scheduler_steps.cpp) that
// record their decisions (StepDecisions) and apply the rules in step_rules.h:
//   1. order: with priority aging, re-rank priorities and re-sort the queues;
//   2. running sequences, decodes first, then prefill chunks, in policy order:
//      composition (as many of their uncomputed tokens as the budget allows:
//      decodes take 1, prefill chunks the rest), then capacity: KV slots for
//      them; when blocks run out, preempt the last running sequence in policy
//      order (lowest priority / newest; possibly the one being scheduled);
//   3. if nobody was preempted: swapped sequences come back, then waiting ones
//      are admitted in policy order (or shortest first: StepComposition below)
//      while the budget, max_num_seqs and KV blocks allow, prefix-cache hits
//      first reducing what they compute. The conservative admission policy
//      also keeps a reserve of free blocks for the running sequences to grow into;
//   4. composition is decided per sequence inside 2 and 3, against the budget
//      that is left when its turn comes (a preemption gives tokens back);
//   5. build_plan() writes the StepPlan from the decisions in one go.
// Under the priority policy a waiting sequence of higher (effective) priority
// may preempt the lowest-priority running one when seats or blocks are short;
// aging raises a sequence's effective priority with the steps it has been in
// the system, so a low priority waits a bounded time. Under FCFS waiting
// sequences never preempt running ones for priority.
//
// Fairness between requests (Sequence::request_id; a request with n > 1 has
// several sequences): with R requests present, a request's fair share is
// max(1, max_num_seqs / R) seats. Waiting sequences are admitted from the
// request holding the fewest seats first (within a policy class), and when
// one of a request below its share cannot get a seat or blocks, the newest
// sequence of the request furthest above its share gives them up (never one
// of a better priority class). When blocks run short, the victim is the
// newest sequence of the request holding the most seats (in the last class).
// So one request with many sequences cannot keep another's first token
// waiting for more than a step or two.
//
// Speculative decoding: a decode whose seq->spec_token_ids holds proposals
// runs them in the same pass (the plan entry's draft_tokens), with KV slots
// for all of them; when blocks are short it runs without them rather than
// preempt. on_step_done() keeps the computed tokens the engine accepted and
// gives back the slots of the rejected ones. With linear-attention states
// (which cannot drop tokens) the step first snapshots each verifying
// sequence's state; when a draft is rejected the state is restored from it
// and the accepted tokens are computed again in the next step.
//
// The engine owns the Sequence objects; the scheduler keeps pointers to the
// live ones (waiting or running) until finish() / abort() or a length cap
// returns them. Each engine step:
//   StepPlan plan = scheduler.schedule();
//   runner: do plan.block_copies, then one forward pass over plan.seqs,
//           sample one token for each entry with sample == true;
//   engine: append each sampled token to its seq->token_ids (with speculative
//           decoding: the accepted drafts, then one token);
//   scheduler.on_step_done(plan);
//   engine: stop checks; scheduler.finish(id, status) for finished sequences
//           (and for seqs with seq.num_tokens() >= max_model_len);
//           report plan.length_capped as finished (FinishedLength);
//           fork(...) the extra samples of an n > 1 request after its prompt
//           step (each child carries its own first sampled token, so apply the
//           stop checks to it too).
// abort() may be called between steps (not between schedule and on_step_done).
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <unordered_map>
#include <vector>

#include "core/enum_names.h"
#include "kv/kv_cache_manager.h"
#include "scheduler/sequence.h"
#include "scheduler/step_decisions.h"
#include "scheduler/step_plan.h"
#include "scheduler/step_rules.h"

namespace pagellm {

enum class SchedulingPolicy : uint8_t {
  Fcfs,      // arrival order
  Priority,  // (priority, arrival): lower priority value runs first
};
inline constexpr EnumName<SchedulingPolicy> kSchedulingPolicyNames[] = {{"fcfs", SchedulingPolicy::Fcfs},
                                                                         {"priority", SchedulingPolicy::Priority}};

// How a preempted sequence gets its KV back (vLLM's --preemption-mode):
// Recompute frees its blocks and computes its tokens again later; Swap copies
// its blocks to a host pool of num_swap_blocks blocks (the runner does the
// copies the plan lists) and back when memory allows. A victim that does not
// fit the host pool is recomputed instead.
enum class PreemptionMode : uint8_t { Recompute, Swap };
inline constexpr EnumName<PreemptionMode> kPreemptionModeNames[] = {{"recompute", PreemptionMode::Recompute},
                                                                     {"swap", PreemptionMode::Swap}};
const char* to_string(PreemptionMode m);

// When a waiting sequence may be admitted (--preemption-policy, the tuning
// guides' modes): Aggressive whenever its blocks can be allocated, so a
// running decode may need a preemption right after; Conservative only when
// the pool keeps a reserve afterwards (admission_watermark of the blocks, and
// at least one block per running sequence for its next tokens).
enum class AdmissionPolicy : uint8_t { Aggressive, Conservative };
inline constexpr EnumName<AdmissionPolicy> kAdmissionPolicyNames[] = {{"aggressive", AdmissionPolicy::Aggressive},
                                                                       {"conservative", AdmissionPolicy::Conservative}};

// Which prefills a step takes when its token budget cannot take them all
// (--step-composition). Fcfs: queue order, so a long prompt's chunks fill the
// budget and short prompts behind it wait. LengthAware (the tuning guides'
// compute-aware grouping): running prefills closest to done first, waiting
// prompts shortest first, and a running prefill's chunk leaves room for the
// waiting prompts shorter than what it has left. Short requests get their
// first token within a step or two while a long one takes the rest of each
// budget. A sequence in the system for length_aware_max_wait_steps steps
// loses its turn to no shorter one, so a long prompt waits a bounded time.
// Decodes always come first.
enum class StepComposition : uint8_t { Fcfs, LengthAware };
inline constexpr EnumName<StepComposition> kStepCompositionNames[] = {{"fcfs", StepComposition::Fcfs},
                                                                       {"length-aware", StepComposition::LengthAware}};

// What happens when a sequence's KV outgrows max_model_len tokens
// (--kv-eviction). None: it finishes (length). Sliding (StreamingLLM): it
// keeps its first attention_sinks tokens and its most recent ones, at most
// max_model_len tokens of KV in all, and goes on; the blocks in between go
// back to the pool as the window moves. Positions keep counting, so RoPE
// distances within the window are the true ones.
enum class KvEviction : uint8_t { None, Sliding };
inline constexpr EnumName<KvEviction> kKvEvictionNames[] = {{"none", KvEviction::None},
                                                             {"sliding", KvEviction::Sliding}};

struct SchedulerConfig {
  int32_t max_num_seqs = 256;             // running sequences at once
  int32_t max_num_batched_tokens = 2048;  // token budget of one step
  int32_t max_model_len = 4096;           // positions a sequence may use
  bool enable_chunked_prefill = true;
  SchedulingPolicy policy = SchedulingPolicy::Fcfs;
  // > 0: at most this many tokens of one prefill per step, so one long prompt
  // cannot take the whole budget; 0: off. Applies with chunked prefill only.
  int32_t long_prefill_token_threshold = 0;
  PreemptionMode preemption_mode = PreemptionMode::Recompute;
  int32_t num_swap_blocks = 0;  // host pool size in blocks (Swap mode)
  AdmissionPolicy admission_policy = AdmissionPolicy::Aggressive;
  double admission_watermark = 0.01;  // Conservative: fraction of the blocks kept free, [0, 1)
  // Priority policy: every this many steps in the system a sequence moves up
  // one rank among the distinct priority values present (ranks, not values,
  // so the bound does not depend on how far apart the values are); 0: no
  // aging. With D distinct values present, a sequence runs before any that
  // arrives D x priority_aging_steps steps or more after it.
  int32_t priority_aging_steps = 256;
  StepComposition composition = StepComposition::Fcfs;
  KvEviction kv_eviction = KvEviction::None;
  int32_t attention_sinks = 4;  // Sliding: tokens kept from the start
  int32_t length_aware_max_wait_steps = 64;
  // > 0: the sequences that need their prompt's logits (prompt logprobs)
  // compute at most this many tokens a step together (with chunked
  // prefill), so the rows of logits a step returns stay bounded; 0: no cap.
  int32_t max_prompt_logit_rows = 0;
  // > 0: at most this many LoRA adapters among the running sequences
  // (--max-loras: the model's adapter slots); a waiting sequence of one more
  // adapter waits while others go ahead. 0: no limit (no adapters).
  int32_t max_loras = 0;

  // Throws Error naming the bad field.
  void validate() const;
};

class Scheduler {
 public:
  // Throws Error for bad settings, including a max_model_len the KV cache
  // cannot hold for one sequence alone.
  Scheduler(const SchedulerConfig& config, const KVCacheConfig& kv_config);

  // Queue a new sequence (status Waiting). Its token_ids hold the prompt and
  // num_prompt_tokens says how many; num_computed_tokens is reset to 0.
  // Throws InvalidRequest ("prompt") for an empty prompt or one longer than
  // max_model_len; Error for a null pointer or a live duplicate id.
  void add(Sequence* seq);

  // Parallel sampling: `child` continues running sequence `parent`, sharing all
  // its KV blocks. child->token_ids must start with the parent's computed
  // tokens (typically: the prompt plus the child's own first sampled token);
  // its num_computed_tokens is set to the parent's. Runs from the next step.
  // When every seat (max_num_seqs) is taken, the child waits instead, holding
  // no blocks: once admitted it finds the parent's full prompt blocks in the
  // prefix cache and computes only the rest.
  void fork(SeqId parent, Sequence* child);

  StepPlan schedule();

  // After the forward pass and after appending sampled tokens: advance each
  // scheduled sequence's num_computed_tokens and cache newly full blocks.
  // Entries whose sequence is no longer running are skipped.
  void on_step_done(const StepPlan& plan);

  // The sequence is done: free its blocks now (full ones stay cached), set
  // its status (a Finished* value) and forget it. False for an unknown id.
  bool finish(SeqId id, SeqStatus status = SeqStatus::FinishedStopped);
  // finish(id, FinishedAborted): a waiting sequence just leaves the queue.
  bool abort(SeqId id) { return finish(id, SeqStatus::FinishedAborted); }

  // The engine should finish a sequence once this holds (vLLM's rule): the
  // next token would need a position past the model's context.
  bool reached_max_model_len(const Sequence& seq) const {
    return config_.kv_eviction == KvEviction::None && seq.num_tokens() >= config_.max_model_len;
  }

  int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
  int32_t num_waiting() const { return static_cast<int32_t>(waiting_.size()); }
  bool has_unfinished() const { return !running_.empty() || !waiting_.empty() || !swapped_.empty(); }
  const std::vector<Sequence*>& running() const { return running_; }  // policy order
  const std::deque<Sequence*>& waiting() const { return waiting_; }   // admission order
  const std::deque<Sequence*>& swapped() const { return swapped_; }   // resume order
  Sequence* find(SeqId id) const;  // live sequence or nullptr

  int64_t num_preemptions() const { return num_preemptions_; }
  // Preempted for a waiting sequence of higher priority (the rest: for KV blocks).
  int64_t num_preemptions_priority() const { return num_preemptions_priority_; }
  // Preempted for a waiting sequence of a request below its fair share of seats.
  int64_t num_preemptions_fair() const { return num_preemptions_fair_; }
  // The priority a sequence is scheduled by now: with aging, the rank of its
  // priority among those present at the last schedule() minus its age in
  // aging steps; without aging, its priority. Ties go to the better priority
  // value, then to the earlier arrival.
  int64_t effective_priority(const Sequence& seq) const;
  // Distinct requests with live sequences, and the seats one may hold while
  // others wait (0 with fewer than two requests: no fairness to keep).
  int32_t num_requests() const { return static_cast<int32_t>(live_per_request_.size()); }
  int32_t fair_share() const;
  int32_t seats_held(uint64_t request_id) const;
  // By mode: recompute includes swap victims that did not fit the host pool.
  int64_t num_preemptions_recompute() const { return num_preemptions_ - num_preemptions_swap_; }
  int64_t num_preemptions_swap() const { return num_preemptions_swap_; }
  int64_t num_blocks_swapped_out() const { return blocks_swapped_out_; }
  int64_t num_blocks_swapped_in() const { return blocks_swapped_in_; }
  int64_t num_evicted_blocks() const { return num_evicted_blocks_; }  // sliding KV eviction
  int32_t num_swapped() const { return static_cast<int32_t>(swapped_.size()); }
  int32_t num_free_swap_blocks() const { return static_cast<int32_t>(free_host_blocks_.size()); }
  // The KV offload tier (the engine's; kv_cache_manager.h): the blocks
  // committed since the last call, and prefixes brought into the pool for
  // sequences not yet added, held until unpin_prefix.
  std::vector<CommittedBlock> take_committed_blocks() { return kv_.take_committed(); }
  void set_record_commits(bool on) { kv_.set_record_commits(on); }
  // KV events (kv/kv_events.h) since the last call; set_record_events turns them on.
  void set_record_kv_events(bool on) { kv_.set_record_events(on); }
  std::vector<KvEvent> take_kv_events() { return kv_.take_events(); }
  PrefixImport import_prefix(std::span<const TokenId> tokens, uint64_t cache_key, int32_t max_blocks,
                             const std::function<bool(int, int32_t)>& supplied, int32_t max_fresh) {
    return kv_.import_prefix(tokens, cache_key, max_blocks, supplied, max_fresh);
  }
  void unpin_prefix(int32_t pin) { kv_.unpin(pin); }
  KVCacheStats kv_stats() const { return kv_.stats(); }
  int64_t prefix_query_tokens() const { return kv_.prefix_query_tokens(); }
  int64_t prefix_hit_tokens() const { return kv_.prefix_hit_tokens(); }
  const SchedulerConfig& config() const { return config_; }
  const KVCacheManager& kv() const { return kv_; }

  // KV invariants plus: every live sequence is in exactly one queue with a
  // matching status; running ones hold blocks covering their computed
  // tokens, waiting ones hold none. Throws Error. Debug builds (no NDEBUG)
  // run it at the end of schedule() and on_step_done().
  void check_invariants() const;

 private:
  friend class SchedulerStepsPeer;  // unit tests run the steps of schedule() one at a time

  bool runs_before(const Sequence* a, const Sequence* b) const;
  void insert_running(Sequence* seq);
  void erase_running(Sequence* seq);
  void insert_waiting(Sequence* seq, bool at_head);
  void make_live(Sequence* seq);
  void forget(Sequence* seq);

  // The steps of schedule(), in order (scheduler_steps.cpp); each records
  // what it decides in `step`, and build_plan() writes the plan from that.
  void order_queues();                         // 1. aging: re-rank priorities, re-sort the queues
  void schedule_running(StepDecisions& step);  // 2. running sequences: composition, then capacity
  void resume_swapped(StepDecisions& step);    // 3. swapped sequences back in
  void admit_waiting(StepDecisions& step);     // 3. waiting sequences in

  // 4. composition: the tokens (and drafts) a running sequence computes now.
  TokenGrant compose_running(Sequence* seq, bool decode, int32_t decodes_to_come, int32_t budget) const;
  TokenLimits token_limits(const Sequence& seq) const;
  int32_t budget_for(const Sequence& seq, const StepDecisions& step) const;
  int32_t window_tokens() const;
  // 2. capacity: KV slots for a composed grant, preempting as the pool needs.
  void allocate_running(TokenGrant want, StepDecisions& step);
  void finish_at_length_cap(Sequence* seq, StepDecisions& step);
  void preempt_running(Sequence* victim, StepDecisions& step);
  void preempt(Sequence* seq, StepDecisions& step);
  bool swap_out(Sequence* seq, StepDecisions& step);
  Sequence* pick_kv_victim() const;
  // 3. admission.
  // Index in waiting_ of the next one to admit, among those whose adapter may
  // run (lora_fits); nullopt: none may.
  std::optional<size_t> next_waiting() const;
  // LoRA: the distinct adapters of the running sequences, and whether seq's
  // adapter is among them or a slot is free for it.
  std::vector<int32_t> running_loras() const;
  bool lora_fits(const Sequence& seq, const std::vector<int32_t>& running) const;
  PrefixMatch cached_prefix(const Sequence& seq) const;
  std::optional<SlotAllocation> allocate_admission(const Sequence& seq, const PrefixMatch& match, int32_t num_new);
  void admit(size_t waiting_index, int32_t num_cached, StepDecisions& step);
  bool make_room_for(const Sequence& waiting, StepDecisions& step);
  bool outranks_last_running(const Sequence& waiting, const StepDecisions& step) const;
  Sequence* pick_fair_victim(const Sequence& waiting, const StepDecisions& step) const;
  bool swap_in(Sequence* seq, StepDecisions& step);
  // How the victim and admission rules (step_rules.h) see a sequence.
  SeatHolder seat_holder(const Sequence& seq) const;
  int64_t priority_class(const Sequence& seq) const;

  SchedulerConfig config_;
  KVCacheManager kv_;
  std::vector<Sequence*> running_;  // sorted by runs_before
  std::deque<Sequence*> waiting_;   // admission order
  std::unordered_map<SeqId, Sequence*> live_;
  std::unordered_map<uint64_t, int32_t> live_per_request_;   // request_id -> live sequences
  std::unordered_map<uint64_t, int32_t> running_per_request_;  // request_id -> running sequences
  std::vector<int32_t> priority_levels_;  // sorted distinct priorities present at the last schedule()
  uint64_t next_arrival_ = 0;
  int64_t step_ = 0;  // schedule() calls
  int64_t num_preemptions_ = 0;
  int64_t num_preemptions_priority_ = 0;
  int64_t num_preemptions_fair_ = 0;
  // Swap preemption: sequences whose blocks are in the host pool (resumed
  // before any waiting one), their host blocks, and the free host blocks.
  std::deque<Sequence*> swapped_;
  std::unordered_map<SeqId, std::vector<int32_t>> host_blocks_;
  std::vector<int32_t> free_host_blocks_;
  // Host blocks this step's swap-ins read. Free again only after the step:
  // the runner does every swap-out first, and a victim preempted later in
  // the same schedule() must not overwrite them.
  std::vector<int32_t> host_blocks_reading_;
  int64_t num_preemptions_swap_ = 0;
  int64_t num_evicted_blocks_ = 0;
  int64_t blocks_swapped_out_ = 0, blocks_swapped_in_ = 0;
};

}  // namespace pagellm
