#include "kv/block_hash.h"

#include "core/util.h"

namespace pagellm {
namespace {

constexpr uint64_t kMulA = 0x9e3779b97f4a7c15ULL;  // 2^64 / golden ratio
constexpr uint64_t kMulB = 0xc2b2ae3d27d4eb4fULL;
constexpr uint64_t kMulC = 0x165667b19e3779f9ULL;

}  // namespace

BlockHash hash_block_tokens(BlockHash parent, std::span<const TokenId> tokens) {
  uint64_t h = fold_mul(parent ^ kMulA, kMulB ^ static_cast<uint64_t>(tokens.size()));
  size_t i = 0;
  for (; i + 1 < tokens.size(); i += 2) {
    const uint64_t word = static_cast<uint32_t>(tokens[i]) |
                          (static_cast<uint64_t>(static_cast<uint32_t>(tokens[i + 1])) << 32);
    h = fold_mul(h ^ word ^ kMulC, kMulB) + kMulA;
  }
  if (i < tokens.size()) {
    h = fold_mul(h ^ static_cast<uint32_t>(tokens[i]) ^ kMulC, kMulA) + kMulB;
  }
  return mix64(h);
}

}  // namespace pagellm
