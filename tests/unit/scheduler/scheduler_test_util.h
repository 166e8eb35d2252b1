// Small builders the scheduler tests share.
#pragma once

#include <numeric>
#include <vector>

#include "scheduler/scheduler.h"

namespace pagellm::test {

// n token ids first, first + 1, ...
inline std::vector<TokenId> tokens(int32_t n, TokenId first = 100) {
  std::vector<TokenId> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

inline SchedulerConfig sched_config(int32_t budget, int32_t max_seqs = 256, int32_t max_model_len = 1024) {
  SchedulerConfig c;
  c.max_num_batched_tokens = budget;
  c.max_num_seqs = max_seqs;
  c.max_model_len = max_model_len;
  return c;
}

inline KVCacheConfig kv_config(int32_t num_blocks, int32_t bs = 16, bool prefix = true) {
  KVCacheConfig c;
  c.num_blocks = num_blocks;
  c.block_size = bs;
  c.enable_prefix_caching = prefix;
  return c;
}

}  // namespace pagellm::test
