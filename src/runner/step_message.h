// What rank 0 sends every other rank each step under tensor / pipeline
// parallelism: the block moves and the batch of one forward pass, or the
// order to stop. The workers run the same forward pass (their shard of it)
// without a scheduler, tokenizer or sampler of their own.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace pagellm {

struct StepMessage {
  enum Kind : int32_t { Step = 1, Shutdown = 2 };
  Kind kind = Step;
  BlockPairs swap_out, swap_in, block_copies, state_copies;
  BatchInfo batch;                  // empty: block moves only
  std::vector<int32_t> logits_rows;
  // Batch rows whose final hidden states pooling wants: under pipeline
  // parallelism the last stage sends them after the logits.
  std::vector<int32_t> hidden_rows;
};

std::vector<uint8_t> encode_step(const StepMessage& m);
// Throws Error on a message that does not parse (a version mismatch).
StepMessage decode_step(const std::vector<uint8_t>& bytes);

}  // namespace pagellm
