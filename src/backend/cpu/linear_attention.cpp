#include "backend/cpu/linear_attention.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace pagellm::cpu {

namespace {

float silu(float x) { return x / (1.0f + std::exp(-x)); }

// torch.nn.functional.softplus (beta 1, threshold 20), as transformers computes g.
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// dst = x / sqrt(sum x^2 + 1e-6) * scale (transformers' l2norm, eps inside the root).
void l2_normalize(const float* x, int n, float scale, float* dst) {
  float ss = 0.0f;
  for (int i = 0; i < n; ++i) ss += x[i] * x[i];
  const float inv = scale / std::sqrt(ss + 1e-6f);
  for (int i = 0; i < n; ++i) dst[i] = x[i] * inv;
}

constexpr int kMaxHeadDim = 512;

}  // namespace

void causal_conv1d_seq(const float* x, int64_t n_tokens, int64_t dim, const float* w, int K, const float* bias,
                       int64_t c0, int64_t c1, float* state, float* out) {
  const int hist = K - 1;
  for (int64_t t = 0; t < n_tokens; ++t) {
    float* o = out + t * dim;
    for (int64_t c = c0; c < c1; ++c) o[c] = bias ? bias[c] : 0.0f;
    for (int j = 0; j < K; ++j) {
      const int64_t i = t - hist + j;  // input row; < 0 reads the state
      const float* in = i < 0 ? state + (hist + i) * dim : x + i * dim;
      for (int64_t c = c0; c < c1; ++c) o[c] += w[c * K + j] * in[c];
    }
    for (int64_t c = c0; c < c1; ++c) o[c] = silu(o[c]);
  }
  // The new state: the last `hist` rows of [state; x]. Row r reads row r + n
  // of the old state (later, not yet overwritten) or an input row.
  for (int r = 0; r < hist; ++r) {
    const int64_t i = n_tokens - hist + r;
    const float* src = i < 0 ? state + (hist + i) * dim : x + i * dim;
    float* dst = state + static_cast<int64_t>(r) * dim;
    if (src != dst) std::copy(src + c0, src + c1, dst + c0);
  }
}

void gated_delta_rule_head(const float* qkv, const float* a, const float* b, int64_t n_tokens,
                           const GatedDeltaConfig& cfg, int h, float ssm_a, float dt_bias, float* S, float* out) {
  const int dk = cfg.head_k_dim, dv = cfg.head_v_dim;
  PAGELLM_CHECK(dk <= kMaxHeadDim && dv <= kMaxHeadDim, "gated delta rule: head dims {}/{} over {}", dk, dv,
                kMaxHeadDim);
  const int kh = cfg.key_head(h);
  const int64_t stride = cfg.qkv_dim();
  const int64_t k_off = static_cast<int64_t>(cfg.n_k_heads) * dk + static_cast<int64_t>(kh) * dk;
  const int64_t v_off = 2 * static_cast<int64_t>(cfg.n_k_heads) * dk + static_cast<int64_t>(h) * dv;
  float q[kMaxHeadDim], k[kMaxHeadDim], delta[kMaxHeadDim];
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* row = qkv + t * stride;
    l2_normalize(row + static_cast<int64_t>(kh) * dk, dk, cfg.scale, q);
    l2_normalize(row + k_off, dk, 1.0f, k);
    const float* v = row + v_off;
    const float decay = std::exp(ssm_a * softplus(a[t * cfg.n_v_heads + h] + dt_bias));
    const float beta = 1.0f / (1.0f + std::exp(-b[t * cfg.n_v_heads + h]));
    // k^T S of the decayed state, then the correction it needs to recall v.
    std::fill(delta, delta + dv, 0.0f);
    for (int i = 0; i < dk; ++i) {
      const float* s = S + static_cast<int64_t>(i) * dv;
      const float ki = k[i];
      for (int j = 0; j < dv; ++j) delta[j] += ki * s[j];
    }
    for (int j = 0; j < dv; ++j) delta[j] = (v[j] - decay * delta[j]) * beta;
    // S = decay S + k delta^T, and out = q^T S in the same pass.
    float* o = out + t * static_cast<int64_t>(cfg.n_v_heads) * dv + static_cast<int64_t>(h) * dv;
    std::fill(o, o + dv, 0.0f);
    for (int i = 0; i < dk; ++i) {
      float* s = S + static_cast<int64_t>(i) * dv;
      const float ki = k[i], qi = q[i];
      for (int j = 0; j < dv; ++j) {
        s[j] = decay * s[j] + ki * delta[j];
        o[j] += qi * s[j];
      }
    }
  }
}

}  // namespace pagellm::cpu
