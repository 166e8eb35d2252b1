// The size of one paged KV-cache block, and which layers share a block
// table: what the scheduler's pool sizing (kv/kv_sizing.h), the KV manager
// (kv/kv_cache_manager.h) and every backend's cache (backend.h's
// KVCacheSpec) agree on.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace pagellm {

struct KVCacheLayout {
  int32_t n_layers = 0;           // layer slots in a block (with groups: the layers of one group)
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_size = 16;        // tokens per block
  int32_t bytes_per_element = 2;  // 2 for f16/bf16, 4 for f32, 1 for 8-bit caches
  int32_t scale_bytes = 0;        // per (token, KV head) vector: 4 in an int8 cache (its float scale)
  int32_t v_is_k = 0;             // 1: no V is stored, attention's values are the keys (an MLA latent)
  // Slots of their own size (layers of other shapes: kv_slot_shapes), per
  // token: K elements, and vectors that carry a scale. Empty: every slot
  // n_kv_heads * head_dim elements in n_kv_heads vectors.
  std::vector<int32_t> slot_elems = {}, slot_vectors = {};
};

// 2 (K and V; 1 with v_is_k) * n_layers * n_kv_heads * block_size * (head_dim * bytes_per_element + scale_bytes),
// or with slot sizes, the sum over slots. Throws Error for non-positive fields.
int64_t kv_bytes_per_block(const KVCacheLayout& layout);

// Layers of different K/V shapes (Gemma 4's global layers: a bigger head,
// other KV heads) that share a slot (in different groups' blocks) share its
// size: a slot holds per token the largest layer's n_kv_heads * head_dim
// elements; a smaller layer fills the first part of each block, as if it had
// slot_elems / head_dim heads (its vectors). layer_slot empty: slot = layer.
// Throws Error when a slot's size is not a multiple of a layer's head.
struct KvSlotShapes {
  std::vector<int32_t> elems, vectors;  // per slot
};
KvSlotShapes kv_slot_shapes(int32_t n_slots, std::span<const int32_t> layer_slot,
                            std::span<const int32_t> layer_kv_heads, std::span<const int32_t> layer_head_dim);

// ---- KV-cache groups (vLLM's hybrid KV-cache manager). Layers whose cache
// is kept alike form a group; each sequence has one block table per group,
// and every group's blocks come from one shared pool, so a block holds the
// same number of layers (slots) whatever its group.
enum class KvGroupKind : uint8_t {
  Full,       // every token's K/V for the whole sequence
  Sliding,    // only the keys a window of `window` tokens can still see
  MlaLatent,  // every token's one latent vector, shared by all heads (DeepSeek's MLA): kept as Full is
};
// Whether a group holds every token of a sequence (all kinds but Sliding).
inline bool keeps_every_token(KvGroupKind k) { return k != KvGroupKind::Sliding; }

struct KvGroup {
  KvGroupKind kind = KvGroupKind::Full;
  int32_t window = 0;  // Sliding: a query at p sees keys p - window < j <= p
  bool operator==(const KvGroup&) const = default;
};

struct KvGroupPlan {
  std::vector<KvGroup> groups;       // groups[0] is always Full
  std::vector<int32_t> layer_group;  // [n_layers] the layer's group
  std::vector<int32_t> layer_slot;   // [n_layers] its slot in a block of that group
  int32_t slots = 0;                 // layer slots per block
  bool grouped() const { return groups.size() > 1; }
};

// All layers in one full-attention group, slot = layer (the cache without groups).
KvGroupPlan single_kv_group(int32_t n_layers);

// layer_window[l]: 0 for a full-attention layer, else its sliding window.
// Full layers form group 0 (k layers, in order); sliding layers of one
// window fill groups of k slots each. A window that reaches max_model_len
// counts as full; without both kinds, one group (single_kv_group).
KvGroupPlan plan_kv_groups(std::span<const int32_t> layer_window, int32_t max_model_len);

// The slots a pipeline stage's block holds for layers [begin, end) of the
// plan: each group's layers there numbered from 0, so a stage keeps no slot
// it does not use. Returns the stage's slot of each of its layers and sets
// `slots` to the most any group needs there.
std::vector<int32_t> stage_kv_slots(const KvGroupPlan& plan, int32_t begin, int32_t end, int32_t& slots);

}  // namespace pagellm
