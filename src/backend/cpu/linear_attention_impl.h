// The gated delta rule's per-head kernel, compiled once per ISA (as
// ops_impl.h is): linear_attention.cpp (baseline), *_avx2.cpp (AVX2 + FMA)
// and *_avx512.cpp, each in its own namespace LA_NS. Plain loops over the
// value dimension, which the compiler vectorises for the including file's
// ISA; nothing inline from other headers (one ISA's copy of a shared inline
// function could be linked into another's callers), hence __builtin_ maths.
#include <cstdint>

#include "backend/cpu/linear_attention.h"

namespace pagellm::cpu::LA_NS {

// torch.nn.functional.softplus (beta 1, threshold 20), as transformers computes g.
static inline float softplus(float x) { return x > 20.0f ? x : __builtin_log1pf(__builtin_expf(x)); }

// dst = x / sqrt(sum x^2 + 1e-6) * scale (transformers' l2norm, eps inside the root).
static inline void l2_normalize(const float* x, int n, float scale, float* dst) {
  float ss = 0.0f;
  for (int i = 0; i < n; ++i) ss += x[i] * x[i];
  const float inv = scale / __builtin_sqrtf(ss + 1e-6f);
  for (int i = 0; i < n; ++i) dst[i] = x[i] * inv;
}

static void delta_rule_head(const DeltaHeadArgs& p) {
  const int dk = p.head_k_dim, dv = p.head_v_dim;
  float q[kMaxDeltaHeadDim], k[kMaxDeltaHeadDim], delta[kMaxDeltaHeadDim];
  float* __restrict S = p.state;
  for (int64_t t = 0; t < p.n_tokens; ++t) {
    l2_normalize(p.q + t * p.qkv_stride, dk, p.scale, q);
    l2_normalize(p.k + t * p.qkv_stride, dk, 1.0f, k);
    const float* __restrict v = p.v + t * p.qkv_stride;
    const float decay = __builtin_expf(p.ssm_a * softplus(p.a[t * p.ab_stride] + p.dt_bias));
    const float beta = 1.0f / (1.0f + __builtin_expf(-p.b[t * p.ab_stride]));
    // k^T S of the decayed state, then the correction it needs to recall v.
    for (int j = 0; j < dv; ++j) delta[j] = 0.0f;
    for (int i = 0; i < dk; ++i) {
      const float* __restrict s = S + static_cast<int64_t>(i) * dv;
      const float ki = k[i];
      for (int j = 0; j < dv; ++j) delta[j] += ki * s[j];
    }
    for (int j = 0; j < dv; ++j) delta[j] = (v[j] - decay * delta[j]) * beta;
    // S = decay S + k delta^T, and out = q^T S in the same pass.
    float* __restrict o = p.out + t * p.out_stride;
    for (int j = 0; j < dv; ++j) o[j] = 0.0f;
    for (int i = 0; i < dk; ++i) {
      float* __restrict s = S + static_cast<int64_t>(i) * dv;
      const float ki = k[i], qi = q[i];
      for (int j = 0; j < dv; ++j) {
        s[j] = decay * s[j] + ki * delta[j];
        o[j] += qi * s[j];
      }
    }
  }
}

}  // namespace pagellm::cpu::LA_NS
