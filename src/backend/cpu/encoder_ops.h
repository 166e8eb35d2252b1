// The CPU backend's encoder ops (BERT): LayerNorm with a bias, and a plain
// activation of each value. Scalar loops: they run once or twice a layer
// over the residual stream, small next to the layer's matmuls.
#pragma once

#include <cstdint>

#include "backend/backend.h"

namespace pagellm::cpu {

// y[r] = (x[r] - mean) / sqrt(var + eps) * w + b over n_rows rows of dim
// values (population variance, as torch's LayerNorm); w and b may be null;
// y may be x.
void layer_norm_rows(const float* x, const float* w, const float* b, int64_t n_rows, int64_t dim, float eps, float* y);
// out[i] = act(x[i]) for Silu, GeluTanh, GeluErf, Sigmoid; out may be x.
void activate(const float* x, int64_t n, Activation act, float* out);

}  // namespace pagellm::cpu
