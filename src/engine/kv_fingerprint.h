// What a KV block's contents depend on besides its tokens, as one 128-bit
// fingerprint: the KV offload tier (kv/kv_tier.h) keys and labels its blocks
// with it, so a block computed by another model, tokenizer, adapter, KV dtype
// or layout, backend or kernel choice is never loaded.
#pragma once

#include <cstdint>
#include <string>

#include "backend/backend.h"
#include "engine/engine.h"
#include "kv/tier_key.h"

namespace pagellm {

// A file's or folder's identity: its size, modification time and hashes of
// its first and last MiB and of 64 pages spread between (a folder: each
// regular file in it, by name). 0 for a path that does not exist.
uint64_t path_fingerprint(const std::string& path);

// The engine's fingerprint: the model (its files, or the dummy shape and
// type), the tokenizer, --hf-overrides, the LoRA slots' rank and dtype, the
// KV cache's spec (dtype, block size, layer slots, heads, groups), the
// backend and its options (threads aside), the kernel level (PAGELLM_ISA)
// and max_model_len (LongRoPE picks its factors by it).
TierKey engine_kv_fingerprint(const EngineConfig& config, const KVCacheSpec& spec, const std::vector<KvGroup>& groups,
                              int32_t max_model_len, const std::string& backend_name);

}  // namespace pagellm
