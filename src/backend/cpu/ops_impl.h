// Kernel bodies shared by ops_scalar.cpp and ops_avx2.cpp. Included once per
// ISA inside a distinct namespace (OPS_NS), so no symbol is shared between the
// two compilations. Plain loops with `omp simd` reductions: the compiler
// vectorises them for the ISA of the including file. No STL here (ODR safety).
#include <bit>
#include <cmath>
#include <cstdint>

#include "backend/cpu/ops.h"

#if defined(OPS_AVX2)
#include <immintrin.h>
#endif

namespace pagellm::cpu::OPS_NS {

using half_t = _Float16;

static void rms_norm(const float* x, const float* w, int64_t n_rows, int64_t dim, float eps, float* y) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < dim; ++i) ss += xr[i] * xr[i];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(dim) + eps);
    if (w) {
#pragma omp simd
      for (int64_t i = 0; i < dim; ++i) yr[i] = xr[i] * inv * w[i];
    } else {
#pragma omp simd
      for (int64_t i = 0; i < dim; ++i) yr[i] = xr[i] * inv;
    }
  }
}

static void rope(float* x, int64_t n_tokens, int n_heads, int head_dim, int n_rot, bool neox, const float* cos_sin) {
  const int half = n_rot / 2;
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* cs = cos_sin + t * half * 2;
    for (int h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * head_dim;
      if (neox) {
        for (int i = 0; i < half; ++i) {
          const float c = cs[2 * i], s = cs[2 * i + 1];
          const float a = v[i], b = v[i + half];
          v[i] = a * c - b * s;
          v[i + half] = a * s + b * c;
        }
      } else {
        for (int i = 0; i < half; ++i) {
          const float c = cs[2 * i], s = cs[2 * i + 1];
          const float a = v[2 * i], b = v[2 * i + 1];
          v[2 * i] = a * c - b * s;
          v[2 * i + 1] = a * s + b * c;
        }
      }
    }
  }
}

static void glu(const float* gate, const float* up, int64_t n, int act, float* out) {
  if (act == 0) {
    for (int64_t i = 0; i < n; ++i) {
      const float g = gate[i];
      out[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
  } else {
    const uint16_t* table = gelu_table();
    for (int64_t i = 0; i < n; ++i) {
      const float g = gate[i];
      float a;
      if (g <= -10.0f) a = 0.0f;
      else if (g >= 10.0f) a = g;
      else a = static_cast<float>(std::bit_cast<half_t>(table[std::bit_cast<uint16_t>(static_cast<half_t>(g))]));
      out[i] = a * up[i];
    }
  }
}

static void add(float* y, const float* x, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

static void add_rows(float* y, const float* b, int64_t n_rows, int64_t dim) {
  for (int64_t r = 0; r < n_rows; ++r) add(y + r * dim, b, dim);
}

#if defined(OPS_AVX2)
// Explicit AVX2: eight lanes of FMA, F16C for half caches. Head sizes are
// multiples of 8 in every model we load; a scalar tail covers the rest.
static inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
static inline __m256 load8(const half_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
static inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
template <typename T>
static inline float dot_q(const float* q, const T* k, int n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_fmadd_ps(load8(q + i), load8(k + i), a0);
    a1 = _mm256_fmadd_ps(load8(q + i + 8), load8(k + i + 8), a1);
  }
  for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(load8(q + i), load8(k + i), a0);
  float s = hsum8(_mm256_add_ps(a0, a1));
  for (; i < n; ++i) s += q[i] * static_cast<float>(k[i]);
  return s;
}
template <typename T>
static inline void scale_add(float* acc, float corr, float p, const T* v, int n) {
  const __m256 vc = _mm256_set1_ps(corr), vp = _mm256_set1_ps(p);
  int i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(vp, load8(v + i), _mm256_mul_ps(_mm256_loadu_ps(acc + i), vc)));
  for (; i < n; ++i) acc[i] = acc[i] * corr + p * static_cast<float>(v[i]);
}
#else
template <typename T>
static inline float dot_q(const float* q, const T* k, int n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int i = 0; i < n; ++i) s += q[i] * static_cast<float>(k[i]);
  return s;
}

template <typename T>
static inline void scale_add(float* acc, float corr, float p, const T* v, int n) {
#pragma omp simd
  for (int i = 0; i < n; ++i) acc[i] = acc[i] * corr + p * static_cast<float>(v[i]);
}
#endif

static float dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  int64_t i = 0;
  for (; i + 1024 <= n; i += 1024) s += dot_q(a + i, b + i, 1024);
  return s + dot_q(a + i, b + i, static_cast<int>(n - i));
}

