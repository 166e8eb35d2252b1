#include "core/kv_layout.h"

#include "core/error.h"

namespace pagellm {

int64_t kv_bytes_per_block(const KVCacheLayout& l) {
  PAGELLM_CHECK(l.n_layers > 0 && l.n_kv_heads > 0 && l.head_dim > 0 && l.block_size > 0 &&
                    l.bytes_per_element > 0 && l.scale_bytes >= 0,
                "KV layout needs positive sizes (layers {}, kv heads {}, head dim {}, block size "
                "{}, bytes per element {})",
                l.n_layers, l.n_kv_heads, l.head_dim, l.block_size, l.bytes_per_element);
  return int64_t{2} * l.n_layers * l.n_kv_heads * l.block_size *
         (int64_t{l.head_dim} * l.bytes_per_element + l.scale_bytes);
}

}  // namespace pagellm
