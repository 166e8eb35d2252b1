#include "backend/cpu/encoder_ops.h"

#include <cmath>

#include "core/error.h"

namespace pagellm::cpu {

void layer_norm_rows(const float* x, const float* w, const float* b, int64_t n_rows, int64_t dim, float eps, float* y) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    // Two passes in double: the mean first, then the spread around it (no
    // cancellation when the mean is large next to the spread).
    double sum = 0;
    for (int64_t i = 0; i < dim; ++i) sum += xr[i];
    const double mean = sum / static_cast<double>(dim);
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) {
      const double d = xr[i] - mean;
      ss += d * d;
    }
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(dim) + eps));
    const float m = static_cast<float>(mean);
    for (int64_t i = 0; i < dim; ++i) {
      float v = (xr[i] - m) * inv;
      if (w) v *= w[i];
      if (b) v += b[i];
      yr[i] = v;
    }
  }
}

void activate(const float* x, int64_t n, Activation act, float* out) {
  constexpr float kInvSqrt2 = 0.70710678118654752f, kSqrt2OverPi = 0.7978845608028654f;
  switch (act) {
    case Activation::GeluErf:
      for (int64_t i = 0; i < n; ++i) out[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * kInvSqrt2));
      return;
    case Activation::GeluTanh:
      for (int64_t i = 0; i < n; ++i) {
        const float v = x[i];
        out[i] = 0.5f * v * (1.0f + std::tanh(kSqrt2OverPi * (v + 0.044715f * v * v * v)));
      }
      return;
    case Activation::Silu:
      for (int64_t i = 0; i < n; ++i) out[i] = x[i] / (1.0f + std::exp(-x[i]));
      return;
    case Activation::Sigmoid:
      for (int64_t i = 0; i < n; ++i) out[i] = 1.0f / (1.0f + std::exp(-x[i]));
      return;
    case Activation::SwigluOai: break;
  }
  fail("activation: {} is a gated activation (glu), not a plain one", static_cast<int>(act));
}

}  // namespace pagellm::cpu
