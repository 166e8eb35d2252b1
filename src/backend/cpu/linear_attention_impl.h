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

static void delta_rule_recurrent(const DeltaHeadArgs& p) {
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

#if defined(__AVX512F__)
// The chunked form is built for AVX-512 only: measured there, it beats the
// recurrence (docs/performance.md §18); GCC's generic vectors below, lowered
// for AVX2 or SSE2, ran it 25x slower.

// 32 columns as two 16-float vectors (GCC's generic vectors: a zmm each).
typedef float Vec16 __attribute__((vector_size(64)));
struct Cols32 {
  Vec16 lo, hi;
};
static inline Cols32 load32(const float* p) {
  Cols32 c;
  __builtin_memcpy(&c.lo, p, sizeof(Vec16));
  __builtin_memcpy(&c.hi, p + 16, sizeof(Vec16));
  return c;
}
static inline void store32(float* p, const Cols32& c) {
  __builtin_memcpy(p, &c.lo, sizeof(Vec16));
  __builtin_memcpy(p + 16, &c.hi, sizeof(Vec16));
}
static inline void fma32(Cols32& acc, float w, const float* p) {
  const Cols32 x = load32(p);
  acc.lo += w * x.lo;
  acc.hi += w * x.hi;
}

// out[r][:] = sum_i m[r][i] S[i][:] for rows r < n (m rows of dk, S [dk, dv],
// out rows of dv; dv a multiple of 32), a row r stopping at its own end
// row_cols(r) rounded up to the block. Four rows at a time per 64 columns
// (16 accumulators of the 32 registers): a column block of S is read once
// per four rows.
constexpr int kWideGroups = 2;
template <int NG>
struct ColBlock {
  Cols32 c[NG];
};
template <int NG>
static inline void fma_block(ColBlock<NG>& acc, float w, const float* p) {
  for (int k = 0; k < NG; ++k) fma32(acc.c[k], w, p + 32 * k);
}
template <int NG>
static inline void store_block(float* p, const ColBlock<NG>& b) {
  for (int k = 0; k < NG; ++k) store32(p + 32 * k, b.c[k]);
}

// Columns [jb, jb + 32 NG) of every row that reaches them.
template <int NG, class RowEnd>
static void rows_times_state_block(const float* __restrict m, int n, const float* __restrict S, int dk, int dv,
                                   int jb, float* __restrict out, RowEnd row_cols) {
  int r = 0;
  for (; r + 4 <= n; r += 4) {
    if (row_cols(r + 3) <= jb) continue;
    ColBlock<NG> a0{}, a1{}, a2{}, a3{};
    const float *m0 = m + static_cast<int64_t>(r) * dk, *m1 = m0 + dk, *m2 = m1 + dk, *m3 = m2 + dk;
    for (int i = 0; i < dk; ++i) {
      const float* s = S + static_cast<int64_t>(i) * dv + jb;
      fma_block(a0, m0[i], s);
      fma_block(a1, m1[i], s);
      fma_block(a2, m2[i], s);
      fma_block(a3, m3[i], s);
    }
    float* o = out + static_cast<int64_t>(r) * dv + jb;
    store_block(o, a0);
    store_block(o + dv, a1);
    store_block(o + 2 * dv, a2);
    store_block(o + 3 * dv, a3);
  }
  for (; r < n; ++r) {
    if (row_cols(r) <= jb) continue;
    ColBlock<NG> a{};
    const float* mr = m + static_cast<int64_t>(r) * dk;
    for (int i = 0; i < dk; ++i) fma_block(a, mr[i], S + static_cast<int64_t>(i) * dv + jb);
    store_block(out + static_cast<int64_t>(r) * dv + jb, a);
  }
}

template <class RowEnd>
static void rows_times_state(const float* __restrict m, int n, const float* __restrict S, int dk, int dv,
                             float* __restrict out, RowEnd row_cols) {
  int jb = 0;
  for (; jb + 32 * kWideGroups <= dv; jb += 32 * kWideGroups)
    rows_times_state_block<kWideGroups>(m, n, S, dk, dv, jb, out, row_cols);
  for (; jb < dv; jb += 32) rows_times_state_block<1>(m, n, S, dk, dv, jb, out, row_cols);
}

// The chunked form (prefill): kDeltaChunk tokens at a time, as the gated
// delta rule's chunkwise algorithm (Yang et al., "Gated Delta Networks")
// has it. With D_ts = e^{G_t - G_s} the decay from token s to t (G the
// chunk's cumulative log decay) and S0 the state before the chunk, the
// corrections u_t (delta above) solve
//   u_t = beta_t (v_t - D_t0' S0^T k_t - sum_{s<t} D_ts (k_t . k_s) u_s),
// with D_t0' = e^{G_t}; then o_t = e^{G_t} S0^T q_t + sum_{s<=t} D_ts (q_t . k_s) u_s
// and S = e^{G_L} S0 + sum_s D_Ls k_s u_s^T. The state is read twice and
// written once per chunk instead of per token, and the products are blocked.
// Needs dv a multiple of 32 and the scratch DeltaHeadArgs describes.
static void delta_rule_chunked(const DeltaHeadArgs& p) {
  constexpr int C = kDeltaChunk;
  const int dk = p.head_k_dim, dv = p.head_v_dim;
  float* __restrict S = p.state;
  float* __restrict K = p.scratch;         // [C, dk] normalised keys
  float* __restrict Q = K + C * dk;        // [C, dk] normalised, scaled queries
  float* __restrict Kt = Q + C * dk;       // [dk, C] the keys transposed (columns past the chunk: 0)
  float* __restrict U = Kt + dk * C;       // [C, dv] S0^T k_t, then u_t
  float* __restrict R = U + C * dv;        // [C, dv] S0^T q_t
  float* __restrict Akk = R + C * dv;      // [C, C] k_t . k_s
  float* __restrict Aqk = Akk + C * C;     // [C, C] q_t . k_s
  float G[C], alpha[C], beta[C], D[C], w[C];
  for (int64_t c0 = 0; c0 < p.n_tokens; c0 += C) {
    const int L = static_cast<int>(p.n_tokens - c0 < C ? p.n_tokens - c0 : C);
    float g = 0.0f;
    for (int t = 0; t < L; ++t) {
      const int64_t row = (c0 + t) * p.qkv_stride;
      l2_normalize(p.q + row, dk, p.scale, Q + t * dk);
      l2_normalize(p.k + row, dk, 1.0f, K + t * dk);
      const float la = p.ssm_a * softplus(p.a[(c0 + t) * p.ab_stride] + p.dt_bias);
      g += la;
      G[t] = g;
      alpha[t] = __builtin_expf(la);
      beta[t] = 1.0f / (1.0f + __builtin_expf(-p.b[(c0 + t) * p.ab_stride]));
    }
    for (int i = 0; i < dk; ++i)
      for (int t = 0; t < C; ++t) Kt[i * C + t] = t < L ? K[t * dk + i] : 0.0f;
    auto whole = [dv](int) { return dv; };
    auto causal = [](int t) { return t + 1; };  // the Gram matrices: columns s <= t
    rows_times_state(K, L, S, dk, dv, U, whole);
    rows_times_state(Q, L, S, dk, dv, R, whole);
    rows_times_state(K, L, Kt, dk, C, Akk, causal);
    rows_times_state(Q, L, Kt, dk, C, Aqk, causal);
    // Token by token: the decays D_ts (row t from row t - 1, flushed to 0
    // before they turn denormal), the correction u_t, which reads the
    // earlier ones, then the output o_t.
    for (int t = 0; t < L; ++t) {
      for (int s = 0; s < t; ++s) {
        const float d = D[s] * alpha[t];
        D[s] = d < 1e-30f ? 0.0f : d;
      }
      D[t] = 1.0f;
      const float* v = p.v + (c0 + t) * p.qkv_stride;
      float* u = U + t * dv;
      const float eg = __builtin_expf(G[t]);
      for (int s = 0; s < t; ++s) w[s] = D[s] * Akk[t * C + s];
      for (int jb = 0; jb < dv; jb += 32) {
        Cols32 acc = load32(v + jb);
        const Cols32 kS = load32(u + jb);
        acc.lo -= eg * kS.lo;
        acc.hi -= eg * kS.hi;
        for (int s = 0; s < t; ++s) fma32(acc, -w[s], U + s * dv + jb);
        acc.lo *= beta[t];
        acc.hi *= beta[t];
        store32(u + jb, acc);
      }
      float* o = p.out + (c0 + t) * p.out_stride;
      for (int s = 0; s <= t; ++s) w[s] = D[s] * Aqk[t * C + s];
      for (int jb = 0; jb < dv; jb += 32) {
        const Cols32 qS = load32(R + t * dv + jb);
        Cols32 acc{eg * qS.lo, eg * qS.hi};
        for (int s = 0; s <= t; ++s) fma32(acc, w[s], U + s * dv + jb);
        store32(o + jb, acc);
      }
    }
    // The state after the chunk, four of its rows at a time per 32 columns
    // (D now holds D_Ls).
    const float decay = __builtin_expf(G[L - 1]);
    for (int jb = 0; jb < dv; jb += 32) {
      for (int i = 0; i < dk; i += 4) {
        const int rows = dk - i < 4 ? dk - i : 4;
        Cols32 acc[4];
        for (int r = 0; r < rows; ++r) {
          acc[r] = load32(S + static_cast<int64_t>(i + r) * dv + jb);
          acc[r].lo *= decay;
          acc[r].hi *= decay;
        }
        for (int s = 0; s < L; ++s) {
          const float* us = U + s * dv + jb;
          for (int r = 0; r < rows; ++r) fma32(acc[r], D[s] * Kt[(i + r) * C + s], us);
        }
        for (int r = 0; r < rows; ++r) store32(S + static_cast<int64_t>(i + r) * dv + jb, acc[r]);
      }
    }
  }
}

#endif  // __AVX512F__

static void delta_rule_head(const DeltaHeadArgs& p) {
#if defined(__AVX512F__)
  if (p.scratch) return delta_rule_chunked(p);
#endif
  delta_rule_recurrent(p);
}

}  // namespace pagellm::cpu::LA_NS
