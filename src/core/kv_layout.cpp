#include "core/kv_layout.h"

#include <algorithm>
#include <map>

#include "core/error.h"

namespace pagellm {

int64_t kv_bytes_per_block(const KVCacheLayout& l) {
  PAGELLM_CHECK(l.n_layers > 0 && l.n_kv_heads > 0 && l.head_dim > 0 && l.block_size > 0 &&
                    l.bytes_per_element > 0 && l.scale_bytes >= 0,
                "KV layout needs positive sizes (layers {}, kv heads {}, head dim {}, block size "
                "{}, bytes per element {})",
                l.n_layers, l.n_kv_heads, l.head_dim, l.block_size, l.bytes_per_element);
  const int64_t parts = l.v_is_k ? 1 : 2;
  if (l.slot_elems.empty())
    return parts * l.n_layers * l.n_kv_heads * l.block_size * (int64_t{l.head_dim} * l.bytes_per_element + l.scale_bytes);
  PAGELLM_CHECK(static_cast<int32_t>(l.slot_elems.size()) == l.n_layers && l.slot_vectors.size() == l.slot_elems.size(),
                "KV layout: {} slot sizes for {} slots", l.slot_elems.size(), l.n_layers);
  int64_t per_token = 0;
  for (size_t s = 0; s < l.slot_elems.size(); ++s) {
    PAGELLM_CHECK(l.slot_elems[s] > 0 && l.slot_vectors[s] > 0, "KV layout: slot {} has no size", s);
    per_token += int64_t{l.slot_elems[s]} * l.bytes_per_element + int64_t{l.slot_vectors[s]} * l.scale_bytes;
  }
  return parts * l.block_size * per_token;
}

KvSlotShapes kv_slot_shapes(int32_t n_slots, std::span<const int32_t> layer_slot,
                            std::span<const int32_t> layer_kv_heads, std::span<const int32_t> layer_head_dim) {
  const size_t n = layer_kv_heads.size();
  PAGELLM_CHECK(n_slots > 0 && layer_head_dim.size() == n && (layer_slot.empty() || layer_slot.size() == n),
                "KV slot shapes: {} layers' heads, {} head sizes and {} slots", n, layer_head_dim.size(),
                layer_slot.size());
  KvSlotShapes out;
  out.elems.assign(static_cast<size_t>(n_slots), 0);
  out.vectors.assign(static_cast<size_t>(n_slots), 0);
  auto slot_of = [&](size_t l) { return layer_slot.empty() ? static_cast<int32_t>(l) : layer_slot[l]; };
  for (size_t l = 0; l < n; ++l) {
    const int32_t s = slot_of(l);
    PAGELLM_CHECK(s >= 0 && s < n_slots && layer_kv_heads[l] > 0 && layer_head_dim[l] > 0,
                  "KV slot shapes: layer {} in slot {} of {} with {} heads of {}", l, s, n_slots, layer_kv_heads[l],
                  layer_head_dim[l]);
    out.elems[static_cast<size_t>(s)] = std::max(out.elems[static_cast<size_t>(s)], layer_kv_heads[l] * layer_head_dim[l]);
  }
  for (size_t l = 0; l < n; ++l) {
    const auto s = static_cast<size_t>(slot_of(l));
    PAGELLM_CHECK(out.elems[s] % layer_head_dim[l] == 0, "KV slot {} of {} elements per token cannot hold layer {}'s "
                  "heads of {}", s, out.elems[s], l, layer_head_dim[l]);
    out.vectors[s] = std::max(out.vectors[s], out.elems[s] / layer_head_dim[l]);
  }
  for (size_t s = 0; s < out.elems.size(); ++s)
    PAGELLM_CHECK(out.elems[s] > 0, "KV slot shapes: no layer in slot {}", s);
  return out;
}

KvGroupPlan single_kv_group(int32_t n_layers) {
  KvGroupPlan p;
  p.groups = {KvGroup{}};
  p.layer_group.assign(static_cast<size_t>(n_layers), 0);
  p.layer_slot.resize(static_cast<size_t>(n_layers));
  for (int32_t l = 0; l < n_layers; ++l) p.layer_slot[l] = l;
  p.slots = n_layers;
  return p;
}

KvGroupPlan plan_kv_groups(std::span<const int32_t> layer_window, int32_t max_model_len) {
  const auto n = static_cast<int32_t>(layer_window.size());
  std::vector<int32_t> full;
  std::map<int32_t, std::vector<int32_t>> sliding;  // window -> layers, in order
  for (int32_t l = 0; l < n; ++l) {
    const int32_t w = layer_window[l];
    if (w <= 0 || w >= max_model_len) full.push_back(l);
    else sliding[w].push_back(l);
  }
  if (full.empty() || sliding.empty()) return single_kv_group(n);
  KvGroupPlan p;
  p.layer_group.assign(static_cast<size_t>(n), 0);
  p.layer_slot.assign(static_cast<size_t>(n), 0);
  const auto k = static_cast<int32_t>(full.size());
  p.slots = k;
  p.groups.push_back(KvGroup{});
  for (int32_t i = 0; i < k; ++i) p.layer_slot[full[i]] = i;
  for (const auto& [window, layers] : sliding) {
    for (size_t i = 0; i < layers.size(); ++i) {
      if (i % k == 0) p.groups.push_back({KvGroupKind::Sliding, window});
      p.layer_group[layers[i]] = static_cast<int32_t>(p.groups.size()) - 1;
      p.layer_slot[layers[i]] = static_cast<int32_t>(i % k);
    }
  }
  return p;
}

std::vector<int32_t> stage_kv_slots(const KvGroupPlan& plan, int32_t begin, int32_t end, int32_t& slots) {
  PAGELLM_CHECK(begin >= 0 && begin <= end && end <= static_cast<int32_t>(plan.layer_group.size()),
                "stage layers [{}, {}) outside a plan of {} layers", begin, end, plan.layer_group.size());
  std::vector<int32_t> next(plan.groups.size(), 0), out;
  for (int32_t l = begin; l < end; ++l) out.push_back(next[plan.layer_group[l]]++);
  slots = next.empty() ? 0 : *std::max_element(next.begin(), next.end());
  return out;
}

}  // namespace pagellm
