#include "kv/kv_sizing.h"

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace pagellm {

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
