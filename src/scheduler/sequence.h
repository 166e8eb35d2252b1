// Sequence: what the engine owns per generated sequence, and what the
// scheduler reads and advances. A request with n > 1 has n sequences.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "kv/kv_types.h"

namespace pagellm {

// The lifecycle, in order; every value from FinishedStopped on is final.
enum class SeqStatus : uint8_t {
  Waiting,          // added, never scheduled
  Running,          // holds KV blocks, is scheduled each step it has work
  Preempted,        // blocks taken back; waits to resume (recompute)
  Swapped,          // blocks copied to the host pool; waits to be swapped back in
  FinishedStopped,  // EOS / stop string / stop token
  FinishedLength,   // max_tokens or max_model_len
  FinishedAborted,  // client went away / cancelled
  FinishedIgnored,  // refused (e.g. could never fit)
};

// Pooling (embedding requests): the final hidden rows a sequence's prompt
// chunks hand back. Last: the last prompt position's; First and All: those
// positions of every chunk (they compute every prompt position, never taken
// from the prefix cache).
enum class PoolRows : uint8_t { None, Last, First, All };

inline bool is_finished(SeqStatus s) { return s >= SeqStatus::FinishedStopped; }
const char* to_string(SeqStatus s);

struct Sequence {
  SeqId id = 0;
  uint64_t request_id = 0;
  std::optional<SeqId> parent;  // the sequence this one was forked from (n > 1)
  int32_t priority = 0;         // lower runs first under SchedulingPolicy::Priority
  uint64_t arrival = 0;         // set by Scheduler::add / fork: admission order key
  int64_t arrival_step = 0;     // the scheduler step it arrived in (priority aging)

  std::vector<TokenId> token_ids;  // prompt, then generated tokens
  // Speculative decoding: tokens proposed to follow token_ids, set by the
  // engine before schedule() and cleared after the step. The scheduler runs
  // as many of them as the budget allows with a decode; they are never part
  // of token_ids until the target model accepts them.
  std::vector<TokenId> spec_token_ids;
  int32_t num_prompt_tokens = 0;
  int32_t num_computed_tokens = 0;  // tokens whose K/V are in the cache
  int32_t num_cached_tokens = -1;   // prefix-cache hit at first admission; -1 before
  // The logits of every prompt position are wanted (prompt logprobs): its
  // prompt is computed whole, never taken from the prefix cache, and each
  // step's plan asks for the rows of its prompt positions. The engine clears
  // it once it has them all.
  bool needs_prompt_logits = false;
  // A pooling sequence is its prompt alone: it never samples, and the engine
  // ends it once its prompt is computed. Each step's plan asks for the rows
  // named here (ScheduledSeq::hidden_begin).
  PoolRows pool_rows = PoolRows::None;
  // The prompt is computed in one step, whole (no chunks), and neither taken
  // from nor given to the prefix cache: a model with bidirectional attention
  // (an encoder), whose K/V at a position depend on the tokens after it.
  bool whole_prompt = false;
  // Every prompt position must be computed (no prefix-cache hit).
  bool needs_every_prompt_position() const {
    return needs_prompt_logits || whole_prompt || pool_rows == PoolRows::All || pool_rows == PoolRows::First;
  }

  // LoRA: the engine's id of the sequence's adapter (0: the base model). The
  // scheduler runs at most SchedulerConfig::max_loras adapters at once, and
  // the prefix cache keeps each adapter's blocks apart.
  int32_t lora_id = 0;

  SeqStatus status = SeqStatus::Waiting;
  int32_t num_preemptions = 0;

  int32_t num_tokens() const { return static_cast<int32_t>(token_ids.size()); }
  int32_t num_output_tokens() const { return num_tokens() - num_prompt_tokens; }
  bool finished() const { return is_finished(status); }
};

}  // namespace pagellm
