#include "spec/ngram.h"

#include <algorithm>

#include <fmt/format.h>

#include "spec/proposer.h"

namespace pagellm {

int32_t ngram_propose(std::span<const TokenId> tokens, int32_t min_n, int32_t max_n, int32_t k,
                      std::vector<TokenId>& out) {
  const int64_t len = static_cast<int64_t>(tokens.size());
  if (k <= 0 || min_n < 1) return 0;
  for (int64_t n = std::min<int64_t>(max_n, len - 1); n >= min_n; --n) {
    const TokenId* suffix = tokens.data() + (len - n);
    // Occurrences [p, p + n) that end before the last token, latest first.
    for (int64_t p = len - n - 1; p >= 0; --p) {
      if (tokens[p] != suffix[0] || !std::equal(suffix, suffix + n, tokens.data() + p)) continue;
      const int64_t from = p + n;
      const int64_t count = std::min<int64_t>(k, len - from);
      out.insert(out.end(), tokens.begin() + from, tokens.begin() + from + count);
      return static_cast<int32_t>(count);
    }
  }
  return 0;
}

void NgramProposer::propose(std::span<DraftRequest> requests) {
  for (DraftRequest& r : requests) {
    r.tokens->clear();
    r.probs->clear();
    ngram_propose(r.seq->token_ids, min_n_, max_n_, r.max_drafts, *r.tokens);
  }
}

std::string NgramProposer::describe() const { return fmt::format("ngram (lookup {}..{})", min_n_, max_n_); }

}  // namespace pagellm
