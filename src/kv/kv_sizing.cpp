#include "kv/kv_sizing.h"

#include <algorithm>
#include <limits>
#include <map>

#include <fmt/format.h>

#include "core/error.h"
#include "kv/kv_types.h"

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

int32_t kv_blocks_per_seq(std::span<const KvGroup> groups, int32_t block_size, int32_t max_len, int32_t step_tokens) {
  const int32_t all = blocks_for_tokens(max_len, block_size);
  if (groups.empty()) return all;
  int32_t total = 0;
  for (const KvGroup& g : groups) {
    // A sliding table is longest at a step's end, counted from where the
    // step's first query looks back to.
    const int64_t span = int64_t{std::min(step_tokens, max_len)} + g.window;
    total += keeps_every_token(g.kind) ? all : std::min(all, blocks_for_tokens(span, block_size) + 1);
  }
  return total;
}

std::string describe_kv_groups(std::span<const KvGroup> groups) {
  if (groups.empty()) return "full x1";
  std::map<int32_t, int> count;  // window (0: full, -1: MLA latent) -> groups
  for (const KvGroup& g : groups)
    ++count[g.kind == KvGroupKind::Full ? 0 : g.kind == KvGroupKind::MlaLatent ? -1 : g.window];
  std::string out;
  for (const auto& [window, n] : count) {
    if (!out.empty()) out += ", ";
    out += window == 0    ? fmt::format("full x{}", n)
           : window < 0 ? fmt::format("mla latent x{}", n)
                        : fmt::format("sliding {} x{}", window, n);
  }
  return out;
}

}  // namespace pagellm
