// Kernel bodies shared by ops_scalar.cpp, ops_avx2.cpp and ops_avx512.cpp
// (the AVX2 code with 512-bit attention scores and value sums). Included once
// per ISA inside a distinct namespace (OPS_NS), so no symbol is shared between
// the compilations. Plain loops with `omp simd` reductions: the compiler
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

// Whether key j is visible to a query at position p (AttnTile's window and ahead).
static inline bool key_visible(int64_t j, int64_t p, int window, int ahead) {
  return j <= p + ahead && (window <= 0 || j > p - window);
}

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

constexpr int kMaxHeadDim = kAttnMaxHeadDim, kMaxBlock = kAttnMaxBlock, kMaxRows = kAttnMaxRows;
// Below this many query rows per KV head, scores are direct dot products.
constexpr int kDirectScoreRows = 4;

// The 8 horizontal sums of a[0..7], in order.
static inline __m256 hsum8x8(const __m256 (&a)[8]) {
  const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
}

// acc[0, 8N) = acc * corr + sum over keys k < cnt of w[k] (* vs[k], int8
// caches) x v[k * stride + i], key by key in order. A masked key (weight 0)
// is skipped, not weighted by 0: its value may hold any bits (0 x NaN is
// NaN); for finite values the sum is the same. The accumulators live in
// registers for the whole block (a fixed N per call).
template <int N, typename VT>
static inline void pv_chunk_n(float* acc, __m256 corr, const float* w, int cnt, const VT* v, int64_t stride,
                              const float* vs) {
  __m256 a8[N];
  for (int i = 0; i < N; ++i) a8[i] = _mm256_mul_ps(_mm256_loadu_ps(acc + 8 * i), corr);
  for (int k = 0; k < cnt; ++k) {
    if (w[k] == 0.0f) continue;
    const __m256 wk = _mm256_set1_ps(vs ? w[k] * vs[k] : w[k]);
    const VT* vk = v + k * stride;
    for (int i = 0; i < N; ++i) a8[i] = _mm256_fmadd_ps(wk, load8(vk + 8 * i), a8[i]);
  }
  for (int i = 0; i < N; ++i) _mm256_storeu_ps(acc + 8 * i, a8[i]);
}

// fn(std::integral_constant<int, n>) for n in [1, 8]: a runtime count as the
// fixed trip count of a register tile.
template <typename Fn>
static inline void with_count8(int n, Fn&& fn) {
  switch (n) {
    case 8: return fn(std::integral_constant<int, 8>{});
    case 7: return fn(std::integral_constant<int, 7>{});
    case 6: return fn(std::integral_constant<int, 6>{});
    case 5: return fn(std::integral_constant<int, 5>{});
    case 4: return fn(std::integral_constant<int, 4>{});
    case 3: return fn(std::integral_constant<int, 3>{});
    case 2: return fn(std::integral_constant<int, 2>{});
    default: return fn(std::integral_constant<int, 1>{});
  }
}

template <typename VT>
static inline void pv_chunk(float* acc, int n8, __m256 corr, const float* w, int cnt, const VT* v, int64_t stride,
                            const float* vs) {
  with_count8(n8, [&](auto n) { pv_chunk_n<decltype(n)::value>(acc, corr, w, cnt, v, stride, vs); });
}

