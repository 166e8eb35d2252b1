#include "kv/tier_key.h"

#include <cstring>

#include <fmt/format.h>

#include "core/util.h"
#include "kv/block_hash.h"

namespace pagellm {
namespace {

// Seeds that keep the two lanes (and the groups) apart.
constexpr uint64_t kLaneB = 0xd6e8feb86659fd93ULL;
constexpr uint64_t kGroupMix = 0xa0761d6478bd642fULL;

}  // namespace

std::string TierKey::hex() const { return fmt::format("{:016x}{:016x}", hi, lo); }

TierKey tier_root(const TierKey& fingerprint, uint64_t adapter_fingerprint) {
  return {mix64(fingerprint.hi ^ mix64(adapter_fingerprint + 1)),
          mix64(fingerprint.lo ^ mix64(adapter_fingerprint ^ kLaneB))};
}

TierKey tier_next(const TierKey& parent, std::span<const TokenId> tokens) {
  // Lane b hashes a transformed parent: a collision of lane a's internal state
  // for two parents says nothing about lane b's.
  return {hash_block_tokens(parent.hi, tokens), hash_block_tokens(mix64(parent.lo ^ kLaneB) ^ parent.hi, tokens)};
}

TierKey tier_group_key(const TierKey& chain, int group) {
  if (group == 0) return chain;
  const uint64_t g = static_cast<uint64_t>(group) * kGroupMix;
  return {mix64(chain.hi ^ g), mix64(chain.lo + g)};
}

uint64_t tier_checksum(const void* data, size_t bytes, uint64_t seed) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t h = mix64(seed ^ (bytes * kGroupMix));
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = fold_mul(h ^ w, kLaneB) + kGroupMix;
  }
  uint64_t tail = 0;
  std::memcpy(&tail, p + i, bytes - i);
  return mix64(fold_mul(h ^ tail ^ (bytes - i), kLaneB));
}

}  // namespace pagellm
