// Small helpers shared across modules.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace pagellm {

// "2GiB", "512MB", "1.5G", "1000000" -> bytes. Throws Error on bad input.
int64_t parse_byte_size(std::string_view text);
std::string format_bytes(int64_t bytes);

// True when `s` is valid UTF-8 (no overlongs, no surrogates, <= U+10FFFF).
bool is_valid_utf8(std::string_view s);
// Length of a UTF-8 prefix of s that ends on a code point boundary: the
// trailing bytes of an unfinished sequence are left out.
size_t utf8_complete_prefix(std::string_view s);

// MurmurHash3's 64-bit finalizer: every input bit flips each output bit with
// probability ~1/2 (hash tables, block hashes).
inline uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

// 64x64 -> 128-bit multiply folded to 64 bits (low ^ high): the high half
// carries the mixing (block hashes, tier keys, checksums).
inline uint64_t fold_mul(uint64_t a, uint64_t b) {
  const unsigned __int128 p = static_cast<unsigned __int128>(a) * b;
  return static_cast<uint64_t>(p) ^ static_cast<uint64_t>(p >> 64);
}

// Environment variable, or `fallback` when unset/empty.
std::string env_or(const char* name, const std::string& fallback);

}  // namespace pagellm