#if defined(OPS_AVX512)
// The 512-bit build (ops_avx512.cpp): scores and value sums 16 lanes at a
// time, each element computed by the same operations in the same order as
// above (a row's bits do not change between the AVX2 and AVX-512 paths of
// this build, so decode and prefill still agree).
static inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
static inline __m512 load16(const half_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
static inline __m512 load16(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// pv_chunk_n over N 16-float vectors.
template <int N, typename VT>
static inline void pv_chunk16_n(float* acc, float corr, const float* w, int cnt, const VT* v, int64_t stride,
                                const float* vs) {
  const __m512 vcorr = _mm512_set1_ps(corr);
  __m512 a[N];
  for (int i = 0; i < N; ++i) a[i] = _mm512_loadu_ps(acc + 16 * i);
  if (corr != 1.0f)  // x * 1 is x: the same bits without the multiplies
    for (int i = 0; i < N; ++i) a[i] = _mm512_mul_ps(a[i], vcorr);
  for (int k = 0; k < cnt; ++k) {
    if (w[k] == 0.0f) continue;
    const __m512 wk = _mm512_set1_ps(vs ? w[k] * vs[k] : w[k]);
    const VT* vk = v + k * stride;
    for (int i = 0; i < N; ++i) a[i] = _mm512_fmadd_ps(wk, load16(vk + 16 * i), a[i]);
  }
  for (int i = 0; i < N; ++i) _mm512_storeu_ps(acc + 16 * i, a[i]);
}

template <typename VT>
static inline void pv_chunk16(float* acc, int n16, float corr, const float* w, int cnt, const VT* v, int64_t stride,
                              const float* vs) {
  with_count8(n16, [&](auto n) { pv_chunk16_n<decltype(n)::value>(acc, corr, w, cnt, v, stride, vs); });
}

// pv_chunk16_n for two rows over the same values: each loaded value vector
// feeds both rows' FMAs. Each row's sums are pv_chunk16_n's, in its order,
// skipping its own masked keys.
template <int N, typename VT>
static inline void pv_pair16_n(float* acc0, float* acc1, float corr0, float corr1, const float* w0, const float* w1,
                               int cnt, const VT* v, int64_t stride, const float* vs) {
  __m512 a[N], b[N];
  for (int i = 0; i < N; ++i) {
    a[i] = _mm512_loadu_ps(acc0 + 16 * i);
    b[i] = _mm512_loadu_ps(acc1 + 16 * i);
  }
  if (corr0 != 1.0f)
    for (int i = 0; i < N; ++i) a[i] = _mm512_mul_ps(a[i], _mm512_set1_ps(corr0));
  if (corr1 != 1.0f)
    for (int i = 0; i < N; ++i) b[i] = _mm512_mul_ps(b[i], _mm512_set1_ps(corr1));
  for (int k = 0; k < cnt; ++k) {
    const float x0 = w0[k], x1 = w1[k];
    const VT* vk = v + k * stride;
    const __m512 wk0 = _mm512_set1_ps(vs ? x0 * vs[k] : x0), wk1 = _mm512_set1_ps(vs ? x1 * vs[k] : x1);
    if (x0 != 0.0f && x1 != 0.0f) {
      for (int i = 0; i < N; ++i) {
        const __m512 vv = load16(vk + 16 * i);
        a[i] = _mm512_fmadd_ps(wk0, vv, a[i]);
        b[i] = _mm512_fmadd_ps(wk1, vv, b[i]);
      }
    } else if (x0 != 0.0f) {
      for (int i = 0; i < N; ++i) a[i] = _mm512_fmadd_ps(wk0, load16(vk + 16 * i), a[i]);
    } else if (x1 != 0.0f) {
      for (int i = 0; i < N; ++i) b[i] = _mm512_fmadd_ps(wk1, load16(vk + 16 * i), b[i]);
    }
  }
  for (int i = 0; i < N; ++i) {
    _mm512_storeu_ps(acc0 + 16 * i, a[i]);
    _mm512_storeu_ps(acc1 + 16 * i, b[i]);
  }
}

// score_rows for RN (<= 8) rows and 16 keys: per key the same sums (lane l
// of dimensions l, l + 8, ..., then hsum8x8's tree), 16 keys per vector. RN
// is a fixed trip count: a runtime row count left a compare and branch beside
// every FMA.
template <int RN>
static inline void score_rows16_n(const float* q0, int D, const float* kt, int ld, float* out) {
  __m512 lane[RN][8];
  for (int l = 0; l < 8; ++l) {
    __m512 s[RN];
    for (int i = 0; i < RN; ++i) s[i] = _mm512_setzero_ps();
    for (int d = l; d < D; d += 8) {
      const __m512 kk = _mm512_loadu_ps(kt + d * ld);
      for (int i = 0; i < RN; ++i) s[i] = _mm512_fmadd_ps(_mm512_set1_ps(q0[i * D + d]), kk, s[i]);
    }
    for (int i = 0; i < RN; ++i) lane[i][l] = s[i];
  }
  for (int i = 0; i < RN; ++i) {
    const __m512(&p)[8] = lane[i];
    const __m512 lo = _mm512_add_ps(_mm512_add_ps(p[0], p[1]), _mm512_add_ps(p[2], p[3]));
    const __m512 hi = _mm512_add_ps(_mm512_add_ps(p[4], p[5]), _mm512_add_ps(p[6], p[7]));
    _mm512_storeu_ps(out + i * kMaxBlock, _mm512_add_ps(lo, hi));
  }
}
static inline void score_rows16(const float* q0, int D, const float* kt, int ld, int rn, float* out) {
  with_count8(rn, [&](auto n) { score_rows16_n<decltype(n)::value>(q0, D, kt, ld, out); });
}
#endif

// Prefetches bytes [0, n) at p into L2 (a 256-dim block slice is 8 KiB of
// keys and 8 of values: into L1 they would evict the working tiles). Always
// inlined, as are its callers: GCC's pure-const pass takes a function that
// only prefetches for one without effects and drops its calls (it did so for
// a lambda here).
__attribute__((always_inline)) static inline void prefetch_lines(const void* p, int64_t n) {
  const char* c = static_cast<const char*>(p);
  for (int64_t off = 0; off < n; off += 64) _mm_prefetch(c + off, _MM_HINT_T1);
}

// The largest of 8 floats.
static inline float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// v[i][j] -> v[j][i] (8x8 floats).
__attribute__((always_inline)) static inline void transpose8x8(__m256 (&v)[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(v[i], v[i + 1]);      // v[i][0] v[i+1][0] v[i][1] v[i+1][1] | 4 5
    t[i + 1] = _mm256_unpackhi_ps(v[i], v[i + 1]);  // v[i][2] v[i+1][2] v[i][3] v[i+1][3] | 6 7
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);      // column 0 of rows i..i+3 | column 4
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);  // column 1 | 5
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);  // column 2 | 6
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);  // column 3 | 7
  }
  for (int c = 0; c < 4; ++c) {
    v[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
    v[c + 4] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
  }
}

