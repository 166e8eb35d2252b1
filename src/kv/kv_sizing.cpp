#include "kv/kv_sizing.h"

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace pagellm {

int64_t kv_bytes_per_block(const KVCacheLayout& l) {
  PAGELLM_CHECK(l.n_layers > 0 && l.n_kv_heads > 0 && l.head_dim > 0 && l.block_size > 0 &&
                    l.bytes_per_element > 0,
                "KV layout needs positive sizes (layers {}, kv heads {}, head dim {}, block size "
                "{}, bytes per element {})",
                l.n_layers, l.n_kv_heads, l.head_dim, l.block_size, l.bytes_per_element);
  return int64_t{2} * l.n_layers * l.n_kv_heads * l.head_dim * l.block_size * l.bytes_per_element;
}

int32_t kv_num_blocks_for_budget(const KVCacheLayout& layout, int64_t budget_bytes) {
  const int64_t per_block = kv_bytes_per_block(layout);
  const int64_t n = budget_bytes > 0 ? budget_bytes / per_block : 0;
  PAGELLM_CHECK(n >= 2,
                "KV cache budget of {} bytes holds {} blocks of {} bytes; at least 2 are needed "
                "({} bytes)",
                budget_bytes, n, per_block, 2 * per_block);
  return static_cast<int32_t>(std::min<int64_t>(n, std::numeric_limits<int32_t>::max()));
}

}  // namespace pagellm
