// Pipeline micro-batches: a step's batch cut into token ranges. A range may
// cut a sequence: its first part is an earlier chunk of the same prompt, so
// the later part's attention reads the keys the earlier one wrote on the
// same stage (each stage runs the micro-batches in order), as chunked
// prefill does across steps.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace pagellm {

// Ends of `parts` token ranges of about equal size over n tokens (the last
// is n); fewer when a range would hold under min_tokens.
std::vector<int32_t> micro_batch_ends(int64_t n, int parts, int64_t min_tokens);

// Rows [begin, end) of `batch` as a batch of its own; sequences cut by the
// range keep their block tables and see the context up to their last row in
// it. The batch's sequences must cover its rows in order.
void slice_batch(const BatchInfo& batch, int32_t begin, int32_t end, BatchInfo& out);

}  // namespace pagellm
