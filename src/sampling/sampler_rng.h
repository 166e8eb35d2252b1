// Per-sequence random numbers for sampling: xoshiro256** seeded through
// splitmix64 (both by Blackman and Vigna). Written out here rather than taken
// from <random> so that a request with a seed draws the same numbers on every
// platform and standard library.
#pragma once

#include <cstdint>

namespace pagellm {

struct SamplingParams;

// splitmix64: advances `state` and returns the next output.
inline uint64_t splitmix64_next(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

class SamplerRng {
 public:
  // `stream` separates the n parallel samples of one seeded request: same
  // (seed, stream) -> same numbers; different streams are independent.
  explicit SamplerRng(uint64_t seed = 0, uint64_t stream = 0);

  // Seeded from params.seed (reproducible) when set, else from the OS entropy source.
  static SamplerRng for_request(const SamplingParams& params, uint64_t stream = 0);
  static SamplerRng from_entropy();

  uint64_t next_u64() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, 1) with 53 random bits: every value is k * 2^-53.
  double next_double() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
  // Uniform in [0, 1) with 24 random bits.
  float next_float() { return static_cast<float>(next_u64() >> 40) * 0x1.0p-24f; }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace pagellm
