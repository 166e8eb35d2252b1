// StepPlan: what one engine step computes. The scheduler fills it; the runner
// turns it into input ids, positions, slot mapping and block tables for ONE
// forward pass over every scheduled token.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kv/kv_types.h"
#include "scheduler/sequence.h"

namespace pagellm {

struct ScheduledSeq {
  Sequence* seq = nullptr;
  SeqId seq_id = 0;
  int32_t start_pos = 0;       // seq's num_computed_tokens before this step
  int32_t num_new_tokens = 0;  // tokens [start_pos, start_pos + num_new_tokens) run now
  // The sequence's whole block table after this step's allocation. Valid
  // until the next call into the scheduler other than on_step_done().
  std::span<const BlockId> block_table;
  // KV-cache groups 1.. (sliding windows): their tables, likewise valid.
  std::vector<std::span<const BlockId>> group_tables;
  // This step reaches the end of the sequence's tokens: the runner samples
  // one token from the logits of the last position.
  bool sample = false;
  // Speculative decoding: the last draft_tokens.size() of the new tokens are
  // proposals that follow seq->token_ids (a prefix of seq->spec_token_ids).
  // The runner returns logits for every position from the last real token
  // on (draft_tokens.size() + 1 rows): each verifies the next draft, the last
  // gives the token after all of them.
  std::vector<TokenId> draft_tokens;
  // Prompt logprobs: the runner also returns the logits of the first
  // num_prompt_logits positions of this step (each scores the prompt token
  // after it), before the sampling rows. Never with drafts.
  int32_t num_prompt_logits = 0;
  // Pooling: the runner also returns the final hidden rows (after the output
  // norm) of positions start_pos + hidden_begin .. + num_hidden - 1.
  int32_t hidden_begin = 0, num_hidden = 0;
  // Sliding KV eviction: keys [kv_sinks, kv_evicted_to) are gone (SeqInfo).
  int32_t kv_sinks = 0, kv_evicted_to = 0;
  int32_t state_slot = -1;  // linear-attention state (KVCacheManager::state_slot)
  int32_t lora_slot = 0;    // LoRA: the model's slot of the sequence's adapter (the engine sets it; 0: none)

  int32_t end_pos() const { return start_pos + num_new_tokens; }
  int32_t num_draft_tokens() const { return static_cast<int32_t>(draft_tokens.size()); }
  // Rows of logits the runner returns for this entry's sampling (0 when not sampling).
  int32_t num_logits() const { return sample ? num_draft_tokens() + 1 : 0; }
  // Appends the token ids fed to the model this step: the sequence's tokens
  // from start_pos, then the drafts.
  void append_input_ids(std::vector<TokenId>& out) const;
};

struct StepPlan {
  int32_t block_size = 0;
  std::vector<ScheduledSeq> seqs;         // in scheduling order
  // Before the forward pass, in this order: swap_out (src: device block, dst:
  // host block), swap_in (src: host block, dst: device block), block_copies
  // (copy-on-write, device to device).
  std::vector<BlockCopy> swap_out;
  std::vector<BlockCopy> swap_in;
  std::vector<BlockCopy> block_copies;
  // Then linear-attention states (src, dst slots): forks made since the last step.
  std::vector<BlockCopy> state_copies;
  std::vector<SeqId> preempted;           // running sequences sent back to waiting this step
  std::vector<SeqId> swapped_out;         // those of them whose blocks went to the host pool
  std::vector<SeqId> length_capped;       // finished by the scheduler at max_model_len
  int32_t num_batched_tokens = 0;         // sum of num_new_tokens
  int32_t num_draft_tokens = 0;           // sum of draft_tokens.size() (included above)

  // No token to compute. A plan may still move blocks (a swap-out of the
  // only running sequence, a swap-in without room for its next token): the
  // runner must do those whatever else the plan holds.
  bool empty() const { return seqs.empty(); }
  bool has_block_moves() const {
    return !swap_out.empty() || !swap_in.empty() || !block_copies.empty() || !state_copies.empty();
  }

  // The slot (flat token index into the paged cache) of position `pos`:
  // block_table[pos / block_size] * block_size + pos % block_size.
  static int64_t slot_of(std::span<const BlockId> block_table, int32_t pos, int32_t block_size);
  // Appends the positions and slots of s's tokens this step; group_slots
  // (one per group 1..) get the slots in those groups' tables.
  void append_positions_and_slots(const ScheduledSeq& s, std::vector<int32_t>& positions, std::vector<int64_t>& slots,
                                  std::vector<std::vector<int64_t>>* group_slots = nullptr) const;
};

}  // namespace pagellm
