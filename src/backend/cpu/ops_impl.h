// Kernel bodies shared by ops_scalar.cpp and ops_avx2.cpp. Included once per
// ISA inside a distinct namespace (OPS_NS), so no symbol is shared between the
// two compilations. Plain loops with `omp simd` reductions: the compiler
// vectorises them for the ISA of the including file. No STL here (ODR safety).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "backend/cpu/ops.h"

#if defined(OPS_AVX2)
#include <immintrin.h>
#endif

namespace pagellm::cpu::OPS_NS {

#if defined(__aarch64__) && !defined(__clang__) && __GNUC__ < 13
// GCC 12 has no _Float16 in C++ on aarch64; its __fp16 (IEEE format there)
// converts the same way, rounding to nearest even.
using half_t = __fp16;
#elif defined(__FLT16_MAX__)
using half_t = _Float16;
#else
// clang < 15 has no _Float16 on x86 (the fuzz build uses clang 14): a 2-byte
// stand-in with IEEE half bits and round-to-nearest-even conversions. Local
// (static) functions, not core/fp16.h: this file is compiled once per ISA.
static inline uint32_t f32_bits(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  return u;
}
static inline float f32_from(uint32_t u) {
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
static inline uint32_t shift_rne(uint32_t v, uint32_t s) {
  const uint32_t kept = v >> s, rest = v & ((1u << s) - 1), half = 1u << (s - 1);
  return kept + ((rest > half || (rest == half && (kept & 1))) ? 1 : 0);
}
struct half_t {
  uint16_t bits;
  half_t() = default;
  explicit half_t(float f) {
    uint32_t x = f32_bits(f);
    const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    const uint32_t e = x >> 23;
    if (x >= 0x7f800000u) bits = sign | 0x7c00u | (x > 0x7f800000u ? 0x200u : 0u);  // inf / nan
    else if (x >= 0x477ff000u) bits = sign | 0x7c00u;                                // rounds to inf
    else if (e < 102) bits = sign;                                                   // rounds to zero
    else if (e < 113) bits = sign | static_cast<uint16_t>(shift_rne((x & 0x7fffffu) | 0x800000u, 126 - e));
    else bits = sign | static_cast<uint16_t>(shift_rne(((e - 112) << 23) | (x & 0x7fffffu), 13));
  }
  operator float() const {
    const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16, e = (bits >> 10) & 0x1fu, m = bits & 0x3ffu;
    if (e == 0) return f32_from(sign | f32_bits(static_cast<float>(m) * (1.0f / 16777216.0f)));
    if (e == 31) return f32_from(sign | 0x7f800000u | (m << 13));
    return f32_from(sign | ((e + 112) << 23) | (m << 13));
  }
};
#endif

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

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

static void glu(const float* gate, const float* up, int64_t n, int act, float* out);

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
static inline __m256 load8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
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

// Whether key j is visible to a query at position p.
static inline bool key_visible(int64_t j, int64_t p, int window) { return j <= p && (window <= 0 || j > p - window); }

static inline float cap_score(float s, float softcap) { return softcap > 0.0f ? softcap * std::tanh(s / softcap) : s; }

#if defined(OPS_AVX2)
// exp(x) for a vector: range reduction to r in [-ln2/2, ln2/2], a degree-6
// polynomial, then scaling by 2^n through the exponent bits. Relative error
// about 2e-7; -inf gives 0, inputs below -87 flush to 0.
static inline __m256 exp8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.3f);
  const __m256 is_tiny = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.3f)), lo);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(is_tiny, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

// 576: an MLA latent (DeepSeek's 512 + 64); 128 rows: its 128 query heads on one KV head.
constexpr int kMaxHeadDim = 576, kMaxBlock = 64, kMaxRows = 128;
// Below this many query rows per KV head, scores are direct dot products.
constexpr int kDirectScoreRows = 4;

// The 8 horizontal sums of a[0..7], in order.
static inline __m256 hsum8x8(const __m256 (&a)[8]) {
  const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
}

// One cache block of keys at a time: K is transposed into kt[d][key] so that
// 4 rows x 8 keys of scores build up in registers; V is converted to float
// once and reused by every row; each row's output accumulates in registers
// over the block, 64 dimensions at a time.
template <typename T>
static void attend_tile_t(const AttnTile& a, const AttnKV& kv, int g, AttnPartial out) {
  const int D = kv.head_dim, B = kv.block_size, G = a.group, R = a.n_tokens * a.group;
  alignas(32) float qs[kMaxRows * kMaxHeadDim];  // [R][D] scaled queries
  alignas(32) float kt[kMaxHeadDim * kMaxBlock];  // [D][B_pad] this block's keys, transposed
  alignas(32) float vb[kMaxBlock * kMaxHeadDim];  // [B][D] this block's values
  alignas(32) float sc[kMaxRows * kMaxBlock];     // [R][B_pad] scores, then weights
  for (int r = 0; r < R; ++r) {
    const float* q = a.q + (r / G) * a.q_stride + (r % G) * D;
    const __m256 vs = _mm256_set1_ps(a.scale);
    for (int d = 0; d < D; d += 8) _mm256_store_ps(qs + r * D + d, _mm256_mul_ps(_mm256_loadu_ps(q + d), vs));
    out.m[r] = -INFINITY;
    out.l[r] = 0.0f;
    for (int d = 0; d < D; ++d) out.acc[r * D + d] = 0.0f;
  }
  const T* kc = static_cast<const T*>(kv.k);
  const T* vc = static_cast<const T*>(kv.v);
  // int8 caches: scores and value weights take each key's scales once
  // (s * kscale, w * vscale), not every element.
  constexpr bool kScaled = std::is_same_v<T, int8_t>;
  for (int64_t j = a.j0; j < a.j1;) {
    const int64_t blk = j / B;
    const int off0 = static_cast<int>(j % B);
    const int cnt = static_cast<int>(min64(a.j1 - j, B - off0));
    const int cnt8 = (cnt + 7) & ~7;
    const int64_t base = (static_cast<int64_t>(kv.block_table[blk]) * kv.n_kv_heads + g) * B + off0;
    const bool direct = R < kDirectScoreRows;
    // Many rows share each value: convert the block once. Few rows read the cache directly.
    for (int k = 0; k < cnt && !direct; ++k) {
      const T* vr = vc + (base + k) * D;
      for (int d = 0; d < D; d += 8) _mm256_store_ps(vb + k * D + d, load8(vr + d));
    }
    if (direct) {
      // Few rows (decode without much GQA sharing): each key's dot product
      // straight from the cache, 8 keys' sums reduced together; transposing
      // the block would cost more than the rows' products.
      for (int r = 0; r < R; ++r)
        for (int k0 = 0; k0 < cnt8; k0 += 8) {
          __m256 acc[8];
          for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
          const int kn = static_cast<int>(min64(8, cnt - k0));
          const T* k8 = kc + (base + k0) * D;
          if (kn == 8) {  // a whole group: fixed trip counts keep acc in registers
            for (int d = 0; d < D; d += 8) {
              const __m256 qv = _mm256_load_ps(qs + r * D + d);
#pragma GCC unroll 8
              for (int i = 0; i < 8; ++i) acc[i] = _mm256_fmadd_ps(qv, load8(k8 + i * D + d), acc[i]);
            }
          } else {
            for (int d = 0; d < D; d += 8) {
              const __m256 qv = _mm256_load_ps(qs + r * D + d);
              for (int i = 0; i < kn; ++i) acc[i] = _mm256_fmadd_ps(qv, load8(k8 + i * D + d), acc[i]);
            }
          }
          _mm256_store_ps(sc + r * kMaxBlock + k0, hsum8x8(acc));
        }
    } else {
      for (int k = 0; k < cnt8; ++k) {
        if (k < cnt) {
          const T* kr = kc + (base + k) * D;
          for (int d = 0; d < D; d += 8) {
            alignas(32) float tmp[8];
            _mm256_store_ps(tmp, load8(kr + d));
            for (int i = 0; i < 8; ++i) kt[(d + i) * cnt8 + k] = tmp[i];
          }
        } else {
          for (int d = 0; d < D; ++d) kt[d * cnt8 + k] = 0.0f;
        }
      }
    }
    // Scores: 4 rows x 8 keys per register tile, summed in the direct path's
    // order: partial sums of every 8th dimension (lane l: d = l, l + 8, ...),
    // then the same tree as hsum8x8. A row's scores are then the same bits
    // whether it shares its tile (prefill, verifying speculative tokens) or
    // not (decode).
    for (int r0 = 0; r0 < R && R >= kDirectScoreRows; r0 += 4) {
      const int rn = static_cast<int>(min64(4, R - r0));
      for (int k0 = 0; k0 < cnt8; k0 += 8) {
        __m256 lane[4][8];
        const float* q0 = qs + r0 * D;
        for (int l = 0; l < 8; ++l) {
          __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
          for (int d = l; d < D; d += 8) {
            const __m256 kk = _mm256_load_ps(kt + d * cnt8 + k0);
            s0 = _mm256_fmadd_ps(_mm256_broadcast_ss(q0 + d), kk, s0);
            if (rn > 1) s1 = _mm256_fmadd_ps(_mm256_broadcast_ss(q0 + D + d), kk, s1);
            if (rn > 2) s2 = _mm256_fmadd_ps(_mm256_broadcast_ss(q0 + 2 * D + d), kk, s2);
            if (rn > 3) s3 = _mm256_fmadd_ps(_mm256_broadcast_ss(q0 + 3 * D + d), kk, s3);
          }
          lane[0][l] = s0;
          lane[1][l] = s1;
          lane[2][l] = s2;
          lane[3][l] = s3;
        }
        for (int i = 0; i < rn; ++i) {
          const __m256(&p)[8] = lane[i];
          const __m256 lo = _mm256_add_ps(_mm256_add_ps(p[0], p[1]), _mm256_add_ps(p[2], p[3]));
          const __m256 hi = _mm256_add_ps(_mm256_add_ps(p[4], p[5]), _mm256_add_ps(p[6], p[7]));
          _mm256_store_ps(sc + (r0 + i) * kMaxBlock + k0, _mm256_add_ps(lo, hi));
        }
      }
    }
    if constexpr (kScaled) {
      const float* ks = kv.k_scale + base;
      for (int r = 0; r < R; ++r)
        for (int k = 0; k < cnt; ++k) sc[r * kMaxBlock + k] *= ks[k];
    }
    // Per row: mask, online softmax update, then acc += weights x V.
    for (int r = 0; r < R; ++r) {
      float* s = sc + r * kMaxBlock;
      const int64_t p = a.pos0 + r / G;
      float mx = out.m[r];
      for (int k = 0; k < cnt8; ++k) {
        if (k >= cnt || !key_visible(j + k, p, a.window)) {
          s[k] = -INFINITY;
          continue;
        }
        s[k] = cap_score(s[k], a.softcap);
        mx = s[k] > mx ? s[k] : mx;
      }
      if (mx == -INFINITY) continue;  // nothing visible yet for this row
      const float corr = std::exp(out.m[r] - mx);
      const __m256 vmx = _mm256_set1_ps(mx);
      __m256 lsum = _mm256_setzero_ps();
      for (int k = 0; k < cnt8; k += 8) {
        const __m256 w = exp8(_mm256_sub_ps(_mm256_load_ps(s + k), vmx));
        _mm256_store_ps(s + k, w);
        lsum = _mm256_add_ps(lsum, w);
      }
      out.l[r] = out.l[r] * corr + hsum8(lsum);
      out.m[r] = mx;
      const __m256 vcorr = _mm256_set1_ps(corr);
      for (int d0 = 0; d0 < D; d0 += 64) {
        const int dn = static_cast<int>(min64(64, D - d0));
        float* acc = out.acc + r * D + d0;
        __m256 a8[8];
        for (int i = 0; i < dn / 8; ++i) a8[i] = _mm256_mul_ps(_mm256_loadu_ps(acc + 8 * i), vcorr);
        // acc += w_k * v_k over the block's keys, from the converted block or
        // straight from the cache. A masked key (weight 0) is skipped, not
        // weighted by 0: its value may hold any bits (0 x NaN is NaN). For
        // finite values the sum is the same.
        auto accumulate = [&](auto value_at, auto n8) {
          for (int k = 0; k < cnt; ++k) {
            if (s[k] == 0.0f) continue;
            const __m256 w = _mm256_set1_ps(kScaled ? s[k] * kv.v_scale[base + k] : s[k]);
            const auto* v = value_at(k);
#pragma GCC unroll 8
            for (int i = 0; i < n8(); ++i) a8[i] = _mm256_fmadd_ps(w, load8(v + 8 * i), a8[i]);
          }
        };
        const auto from_cache = [&](int k) { return vc + (base + k) * D + d0; };
        const auto from_block = [&](int k) { return static_cast<const float*>(vb + k * D + d0); };
        // Heads of 64, 128, 256: whole chunks of 64, a fixed trip count keeps a8 in registers.
        const auto full = [] { return 8; };
        const auto part = [dn] { return dn / 8; };
        if (dn == 64) {
          if (direct) accumulate(from_cache, full);
          else accumulate(from_block, full);
        } else {
          if (direct) accumulate(from_cache, part);
          else accumulate(from_block, part);
        }
        for (int i = 0; i < dn / 8; ++i) _mm256_storeu_ps(acc + 8 * i, a8[i]);
      }
    }
    j += cnt;
  }
}

static void attend(const AttnTile& a, const AttnKV& kv, int g, AttnPartial out) {
  switch (kv.elem) {
    case KVElem::F16: return attend_tile_t<half_t>(a, kv, g, out);
    case KVElem::I8: return attend_tile_t<int8_t>(a, kv, g, out);
    case KVElem::F32: return attend_tile_t<float>(a, kv, g, out);
  }
}
#else
// Portable reference: each row on its own, key by key.
template <typename T>
static void attend_rows_t(const AttnTile& a, const AttnKV& kv, int g, AttnPartial out) {
  const int D = kv.head_dim, B = kv.block_size, G = a.group, R = a.n_tokens * a.group;
  const T* kc = static_cast<const T*>(kv.k);
  const T* vc = static_cast<const T*>(kv.v);
  for (int r = 0; r < R; ++r) {
    const float* q = a.q + (r / G) * a.q_stride + (r % G) * D;
    const int64_t p = a.pos0 + r / G;
    float m = -INFINITY, l = 0.0f;
    float* acc = out.acc + r * D;
    for (int d = 0; d < D; ++d) acc[d] = 0.0f;
    for (int64_t j = a.j0; j < a.j1; ++j) {
      if (!key_visible(j, p, a.window)) continue;
      const int64_t slot = (static_cast<int64_t>(kv.block_table[j / B]) * kv.n_kv_heads + g) * B + j % B;
      const float ks = kv.k_scale ? kv.k_scale[slot] : 1.0f, vs = kv.v_scale ? kv.v_scale[slot] : 1.0f;
      const float s = cap_score(dot_q(q, kc + slot * D, D) * ks * a.scale, a.softcap);
      const float mx = s > m ? s : m;
      const float corr = std::exp(m - mx), w = std::exp(s - mx);
      l = l * corr + w;
      scale_add(acc, corr, w * vs, vc + slot * D, D);
      m = mx;
    }
    out.m[r] = m;
    out.l[r] = l;
  }
}

static void attend(const AttnTile& a, const AttnKV& kv, int g, AttnPartial out) {
  switch (kv.elem) {
    case KVElem::F16: return attend_rows_t<half_t>(a, kv, g, out);
    case KVElem::I8: return attend_rows_t<int8_t>(a, kv, g, out);
    case KVElem::F32: return attend_rows_t<float>(a, kv, g, out);
  }
}
#endif

// out = act(gate) * up. GELU is the tanh form, evaluated exactly (the AVX2
// path gets tanh from the vector exp: tanh(u) = 1 - 2 / (exp(2u) + 1)).
// Every element goes through the same arithmetic wherever it falls (the
// AVX2 path runs a tail of fewer than 8 through the vector code too), so an
// element's result does not depend on how many rows the call covers.
#if defined(OPS_AVX2)
static inline void glu8(const float* gate, const float* up, int act, float* out) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  constexpr float kOaiAlpha = 1.702f, kOaiLimit = 7.0f;  // gpt-oss's clamped SwiGLU (act 2); act 3: sigmoid(gate) * up
  const __m256 one = _mm256_set1_ps(1.0f), two = _mm256_set1_ps(2.0f), half = _mm256_set1_ps(0.5f);
  __m256 g = _mm256_loadu_ps(gate);
  __m256 a;
  if (act == 2) {
    const __m256 lim = _mm256_set1_ps(kOaiLimit);
    g = _mm256_min_ps(g, lim);
    const __m256 u = _mm256_min_ps(_mm256_max_ps(_mm256_loadu_ps(up), _mm256_sub_ps(_mm256_setzero_ps(), lim)), lim);
    a = _mm256_div_ps(g, _mm256_add_ps(one, exp8(_mm256_mul_ps(_mm256_set1_ps(-kOaiAlpha), g))));
    _mm256_storeu_ps(out, _mm256_mul_ps(a, _mm256_add_ps(u, one)));
    return;
  }
  if (act == 0) {
    a = _mm256_div_ps(g, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), g))));
  } else if (act == 3) {  // the sigmoid gate
    a = _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), g))));
  } else {
    const __m256 g3 = _mm256_mul_ps(_mm256_mul_ps(g, g), g);
    const __m256 u = _mm256_mul_ps(_mm256_set1_ps(kSqrt2OverPi), _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), g3, g));
    const __m256 t = _mm256_sub_ps(one, _mm256_div_ps(two, _mm256_add_ps(exp8(_mm256_add_ps(u, u)), one)));
    a = _mm256_mul_ps(_mm256_mul_ps(half, g), _mm256_add_ps(one, t));
  }
  _mm256_storeu_ps(out, _mm256_mul_ps(a, _mm256_loadu_ps(up)));
}