// Scores of rn (<= 4) query rows q0[r * D + d] against NK x 8 transposed keys
// kt[d * ld + key] into out[r * kMaxBlock + key]: lane l sums dimensions
// l, l + 8, ... in order, then the lanes are added as hsum8x8 does.
template <int NK>
static inline void score_rows(const float* q0, int D, const float* kt, int ld, int rn, float* out) {
  __m256 lane[4][NK][8];
  for (int l = 0; l < 8; ++l) {
    __m256 s[4][NK];
    for (int i = 0; i < 4; ++i)
      for (int h = 0; h < NK; ++h) s[i][h] = _mm256_setzero_ps();
    for (int d = l; d < D; d += 8) {
      __m256 kk[NK];
      for (int h = 0; h < NK; ++h) kk[h] = _mm256_load_ps(kt + d * ld + 8 * h);
      for (int i = 0; i < 4; ++i) {
        if (i >= rn) break;
        const __m256 qv = _mm256_broadcast_ss(q0 + i * D + d);
        for (int h = 0; h < NK; ++h) s[i][h] = _mm256_fmadd_ps(qv, kk[h], s[i][h]);
      }
    }
    for (int i = 0; i < 4; ++i)
      for (int h = 0; h < NK; ++h) lane[i][h][l] = s[i][h];
  }
  for (int i = 0; i < rn; ++i)
    for (int h = 0; h < NK; ++h) {
      const __m256(&p)[8] = lane[i][h];
      const __m256 lo = _mm256_add_ps(_mm256_add_ps(p[0], p[1]), _mm256_add_ps(p[2], p[3]));
      const __m256 hi = _mm256_add_ps(_mm256_add_ps(p[4], p[5]), _mm256_add_ps(p[6], p[7]));
      _mm256_store_ps(out + i * kMaxBlock + 8 * h, _mm256_add_ps(lo, hi));
    }
}

