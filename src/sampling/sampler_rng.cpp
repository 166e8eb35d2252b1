#include "sampling/sampler_rng.h"

#include <chrono>
#include <random>

#include "sampling/sampling_params.h"

namespace pagellm {

SamplerRng::SamplerRng(uint64_t seed, uint64_t stream) {
  uint64_t state = seed;
  if (stream != 0) {
    uint64_t mix = stream;
    state ^= splitmix64_next(mix);
  }
  for (uint64_t& word : s_) word = splitmix64_next(state);
}

SamplerRng SamplerRng::for_request(const SamplingParams& params, uint64_t stream) {
  if (params.seed) return SamplerRng(*params.seed, stream);
  return from_entropy();
}

SamplerRng SamplerRng::from_entropy() {
  uint64_t seed = 0;
  try {
    std::random_device device;
    seed = (uint64_t{device()} << 32) ^ device();
  } catch (const std::exception&) {
    // No entropy device: the clock still makes runs differ.
  }
  seed ^= static_cast<uint64_t>(std::chrono::high_resolution_clock::now().time_since_epoch().count());
  return SamplerRng(seed);
}

}  // namespace pagellm