static void glu(const float* gate, const float* up, int64_t n, int act, float* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) glu8(gate + i, up + i, act, out + i);
  if (i < n) {
    alignas(32) float g[8] = {}, u[8] = {}, o[8];
    const int64_t rest = n - i;
    std::memcpy(g, gate + i, static_cast<size_t>(rest) * sizeof(float));
    std::memcpy(u, up + i, static_cast<size_t>(rest) * sizeof(float));
    glu8(g, u, act, o);
    std::memcpy(out + i, o, static_cast<size_t>(rest) * sizeof(float));
  }
}
#else
static void glu(const float* gate, const float* up, int64_t n, int act, float* out) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  constexpr float kOaiAlpha = 1.702f, kOaiLimit = 7.0f;  // gpt-oss's clamped SwiGLU (act 2)
  for (int64_t i = 0; i < n; ++i) {
    if (act == 2) {
      const float g = gate[i] < kOaiLimit ? gate[i] : kOaiLimit;
      const float u = up[i] < -kOaiLimit ? -kOaiLimit : (up[i] > kOaiLimit ? kOaiLimit : up[i]);
      out[i] = g / (1.0f + std::exp(-kOaiAlpha * g)) * (u + 1.0f);
      continue;
    }
    const float g = gate[i];
    const float a = act == 0   ? g / (1.0f + std::exp(-g))
                    : act == 3 ? 1.0f / (1.0f + std::exp(-g))
                               : 0.5f * g * (1.0f + std::tanh(kSqrt2OverPi * (g + 0.044715f * g * g * g)));
    out[i] = a * up[i];
  }
}
#endif

