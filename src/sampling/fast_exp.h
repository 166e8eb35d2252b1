// exp() for the sampler's softmax weights, written so loops over a whole
// vocabulary vectorize (std::exp is a library call per element).
#pragma once

#include <bit>
#include <cstdint>

namespace pagellm {

// exp(x) for x <= 0 (the sampler only needs logit - max_logit), within ~2 ulp
// of the exact value. Below -87 (exp < 2e-38, where floats turn denormal) it
// returns 0. Not for NaN or +inf.
inline float exp_nonpositive(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;  // ln 2 = kLn2Hi + kLn2Lo, kLn2Hi has few bits
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f;   // 1.5 * 2^23: adding it rounds to an integer
  constexpr float kMin = -87.0f;
  const bool underflow = x < kMin;
  x = underflow ? kMin : x;
  // exp(x) = 2^n * exp(r), n = round(x / ln 2), |r| <= ln 2 / 2.
  const float n = (x * kLog2e + kRound) - kRound;
  const float r = (x - n * kLn2Hi) - n * kLn2Lo;
  // Taylor series to r^7: the first dropped term is < 6e-9 relative.
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const float scale = std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  return underflow ? 0.0f : p * scale;
}

}  // namespace pagellm