// Online softmax over the key range, one cache block at a time: scores of a
// block first, then one rescale of the accumulators per block, not per key.
template <typename T>
static void attend_t(const float* q, int group, const AttnKV& kv, int g, int64_t j0, int64_t j1, float scale,
                     float softcap, AttnPartial out) {
  const int D = kv.head_dim, B = kv.block_size;
  const T* kc = static_cast<const T*>(kv.k);
  const T* vc = static_cast<const T*>(kv.v);
  for (int h = 0; h < group; ++h) {
    out.m[h] = -INFINITY;
    out.l[h] = 0.0f;
    for (int i = 0; i < D; ++i) out.acc[h * D + i] = 0.0f;
  }
  float scores[64 * 8];  // [group <= 8 per pass][block_size <= 64]
  int64_t j = j0;
  while (j < j1) {
    const int64_t blk = j / B;
    const int off0 = static_cast<int>(j % B);
    const int cnt = static_cast<int>((j1 - j) < (B - off0) ? (j1 - j) : (B - off0));
    const int64_t base = (static_cast<int64_t>(kv.block_table[blk]) * kv.n_kv_heads + g) * B;
    const T* kb = kc + (base + off0) * D;
    const T* vb = vc + (base + off0) * D;
    for (int h0 = 0; h0 < group; h0 += 8) {
      const int hn = (group - h0) < 8 ? (group - h0) : 8;
      for (int t = 0; t < cnt; ++t) {
        for (int h = 0; h < hn; ++h) {
          float s = dot_q(q + (h0 + h) * D, kb + static_cast<int64_t>(t) * D, D) * scale;
          if (softcap > 0.0f) s = softcap * std::tanh(s / softcap);
          scores[h * 64 + t] = s;
        }
      }
      for (int h = 0; h < hn; ++h) {
        const int hh = h0 + h;
        float mx = out.m[hh];
        for (int t = 0; t < cnt; ++t) mx = scores[h * 64 + t] > mx ? scores[h * 64 + t] : mx;
        const float corr = std::exp(out.m[hh] - mx);  // exp(-inf) = 0 on the first block
        float* acc = out.acc + hh * D;
        float l = out.l[hh] * corr;
        for (int t = 0; t < cnt; ++t) {
          const float p = std::exp(scores[h * 64 + t] - mx);
          l += p;
          scale_add(acc, t == 0 ? corr : 1.0f, p, vb + static_cast<int64_t>(t) * D, D);
        }
        out.l[hh] = l;
        out.m[hh] = mx;
      }
    }
    j += cnt;
  }
}

static void attend(const float* q, int group, const AttnKV& kv, int g, int64_t j0, int64_t j1, float scale,
                   float softcap, AttnPartial out) {
  if (kv.f16)
    attend_t<half_t>(q, group, kv, g, j0, j1, scale, softcap, out);
  else
    attend_t<float>(q, group, kv, g, j0, j1, scale, softcap, out);
}

static void store_kv(void* k_cache, void* v_cache, bool f16, int n_kv_heads, int block_size, int head_dim,
                     int64_t slot, const float* k, const float* v) {
  const int64_t blk = slot / block_size, off = slot % block_size;
  for (int g = 0; g < n_kv_heads; ++g) {
    const int64_t at = ((blk * n_kv_heads + g) * block_size + off) * head_dim;
    const float* ks = k + g * head_dim;
    const float* vs = v + g * head_dim;
    if (f16) {
      half_t* kd = static_cast<half_t*>(k_cache) + at;
      half_t* vd = static_cast<half_t*>(v_cache) + at;
#pragma omp simd
      for (int i = 0; i < head_dim; ++i) {
        kd[i] = static_cast<half_t>(ks[i]);
        vd[i] = static_cast<half_t>(vs[i]);
      }
    } else {
      float* kd = static_cast<float*>(k_cache) + at;
      float* vd = static_cast<float*>(v_cache) + at;
      for (int i = 0; i < head_dim; ++i) {
        kd[i] = ks[i];
        vd[i] = vs[i];
      }
    }
  }
}

static const OpsTable kTable = {rms_norm, rope, glu, add, dot, add_rows, attend, store_kv};

}  // namespace pagellm::cpu::OPS_NS