// One vector of an int8 cache: q = round(x * 127 / max |x|), scale max |x| / 127.
// Plain scalar code in both tables so that both write the same bytes.
static void quantize_kv_row(const float* x, int n, int8_t* q, float* scale) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  *scale = amax / 127.0f;
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  for (int i = 0; i < n; ++i) q[i] = static_cast<int8_t>(std::nearbyint(std::clamp(x[i] * inv, -127.0f, 127.0f)));
}

static void store_kv(const KVStore& c, int64_t slot, const float* k, const float* v) {
  const int64_t blk = slot / c.block_size, off = slot % c.block_size;
  const int D = c.head_dim;
  for (int g = 0; g < c.n_kv_heads; ++g) {
    const int64_t row = (blk * c.n_kv_heads + g) * c.block_size + off, at = row * D;
    const float* ks = k + g * D;
    const float* vs = v + g * D;
    switch (c.elem) {
      case KVElem::F16: {
        half_t* kd = static_cast<half_t*>(c.k) + at;
        half_t* vd = static_cast<half_t*>(c.v) + at;
#pragma omp simd
        for (int i = 0; i < D; ++i) {
          kd[i] = static_cast<half_t>(ks[i]);
          vd[i] = static_cast<half_t>(vs[i]);
        }
        break;
      }
      case KVElem::I8:
        quantize_kv_row(ks, D, static_cast<int8_t*>(c.k) + at, c.k_scale + row);
        quantize_kv_row(vs, D, static_cast<int8_t*>(c.v) + at, c.v_scale + row);
        break;
      case KVElem::F32:
        std::memcpy(static_cast<float*>(c.k) + at, ks, static_cast<size_t>(D) * sizeof(float));
        std::memcpy(static_cast<float*>(c.v) + at, vs, static_cast<size_t>(D) * sizeof(float));
        break;
    }
  }
}

static const OpsTable kTable = {rms_norm, rope, glu, add, dot, add_rows, attend, store_kv};

}  // namespace pagellm::cpu::OPS_NS
