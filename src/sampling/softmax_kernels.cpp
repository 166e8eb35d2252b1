#include "sampling/softmax_kernels.h"

#include <algorithm>
#include <limits>

#include "sampling/fast_exp.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace pagellm {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kMasked = -100.0f;  // exp_nonpositive() input giving exactly 0

bool is_finite(float x) { return std::abs(x) <= std::numeric_limits<float>::max(); }

#if defined(__SSE2__)
// Same operations, in the same order, as exp_nonpositive().
inline __m128 exp_nonpositive4(__m128 x) {
  const __m128 min = _mm_set1_ps(-87.0f);
  const __m128 round = _mm_set1_ps(12582912.0f);
  const __m128 underflow = _mm_cmplt_ps(x, min);
  x = _mm_max_ps(x, min);
  const __m128 n = _mm_sub_ps(_mm_add_ps(_mm_mul_ps(x, _mm_set1_ps(1.44269504088896341f)), round), round);
  const __m128 r = _mm_sub_ps(_mm_sub_ps(x, _mm_mul_ps(n, _mm_set1_ps(0.693359375f))),
                              _mm_mul_ps(n, _mm_set1_ps(-2.12194440e-4f)));
  __m128 p = _mm_set1_ps(1.0f / 5040.0f);
  p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.0f / 720.0f));
  p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.0f / 120.0f));
  p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.0f / 24.0f));
  p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.0f / 6.0f));
  p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(0.5f));
  p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.0f));
  p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.0f));
  const __m128i e = _mm_add_epi32(_mm_cvttps_epi32(n), _mm_set1_epi32(127));
  const __m128 scale = _mm_castsi128_ps(_mm_slli_epi32(e, 23));
  return _mm_andnot_ps(underflow, _mm_mul_ps(p, scale));
}

// Lanes where x is finite (|x| <= FLT_MAX; false for NaN).
inline __m128 finite_mask4(__m128 x) {
  const __m128 abs = _mm_and_ps(x, _mm_castsi128_ps(_mm_set1_epi32(0x7FFFFFFF)));
  return _mm_cmple_ps(abs, _mm_set1_ps(std::numeric_limits<float>::max()));
}

inline float lanes_sum(__m128 v) {
  alignas(16) float lane[4];
  _mm_store_ps(lane, v);
  return (lane[0] + lane[1]) + (lane[2] + lane[3]);
}
#endif

}  // namespace

FiniteMax finite_max(const float* x, int32_t n) {
  FiniteMax result{kNegInf, 0};
  int32_t i = 0;
#if defined(__SSE2__)
  __m128 max4 = _mm_set1_ps(kNegInf);
  __m128i count4 = _mm_setzero_si128();
  for (; i + 4 <= n; i += 4) {
    const __m128 v = _mm_loadu_ps(x + i);
    const __m128 finite = finite_mask4(v);
    max4 = _mm_max_ps(max4, _mm_or_ps(_mm_and_ps(finite, v), _mm_andnot_ps(finite, _mm_set1_ps(kNegInf))));
    count4 = _mm_sub_epi32(count4, _mm_castps_si128(finite));  // a true lane is -1
  }
  alignas(16) float lane_max[4];
  alignas(16) int32_t lane_count[4];
  _mm_store_ps(lane_max, max4);
  _mm_store_si128(reinterpret_cast<__m128i*>(lane_count), count4);
  for (int j = 0; j < 4; ++j) {
    result.max = std::max(result.max, lane_max[j]);
    result.count += static_cast<uint32_t>(lane_count[j]);
  }
#endif
  for (; i < n; ++i) {
    if (!is_finite(x[i])) continue;
    result.max = std::max(result.max, x[i]);
    ++result.count;
  }
  return result;
}

float block_sum(const float* w, size_t n) {
  size_t i = 0;
  float lane[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#if defined(__SSE2__)
  __m128 sum4 = _mm_setzero_ps();
  for (; i + 4 <= n; i += 4) sum4 = _mm_add_ps(sum4, _mm_loadu_ps(w + i));
  _mm_storeu_ps(lane, sum4);
#endif
  for (; i < n; ++i) lane[i % 4] += w[i];
  return (lane[0] + lane[1]) + (lane[2] + lane[3]);
}

double sum_weights(const float* w, size_t n) {
  double total = 0.0;
  for (size_t start = 0; start < n; start += kSumBlock) total += block_sum(w + start, std::min(kSumBlock, n - start));
  return total;
}

double exp_weights(const float* x, int32_t n, float max, float scale, float threshold, float* w) {
  double total = 0.0;
  for (int32_t start = 0; start < n; start += static_cast<int32_t>(kSumBlock)) {
    const int32_t end = std::min(n, start + static_cast<int32_t>(kSumBlock));
    int32_t i = start;
    float lane[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#if defined(__SSE2__)
    const __m128 max4 = _mm_set1_ps(max), scale4 = _mm_set1_ps(scale);
    const __m128 threshold4 = _mm_set1_ps(threshold), masked = _mm_set1_ps(kMasked);
    __m128 sum4 = _mm_setzero_ps();
    for (; i + 4 <= end; i += 4) {
      const __m128 v = _mm_loadu_ps(x + i);
      const __m128 keep = _mm_and_ps(finite_mask4(v), _mm_cmpge_ps(v, threshold4));
      const __m128 arg = _mm_mul_ps(_mm_sub_ps(v, max4), scale4);
      const __m128 wi = exp_nonpositive4(_mm_or_ps(_mm_and_ps(keep, arg), _mm_andnot_ps(keep, masked)));
      if (w) _mm_storeu_ps(w + i, wi);
      sum4 = _mm_add_ps(sum4, wi);
    }
    _mm_storeu_ps(lane, sum4);
#endif
    for (; i < end; ++i) {
      const bool keep = is_finite(x[i]) && x[i] >= threshold;
      const float wi = exp_nonpositive(keep ? (x[i] - max) * scale : kMasked);
      if (w) w[i] = wi;
      lane[(i - start) % 4] += wi;
    }
    total += (lane[0] + lane[1]) + (lane[2] + lane[3]);
  }
  return total;
}

}  // namespace pagellm
