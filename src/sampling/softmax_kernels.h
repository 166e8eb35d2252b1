// Whole-vocabulary loops of the sampler: SSE2 (baseline x86-64) with a scalar
// twin elsewhere. Both give bit-identical results, so seeded sampling does not
// depend on the path taken.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pagellm {

struct FiniteMax {
  float max;     // largest finite value; -inf when there is none
  size_t count;  // number of finite values
};

// Over x[n]; NaN and +-inf are skipped.
FiniteMax finite_max(const float* x, int32_t n);

// w[i] = exp_nonpositive((x[i] - max) * scale) where x[i] is finite and
// >= threshold, else 0. `max` must be >= every such x[i] and scale > 0.
// Returns sum_weights(w, n). With w == nullptr only the sum is computed.
double exp_weights(const float* x, int32_t n, float max, float scale, float threshold, float* w);

// Sum of w[n] in a fixed order: blocks of kSumBlock values, each summed in 4
// float lanes (element i in lane i % 4), the lanes added as (0+1)+(2+3), the
// block sums added in double.
inline constexpr size_t kSumBlock = 256;
double sum_weights(const float* w, size_t n);
float block_sum(const float* w, size_t n);  // one block (n <= kSumBlock), same order

}  // namespace pagellm