// One span of keys (16 or 32, below) at a time: K is transposed into kt[d][key]
// so that 4 rows x 8 keys of scores build up in registers; V is converted to
// float once and reused by every row; each row's output accumulates in
// registers over the span, 64 dimensions at a time.
template <typename T>
static void attend_tile_t(const AttnTile& a, const AttnKV& kv, int g, AttnPartial out) {
  const int D = kv.head_dim, B = kv.block_size, G = a.group, R = a.n_tokens * a.group;
  const int Dv = kv.v_dim > 0 ? kv.v_dim : D;
  const bool dense = kv.block_table == nullptr;
  const int64_t ks = dense ? kv.key_stride : D;  // elements between a chunk's consecutive keys
  alignas(32) float qs[kMaxRows * kMaxHeadDim];  // [R][D] scaled queries
  alignas(32) float kt[kMaxHeadDim * kMaxBlock];  // [D][S_pad] this span's keys, transposed
  alignas(32) float vb[kMaxBlock * kMaxHeadDim];  // [S][Dv] this span's values
  alignas(32) float sc[kMaxRows * kMaxBlock];     // [R][S_pad] scores, then weights
  for (int r = 0; r < R; ++r) {
    const float* q = a.q + (r / G) * a.q_stride + (r % G) * D;
    const __m256 vs = _mm256_set1_ps(a.scale);
    for (int d = 0; d < D; d += 8) _mm256_store_ps(qs + r * D + d, _mm256_mul_ps(_mm256_loadu_ps(q + d), vs));
    out.m[r] = -INFINITY;
    out.l[r] = 0.0f;
    for (int d = 0; d < Dv; ++d) out.acc[r * Dv + d] = 0.0f;
  }
  const T* kc = static_cast<const T*>(kv.k);
  const T* vc = static_cast<const T*>(kv.v);
  // int8 caches: scores and value weights take each key's scales once
  // (s * kscale, w * vscale), not every element.
  constexpr bool kScaled = std::is_same_v<T, int8_t>;
  // Keys go in spans of S, cut at multiples of S in absolute position (and at
  // the unit's ends), whatever the cache block size: each row's softmax then
  // updates once per span (per 16-key block it cost as much as the scores at
  // 64 dimensions), and a row sees the same spans in a decode as in a prefill
  // tile. A span's keys are gathered by element offset (off[k]). 32 keys
  // where a key is at most 128 bytes, else 16: bench ops, one core, 64-dim
  // f16 heads: prefill 512 ~15% faster at 32 keys, cold decode as at 16; at
  // 128 and 256 dimensions 32 keys made cold decode 5-15% slower (the next
  // span's prefetches, 256+ lines, overflow the miss queues) for 9-10% on
  // prefill.
  const int64_t key_bytes = D * static_cast<int64_t>(sizeof(T)), value_bytes = Dv * static_cast<int64_t>(sizeof(T));
  const int S = key_bytes <= 128 ? 32 : 16;
  const auto span_end = [&](int64_t j_at, int64_t j_last) { return min64(j_last, (j_at / S + 1) * S); };
  // off[k] for the keys [j_at, e) of x's KV head gx, a cache block (or dense
  // chunk) at a time.
  const auto span_offsets = [&](const AttnKV& x, int gx, int64_t j_at, int64_t e, int64_t* off) {
    const int64_t xs = x.block_table ? x.head_dim : x.key_stride;
    for (int64_t p = j_at; p < e;) {
      const int64_t seg = min64(e - p, x.block_size - p % x.block_size);
      const int64_t o = x.block_table ? ((static_cast<int64_t>(x.block_table[p / x.block_size]) * x.block_heads + gx) *
                                             x.block_size + p % x.block_size) * x.head_dim
                                      : p * xs;
      for (int64_t k = 0; k < seg; ++k) off[p - j_at + k] = o + k * xs;
      p += seg;
    }
  };
  int64_t offs[2][kMaxBlock];  // this span's key offsets and the next one's
  int cur = 0;
  // At decode the cache comes from memory (a whole step of weights passed
  // since it was written), one block's head slice at a time, and the slices
  // are not adjacent: fetch the next span's keys and values (after the last
  // span, the next unit's first, when the caller says which) while this one
  // is worked on, as the hardware prefetcher does not; a key at a time,
  // spread over the work (a span's lines at once overflow the miss queues).
  // The first span's first block now.
  if (a.j0 < a.j1) {  // (a unit without keys must not read the block table past its end)
    span_offsets(kv, g, a.j0, span_end(a.j0, a.j1), offs[0]);
    const int first = static_cast<int>(min64(span_end(a.j0, a.j1) - a.j0, B - a.j0 % B));
    for (int k = 0; k < first; ++k) {
      prefetch_lines(kc + offs[0][k], key_bytes);
      prefetch_lines(vc + offs[0][k], value_bytes);
    }
  }
  alignas(32) float kscales[kMaxBlock], vscales[kMaxBlock];  // int8 caches: the span's scales
  for (int64_t j = a.j0; j < a.j1;) {
    const int64_t e = span_end(j, a.j1);
    const int cnt = static_cast<int>(e - j);
    const int cnt8 = (cnt + 7) & ~7;
    const int64_t* off = offs[cur];
    const int64_t* next_off = offs[cur ^ 1];
    int next_cnt = 0;
    const T* next_kc = kc;
    const T* next_vc = vc;
    if (e < a.j1) {
      next_cnt = static_cast<int>(span_end(e, a.j1) - e);
      span_offsets(kv, g, e, e + next_cnt, offs[cur ^ 1]);
    } else if (a.next_kv && a.next_j0 < a.next_j1) {
      next_cnt = static_cast<int>(span_end(a.next_j0, a.next_j1) - a.next_j0);
      span_offsets(*a.next_kv, a.next_g, a.next_j0, a.next_j0 + next_cnt, offs[cur ^ 1]);
      next_kc = static_cast<const T*>(a.next_kv->k);
      next_vc = static_cast<const T*>(a.next_kv->v);
    }
    // The next span's keys [k0, k1) with their values, spread over this
    // span's work (a span's lines at once overflow the miss queues).
    const auto prefetch_next = [&](int k0, int k1) __attribute__((always_inline)) {
      for (int k = k0; k < k1 && k < next_cnt; ++k) {
        prefetch_lines(next_kc + next_off[k], key_bytes);
        prefetch_lines(next_vc + next_off[k], value_bytes);
      }
    };
    if constexpr (kScaled) {
      for (int k = 0; k < cnt; ++k) {
        const int64_t slot = off[k] / D;
        kscales[k] = kv.k_scale[slot];
        vscales[k] = kv.v_scale[slot];
      }
    }
    const bool direct = R < kDirectScoreRows;
    // Many rows share each value: convert the span once. Few rows read the cache directly.
    for (int k = 0; k < cnt && !direct; ++k) {
      prefetch_next(k, k + 1);
      const T* vr = vc + off[k];
      for (int d = 0; d < Dv; d += 8) _mm256_store_ps(vb + k * Dv + d, load8(vr + d));
    }
    if (direct) {
      // Few rows (decode without much GQA sharing): each key's dot product
      // straight from the cache, 8 keys' sums reduced together; transposing
      // the span would cost more than the rows' products.
      for (int r = 0; r < R; ++r)
        for (int k0 = 0; k0 < cnt8; k0 += 8) {
          if (r == 0) prefetch_next(k0, k0 + 8 < cnt8 ? k0 + 8 : next_cnt);
          __m256 acc[8];
          for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
          const int kn = static_cast<int>(min64(8, cnt - k0));
          if (kn == 8) {  // a whole group: fixed trip counts keep acc in registers
            const T* kp[8];
            for (int i = 0; i < 8; ++i) kp[i] = kc + off[k0 + i];
            for (int d = 0; d < D; d += 8) {
              const __m256 qv = _mm256_load_ps(qs + r * D + d);
#pragma GCC unroll 8
              for (int i = 0; i < 8; ++i) acc[i] = _mm256_fmadd_ps(qv, load8(kp[i] + d), acc[i]);
            }
          } else {
            for (int d = 0; d < D; d += 8) {
              const __m256 qv = _mm256_load_ps(qs + r * D + d);
              for (int i = 0; i < kn; ++i) acc[i] = _mm256_fmadd_ps(qv, load8(kc + off[k0 + i] + d), acc[i]);
            }
          }
          _mm256_store_ps(sc + r * kMaxBlock + k0, hsum8x8(acc));
        }
    } else {
      // 8 keys x 8 dimensions at a time, transposed in registers (keys past
      // cnt are zeros): scalar stores of every element cost more than the
      // scores themselves at decode.
      prefetch_next(cnt, next_cnt);
      for (int k0 = 0; k0 < cnt8; k0 += 8) {
        const int kn = static_cast<int>(min64(8, cnt - k0));
        for (int d = 0; d < D; d += 8) {
          __m256 v[8];
          for (int i = 0; i < 8; ++i) v[i] = i < kn ? load8(kc + off[k0 + i] + d) : _mm256_setzero_ps();
          transpose8x8(v);
          for (int i = 0; i < 8; ++i) _mm256_store_ps(kt + (d + i) * cnt8 + k0, v[i]);
        }
      }
    }
    // Scores: 4 rows x 8 keys per register tile, summed in the direct path's
    // order: partial sums of every 8th dimension (lane l: d = l, l + 8, ...),
    // then the same tree as hsum8x8. A row's scores are then the same bits
    // whether it shares its tile (prefill, verifying speculative tokens) or
    // not (decode).
    // Two vectors of 8 keys per pass where the block has them: each query
    // broadcast then feeds two FMAs (one load per FMA instead of 1.25).
#if defined(OPS_AVX512)
    // 8 rows x 16 keys per tile; an odd 8 keys at the end as above.
    for (int r0 = 0; r0 < R && R >= kDirectScoreRows; r0 += 8) {
      const int rn = static_cast<int>(min64(8, R - r0));
      int k0 = 0;
      for (; k0 + 16 <= cnt8; k0 += 16) score_rows16(qs + r0 * D, D, kt + k0, cnt8, rn, sc + r0 * kMaxBlock + k0);
      for (int r1 = r0; k0 < cnt8 && r1 < r0 + rn; r1 += 4)
        score_rows<1>(qs + r1 * D, D, kt + k0, cnt8, static_cast<int>(min64(4, r0 + rn - r1)), sc + r1 * kMaxBlock + k0);
    }
#else
    for (int r0 = 0; r0 < R && R >= kDirectScoreRows; r0 += 4) {
      const int rn = static_cast<int>(min64(4, R - r0));
      int k0 = 0;
      for (; k0 + 16 <= cnt8; k0 += 16) score_rows<2>(qs + r0 * D, D, kt + k0, cnt8, rn, sc + r0 * kMaxBlock + k0);
      if (k0 < cnt8) score_rows<1>(qs + r0 * D, D, kt + k0, cnt8, rn, sc + r0 * kMaxBlock + k0);
    }
#endif
    if constexpr (kScaled) {
      for (int r = 0; r < R; ++r)
        for (int k = 0; k < cnt; ++k) sc[r * kMaxBlock + k] *= kscales[k];
    }
    // Per row: mask and online softmax update (the weights replace the
    // scores in sc); then acc += weights x V.
    float corrs[kMaxRows];  // each row's rescale of acc; -1: nothing visible yet
    for (int r = 0; r < R; ++r) {
      float* s = sc + r * kMaxBlock;
      const int64_t p = a.pos0 + r / G;
      float mx = out.m[r];
      // Visibility is an interval of positions, so the span's two ends tell
      // whether every key is visible (decode, most of prefill); then the max
      // is a vector max (the same value: max is exact in any order).
      if (a.softcap <= 0.0f && key_visible(j, p, a.window, a.ahead) && key_visible(j + cnt - 1, p, a.window, a.ahead)) {
        for (int k = cnt; k < cnt8; ++k) s[k] = -INFINITY;
        __m256 m8 = _mm256_set1_ps(mx);
        for (int k = 0; k < cnt8; k += 8) m8 = _mm256_max_ps(m8, _mm256_load_ps(s + k));
        mx = hmax8(m8);
      } else {
        for (int k = 0; k < cnt8; ++k) {
          if (k >= cnt || !key_visible(j + k, p, a.window, a.ahead)) {
            s[k] = -INFINITY;
            continue;
          }
          s[k] = cap_score(s[k], a.softcap);
          mx = s[k] > mx ? s[k] : mx;
        }
      }
      corrs[r] = -1.0f;
      if (mx == -INFINITY) continue;  // nothing visible yet for this row
      // exp(0) is 1: a span that leaves the max alone (most) needs no exp.
      const float corr = mx == out.m[r] ? 1.0f : std::exp(out.m[r] - mx);
      const __m256 vmx = _mm256_set1_ps(mx);
      __m256 lsum = _mm256_setzero_ps();
      for (int k = 0; k < cnt8; k += 8) {
        const __m256 w = exp8(_mm256_sub_ps(_mm256_load_ps(s + k), vmx));
        _mm256_store_ps(s + k, w);
        lsum = _mm256_add_ps(lsum, w);
      }
      out.l[r] = out.l[r] * corr + hsum8(lsum);
      out.m[r] = mx;
      corrs[r] = corr;
    }
    // acc += w_k * v_k over the span's keys [k0, k0 + n), 64 dimensions at a
    // time (128 in the 512-bit build), from v: the converted span (rows Dv
    // apart) or straight from the cache (rows ks apart). A row's rescale
    // (corr) goes first, once per span.
    const float* vs = kScaled ? vscales : nullptr;
    const auto add_values = [&](int r, int k0, int n, float corr, const auto* v, int64_t stride) {
      const float* w = sc + r * kMaxBlock + k0;
      const float* vsk = vs ? vs + k0 : nullptr;
#if defined(OPS_AVX512)
      for (int d0 = 0; d0 < Dv; d0 += 128) {
        const int dn = static_cast<int>(min64(128, Dv - d0));
        float* acc = out.acc + r * Dv + d0;
        if (dn % 16 == 0) pv_chunk16(acc, dn / 16, corr, w, n, v + d0, stride, vsk);
        else pv_chunk(acc, dn / 8, _mm256_set1_ps(corr), w, n, v + d0, stride, vsk);
      }
#else
      for (int d0 = 0; d0 < Dv; d0 += 64)
        pv_chunk(out.acc + r * Dv + d0, static_cast<int>(min64(64, Dv - d0)) / 8, _mm256_set1_ps(corr), w, n, v + d0,
                 stride, vsk);
#endif
    };
    // From the cache: a run of adjacent keys (one cache block) at a time,
    // the same sums key by key as over the converted span.
    const auto add_cached_values = [&](int r) {
      for (int k = 0; k < cnt;) {
        int n = 1;
        while (k + n < cnt && off[k + n] == off[k] + n * ks) ++n;
        add_values(r, k, n, k == 0 ? corrs[r] : 1.0f, vc + off[k], ks);
        k += n;
      }
    };
    int r = 0;
#if defined(OPS_AVX512)
    // Many rows over the converted span: rows in pairs, each value load
    // feeding both (the same sums per row).
    for (; !direct && Dv % 16 == 0 && r + 1 < R; r += 2) {
      if (corrs[r] < 0.0f || corrs[r + 1] < 0.0f) {
        for (int rr = r; rr < r + 2; ++rr)
          if (corrs[rr] >= 0.0f) add_values(rr, 0, cnt, corrs[rr], static_cast<const float*>(vb), Dv);
        continue;
      }
      for (int d0 = 0; d0 < Dv; d0 += 128) {
        const int n16 = static_cast<int>(min64(128, Dv - d0)) / 16;
        with_count8(n16, [&](auto n) {
          pv_pair16_n<decltype(n)::value>(out.acc + r * Dv + d0, out.acc + (r + 1) * Dv + d0, corrs[r], corrs[r + 1],
                                          sc + r * kMaxBlock, sc + (r + 1) * kMaxBlock, cnt, vb + d0, Dv, vs);
        });
      }
    }
#endif
    for (; r < R; ++r) {
      if (corrs[r] < 0.0f) continue;
      if (direct) add_cached_values(r);
      else add_values(r, 0, cnt, corrs[r], static_cast<const float*>(vb), Dv);
    }
    j = e;
    cur ^= 1;
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
  const int Dv = kv.v_dim > 0 ? kv.v_dim : D;
  const bool dense = kv.block_table == nullptr;
  const T* kc = static_cast<const T*>(kv.k);
  const T* vc = static_cast<const T*>(kv.v);
  for (int r = 0; r < R; ++r) {
    const float* q = a.q + (r / G) * a.q_stride + (r % G) * D;
    const int64_t p = a.pos0 + r / G;
    float m = -INFINITY, l = 0.0f;
    float* acc = out.acc + r * Dv;
    for (int d = 0; d < Dv; ++d) acc[d] = 0.0f;
    for (int64_t j = a.j0; j < a.j1; ++j) {
      if (!key_visible(j, p, a.window, a.ahead)) continue;
      const int64_t slot = dense ? 0 : (static_cast<int64_t>(kv.block_table[j / B]) * kv.block_heads + g) * B + j % B;
      const int64_t at = dense ? j * kv.key_stride : slot * D;
      const float ks = kv.k_scale ? kv.k_scale[slot] : 1.0f, vs = kv.v_scale ? kv.v_scale[slot] : 1.0f;
      const float s = cap_score(dot_q(q, kc + at, D) * ks * a.scale, a.softcap);
      const float mx = s > m ? s : m;
      const float corr = std::exp(m - mx), w = std::exp(s - mx);
      l = l * corr + w;
      scale_add(acc, corr, w * vs, vc + at, Dv);
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
    const int64_t row = (blk * c.block_heads + g) * c.block_size + off, at = row * D;
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
