// Shared by the KV cache's unit tests.
#pragma once

#include <numeric>
#include <vector>

#include "kv/kv_types.h"

namespace pagellm::test {

// n consecutive token ids from `first`: distinct tokens, so every block hashes apart.
inline std::vector<TokenId> iota_tokens(int32_t n, TokenId first = 1000) {
  std::vector<TokenId> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

}  // namespace pagellm::test
