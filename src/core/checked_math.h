// Size arithmetic on values read from files: overflow is reported, never wrapped.
#pragma once

#include <cstdint>
#include <optional>

namespace pagellm {

// a * b, or nullopt when the product does not fit.
inline std::optional<uint64_t> checked_mul(uint64_t a, uint64_t b) {
  uint64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) return std::nullopt;
  return out;
}

// a + b, or nullopt when the sum does not fit.
inline std::optional<uint64_t> checked_add(uint64_t a, uint64_t b) {
  uint64_t out = 0;
  if (__builtin_add_overflow(a, b, &out)) return std::nullopt;
  return out;
}

}  // namespace pagellm
