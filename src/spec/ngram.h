// Prompt lookup (n-gram) proposals: text that copies from its context (an
// edit, an extraction, code) repeats runs of tokens already seen, so the
// tokens that followed the last occurrence of the current suffix are a cheap
// guess at what comes next.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kv/kv_types.h"

namespace pagellm {

// Finds the longest suffix of `tokens` with n in [min_n, max_n] tokens that
// also occurs earlier in `tokens`, at its most recent earlier occurrence, and
// appends to `out` up to k tokens that followed it there. Returns how many it
// appended (0: no match).
int32_t ngram_propose(std::span<const TokenId> tokens, int32_t min_n, int32_t max_n, int32_t k,
                      std::vector<TokenId>& out);

}  // namespace pagellm
