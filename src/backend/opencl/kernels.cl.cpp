// OpenCL C 1.2 kernels. The launch constants (MV_WG, TM, ATT_WG, ...) come
// from kernels.h through -D build options, so host and device agree.
// Half values go through vload_half / vstore_half_rte only: no cl_khr_fp16.
#include "backend/opencl/kernels.h"

namespace pagellm::opencl {

const char* const kKernelSource = R"CLC(
// ---------------------------------------------------------------- weights
// deq8_T(w, dofs, e): the 8 values of a matrix at element e (a multiple of
// 8, counted over the whole matrix, row-major); dofs is the byte offset of
// the scales for the split layouts (weight_pack.h).

inline float8 deq8_f32(global const uchar* w, ulong dofs, ulong e) {
  return vload8(e >> 3, (global const float*)w);
}

inline float8 deq8_f16(global const uchar* w, ulong dofs, ulong e) {
  return vload_half8(e >> 3, (global const half*)w);
}

inline float8 deq8_q8_0(global const uchar* w, ulong dofs, ulong e) {
  const float d = vload_half(e >> 5, (global const half*)(w + dofs));
  return convert_float8(vload8(e >> 3, (global const char*)w)) * d;
}

// A block's 16 bytes hold values i (low nibble) and i + 16 (high nibble).
inline float8 deq8_q4_0(global const uchar* w, ulong dofs, ulong e) {
  const ulong b = e >> 5;
  const uint c = (uint)(e >> 3) & 3u;
  const float d = vload_half(b, (global const half*)(w + dofs));
  const uchar8 q = vload8(b * 2 + (c & 1u), w);
  const uchar8 nib = c >= 2 ? (q >> (uchar)4) : (q & (uchar)15);
  return (convert_float8(nib) - 8.0f) * d;
}

// 20-byte records: qh (bit i: the fifth bit of value i) then 16 bytes of
// nibbles as in Q4_0; the value is (nibble | high bit << 4) - 16.
inline float8 deq8_q5_0(global const uchar* w, ulong dofs, ulong e) {
  const ulong b = e >> 5;
  const uint c = (uint)(e >> 3) & 3u;
  global const uchar* blk = w + b * 20;
  const float d = vload_half(b, (global const half*)(w + dofs));
  const uint h = (*(global const uint*)blk >> (8u * c)) & 255u;
  const uchar8 q = vload8(0, blk + 4 + 8 * (c & 1u));
  const uchar8 nib = c >= 2 ? (q >> (uchar)4) : (q & (uchar)15);
  const uchar8 hb = ((uchar8)((uchar)h) >> (uchar8)(0, 1, 2, 3, 4, 5, 6, 7)) & (uchar)1;
  return (convert_float8(nib | (hb << (uchar)4)) - 16.0f) * d;
}

// 208-byte records of 256 values: ql[128], qh[64], int8 scales[16] (d apart).
// Value 128 h + 32 k + l (k < 4, l < 32): low 4 bits from the low (k < 2) or
// high nibble of ql[64 h + 32 (k & 1) + l], bits 4-5 from qh[32 h + l] >>
// 2 k, scale scales[8 h + 2 k + l / 16]; the value is (q - 32) * d * scale.
inline float8 deq8_q6_k(global const uchar* w, ulong dofs, ulong e) {
  const ulong b = e >> 8;
  const uint i = (uint)e & 255u, h = i >> 7, k = (i >> 5) & 3u, l = i & 31u;
  global const uchar* blk = w + b * 208;
  const float d = vload_half(b, (global const half*)(w + dofs));
  const float sc = (float)((global const char*)blk)[192 + 8 * h + 2 * k + (l >> 4)];
  const uchar8 ql = vload8(0, blk + 64 * h + 32 * (k & 1u) + l);
  const uchar8 qh = vload8(0, blk + 128 + 32 * h + l);
  const uchar8 lo = k >= 2 ? (ql >> (uchar)4) : (ql & (uchar)15);
  const uchar8 hi = (qh >> (uchar)(2 * k)) & (uchar)3;
  return (convert_float8(lo | (hi << (uchar)4)) - 32.0f) * (d * sc);
}

// The 6-bit scale and min of Q4_K sub-block j (0..7) from the 12-byte
// scales field s (core's kquant_scale_min).
inline void q4k_scale_min(global const uchar* s, uint j, uint* sc, uint* m) {
  if (j < 4) {
    *sc = s[j] & 63u;
    *m = s[j + 4] & 63u;
  } else {
    *sc = (s[j + 4] & 15u) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// 144-byte super-blocks of 256: d, dmin (fp16), 12 bytes of 6-bit sub-block
// scales and mins, 128 bytes of nibbles. Sub-block j (32 values) is the low
// (j even) or high (j odd) nibbles of bytes 32 * (j / 2) .. + 31.
inline float8 deq8_q4_k(global const uchar* w, ulong dofs, ulong e) {
  const ulong b = e >> 8;
  const uint i = (uint)e & 255u, j = i >> 5, o = i & 31u;
  global const uchar* blk = w + b * 144;
  const float d = vload_half(0, (global const half*)blk);
  const float dmin = vload_half(1, (global const half*)blk);
  global const uchar* s = blk + 4;
  uint sc, m;
  q4k_scale_min(s, j, &sc, &m);
  const uchar8 q = vload8((b * 144 + 16 + 32 * (j >> 1) + o) >> 3, w);
  const uchar8 nib = (j & 1u) ? (q >> (uchar)4) : (q & (uchar)15);
  return convert_float8(nib) * (d * (float)sc) - dmin * (float)m;
}

// ---------------------------------------------------------------- matmul
// mv: y[t, row] for up to MV_NT tokens. A work-group of MV_WG threads takes
// MV_ROWS weight rows, MV_WG / MV_ROWS lanes per row; a row is read once for
// all tokens, consecutive lanes reading consecutive 8-value chunks; the lanes'
// sums meet in a tree reduction in local memory.
#define MV_LANES (MV_WG / MV_ROWS)
// One chunk of a row for every token: VALS = 8 values through deq8_T, or
// 32 through deq32_T (scales and high bits decoded once per 32).
#define MV_CHUNK_8(T)                                                                         \
  const float8 wv = deq8_##T(w, dofs, base + (ulong)c * 8);                                   \
  for (int t = 0; t < MV_NT; ++t) {                                                           \
    if (t < nt) {                                                                             \
      const float8 xv = vload8(c, xt + (size_t)t * cols);                                     \
      acc[t] += dot(wv.lo, xv.lo) + dot(wv.hi, xv.hi);                                        \
    }                                                                                         \
  }
#define MV_CHUNK_32(T)                                                                        \
  float16 w0, w1;                                                                             \
  deq32_##T(w, dofs, base + (ulong)c * 32, &w0, &w1);                                         \
  for (int t = 0; t < MV_NT; ++t) {                                                           \
    if (t < nt) {                                                                             \
      global const float* xc = xt + (size_t)t * cols + (size_t)c * 32;                        \
      acc[t] += hsum16(w0 * vload16(0, xc) + w1 * vload16(1, xc));                            \
    }                                                                                         \
  }
#define DEFINE_MV_OF(T, VALS)                                                                 \
  kernel __attribute__((reqd_work_group_size(MV_WG, 1, 1))) void mv_##T(                      \
      global const uchar* w, ulong dofs, int rows, int cols, global const float* x, int n,    \
      global float* y) {                                                                      \
    local float red[MV_NT][MV_WG];                                                            \
    const int lid = get_local_id(0), lane = lid % MV_LANES;                                   \
    const int row = get_group_id(0) * MV_ROWS + lid / MV_LANES;                               \
    const int t0 = get_group_id(1) * MV_NT, nt = min(MV_NT, n - t0);                          \
    float acc[MV_NT];                                                                         \
    for (int t = 0; t < MV_NT; ++t) acc[t] = 0.0f;                                            \
    const ulong base = (ulong)row * (ulong)cols;                                              \
    const int n_chunks = row < rows ? cols / VALS : 0;                                        \
    global const float* xt = x + (size_t)t0 * cols;                                           \
    for (int c = lane; c < n_chunks; c += MV_LANES) {                                         \
      MV_CHUNK_##VALS(T)                                                                      \
    }                                                                                         \
    for (int t = 0; t < MV_NT; ++t) red[t][lid] = acc[t];                                     \
    barrier(CLK_LOCAL_MEM_FENCE);                                                             \
    for (int s = MV_LANES / 2; s > 0; s >>= 1) {                                              \
      if (lane < s)                                                                           \
        for (int t = 0; t < MV_NT; ++t) red[t][lid] += red[t][lid + s];                       \
      barrier(CLK_LOCAL_MEM_FENCE);                                                           \
    }                                                                                         \
    if (lane < nt && row < rows) y[(size_t)(t0 + lane) * rows + row] = red[lane][lid - lane]; \
  }
#define DEFINE_MV(T) DEFINE_MV_OF(T, 8)


// mm: a TM x TN tile of y (tokens x weight rows) per 16 x 16 work-group,
// each thread 2 tokens x 4 rows. Per step of TK = 32 columns, the x tile is
// loaded (float4 per thread, coalesced) and the weight tile dequantized
// (8 values per thread) into local memory, transposed so that neighbouring
// threads read neighbouring weight rows (conflict-free banks on a GPU,
// vector loads where PoCL vectorizes across work-items).
#define TK 32
#define DEFINE_MM(T)                                                                          \
  kernel __attribute__((reqd_work_group_size(16, 16, 1))) void mm_##T(                        \
      global const uchar* w, ulong dofs, int rows, int cols, global const float* x, int n,    \
      global float* y) {                                                                      \
    local float xs[TM][TK + 1];                                                               \
    local float ws[TK][TN + 1];                                                               \
    const int tx = get_local_id(0), ty = get_local_id(1), lid = ty * 16 + tx;                 \
    const int r0 = get_group_id(0) * TN, t0 = get_group_id(1) * TM;                           \
    const int wr = lid >> 2, wc = (lid & 3) * 8;                                              \
    const int xr = lid >> 3, xc = (lid & 7) * 4;                                              \
    const bool wok = r0 + wr < rows, xok = t0 + xr < n;                                       \
    const ulong wbase = (ulong)(r0 + wr) * (ulong)cols;                                       \
    global const float* xrow = x + (size_t)(t0 + xr) * cols;                                  \
    float acc[2][4];                                                                          \
    for (int a = 0; a < 2; ++a)                                                               \
      for (int b = 0; b < 4; ++b) acc[a][b] = 0.0f;                                           \
    for (int k0 = 0; k0 < cols; k0 += TK) {                                                   \
      float8 wv = (float8)(0.0f);                                                             \
      if (wok && k0 + wc < cols) wv = deq8_##T(w, dofs, wbase + (ulong)(k0 + wc));            \
      ws[wc][wr] = wv.s0; ws[wc + 1][wr] = wv.s1; ws[wc + 2][wr] = wv.s2;                     \
      ws[wc + 3][wr] = wv.s3; ws[wc + 4][wr] = wv.s4; ws[wc + 5][wr] = wv.s5;                 \
      ws[wc + 6][wr] = wv.s6; ws[wc + 7][wr] = wv.s7;                                         \
      float4 xv = (float4)(0.0f);                                                             \
      if (xok && k0 + xc < cols) xv = vload4(0, xrow + k0 + xc);                              \
      local float* xp = &xs[xr][xc];                                                          \
      xp[0] = xv.x; xp[1] = xv.y; xp[2] = xv.z; xp[3] = xv.w;                                 \
      barrier(CLK_LOCAL_MEM_FENCE);                                                           \
      for (int k = 0; k < TK; ++k) {                                                          \
        const float a0 = xs[ty][k], a1 = xs[ty + 16][k];                                      \
        const float b0 = ws[k][tx], b1 = ws[k][tx + 16], b2 = ws[k][tx + 32],                 \
                    b3 = ws[k][tx + 48];                                                      \
        acc[0][0] = mad(a0, b0, acc[0][0]); acc[0][1] = mad(a0, b1, acc[0][1]);               \
        acc[0][2] = mad(a0, b2, acc[0][2]); acc[0][3] = mad(a0, b3, acc[0][3]);               \
        acc[1][0] = mad(a1, b0, acc[1][0]); acc[1][1] = mad(a1, b1, acc[1][1]);               \
        acc[1][2] = mad(a1, b2, acc[1][2]); acc[1][3] = mad(a1, b3, acc[1][3]);               \
      }                                                                                       \
      barrier(CLK_LOCAL_MEM_FENCE);                                                           \
    }                                                                                         \
    for (int a = 0; a < 2; ++a) {                                                             \
      const int t = t0 + ty + 16 * a;                                                         \
      if (t >= n) continue;                                                                   \
      for (int b = 0; b < 4; ++b) {                                                           \
        const int r = r0 + tx + 16 * b;                                                       \
        if (r < rows) y[(size_t)t * rows + r] = acc[a][b];                                    \
      }                                                                                       \
    }                                                                                         \
  }

// embed: out[t] = row token_ids[t] of the table, dequantized, times scale.
#define DEFINE_EMBED(T)                                                                       \
  kernel void embed_##T(global const uchar* w, ulong dofs, int cols, global const int* meta,  \
                        int ids_off, float scale, global float* out) {                        \
    const int c = get_global_id(0), t = get_global_id(1);                                     \
    if (c >= (cols >> 3)) return;                                                             \
    const ulong e = (ulong)meta[ids_off + t] * (ulong)cols + (ulong)c * 8;                    \
    vstore8(deq8_##T(w, dofs, e) * scale, c, out + (size_t)t * cols);                         \
  }

#define DEFINE_WEIGHT_KERNELS(T) DEFINE_MV(T) DEFINE_MM(T) DEFINE_EMBED(T)
DEFINE_WEIGHT_KERNELS(f32)
DEFINE_WEIGHT_KERNELS(f16)
DEFINE_WEIGHT_KERNELS(q8_0)
DEFINE_WEIGHT_KERNELS(q4_0)
DEFINE_MM(q4_k)
DEFINE_EMBED(q4_k)
DEFINE_MM(q5_0)
DEFINE_EMBED(q5_0)
DEFINE_MM(q6_k)
DEFINE_EMBED(q6_k)

// Float rows whose length is not a multiple of 8 (tiny models): one
// work-item per output, scalar loads; f16 says the matrix is half.
inline float wf_at(global const uchar* w, int f16, size_t i) {
  return f16 ? vload_half(i, (global const half*)w) : ((global const float*)w)[i];
}

kernel void matmul_any(global const uchar* w, int f16, int rows, int cols, global const float* x, int n,
                       global float* y) {
  const int row = get_global_id(0), t = get_global_id(1);
  if (row >= rows || t >= n) return;
  const size_t wb = (size_t)row * cols;
  global const float* xt = x + (size_t)t * cols;
  float acc = 0.0f;
  for (int c = 0; c < cols; ++c) acc = mad(wf_at(w, f16, wb + c), xt[c], acc);
  y[(size_t)t * rows + row] = acc;
}

kernel void embed_any(global const uchar* w, int f16, int cols, global const int* meta, int ids_off, float scale,
                      global float* out) {
  const int c = get_global_id(0), t = get_global_id(1);
  if (c >= cols) return;
  out[(size_t)t * cols + c] = wf_at(w, f16, (size_t)meta[ids_off + t] * cols + c) * scale;
}

inline float hsum16(float16 v) {
  const float8 a = v.lo + v.hi;
  const float4 b = a.lo + a.hi;
  return b.x + b.y + b.z + b.w;
}

// deq32_T(w, dofs, e, lo, hi): the 32 values at element e (a multiple of 32)
// as two float16, for the mv kernels below: a lane takes a whole block or
// sub-block, so its scales and high bits are decoded once per 32 values.
inline void deq32_q4_k(global const uchar* w, ulong dofs, ulong e, float16* lo, float16* hi) {
  const uint j = (uint)(e >> 5) & 7u;
  global const uchar* blk = w + (e >> 8) * 144;
  const float d = vload_half(0, (global const half*)blk), dmin = vload_half(1, (global const half*)blk);
  global const uchar* s = blk + 4;
  uint sc, m;
  q4k_scale_min(s, j, &sc, &m);
  global const uchar* q = blk + 16 + 32 * (j >> 1);
  uchar16 q0 = vload16(0, q), q1 = vload16(1, q);
  if (j & 1) {
    q0 >>= (uchar)4;
    q1 >>= (uchar)4;
  } else {
    q0 &= (uchar)15;
    q1 &= (uchar)15;
  }
  const float d1 = d * (float)sc, m1 = dmin * (float)m;
  *lo = convert_float16(q0) * d1 - m1;
  *hi = convert_float16(q1) * d1 - m1;
}

inline void deq32_q5_0(global const uchar* w, ulong dofs, ulong e, float16* lo, float16* hi) {
  const ulong b = e >> 5;
  global const uchar* blk = w + b * 20;
  const float d = vload_half(b, (global const half*)(w + dofs));
  const uint qh = *(global const uint*)blk;
  const uchar16 q = vload16(0, blk + 4);
  const uint16 sh = (uint16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const uint16 h0 = (((uint16)(qh) >> sh) & 1u) << 4, h1 = (((uint16)(qh >> 16) >> sh) & 1u) << 4;
  *lo = (convert_float16(convert_uint16(q & (uchar)15) | h0) - 16.0f) * d;
  *hi = (convert_float16(convert_uint16(q >> (uchar)4) | h1) - 16.0f) * d;
}

// Values 0-15 and 16-31 of a 32-value quarter have one scale each.
inline void deq32_q6_k(global const uchar* w, ulong dofs, ulong e, float16* lo, float16* hi) {
  const ulong b = e >> 8;
  const uint c = (uint)(e >> 5) & 7u, h = c >> 2, k = c & 3u;
  global const uchar* blk = w + b * 208;
  const float d = vload_half(b, (global const half*)(w + dofs));
  global const char* sc = (global const char*)blk + 192 + 8 * h + 2 * k;
  global const uchar* ql = blk + 64 * h + 32 * (k & 1u);
  global const uchar* qh = blk + 128 + 32 * h;
  uchar16 l0 = vload16(0, ql), l1 = vload16(1, ql);
  if (k >= 2) {
    l0 >>= (uchar)4;
    l1 >>= (uchar)4;
  } else {
    l0 &= (uchar)15;
    l1 &= (uchar)15;
  }
  const uchar sh = (uchar)(2 * k);
  const uchar16 h0 = ((vload16(0, qh) >> sh) & (uchar)3) << (uchar)4;
  const uchar16 h1 = ((vload16(1, qh) >> sh) & (uchar)3) << (uchar)4;
  *lo = (convert_float16(l0 | h0) - 32.0f) * (d * (float)sc[0]);
  *hi = (convert_float16(l1 | h1) - 32.0f) * (d * (float)sc[1]);
}

// mv with a lane taking 32 values at a time.
#define DEFINE_MV32(T) DEFINE_MV_OF(T, 32)

DEFINE_MV32(q4_k)
DEFINE_MV32(q5_0)
DEFINE_MV32(q6_k)

// ---------------------------------------------------------------- elementwise
kernel void add(global float* y, global const float* x, int n) {
  const int i = get_global_id(0);
  if (i < n) y[i] += x[i];
}

kernel void add_bias(global float* y, global const float* b, int dim, int n_rows) {
  const int c = get_global_id(0), r = get_global_id(1);
  if (c < dim && r < n_rows) y[(size_t)r * dim + c] += b[c];
}

// act 0: silu; 1: gelu, tanh form; 2: gpt-oss's clamped swiglu; 3: sigmoid gate. out may be gate (same index).
kernel void glu(global const float* gate, global const float* up, int n, int act, global float* out) {
  const int i = get_global_id(0);
  if (i >= n) return;
  if (act == 2) {
    const float g = fmin(gate[i], 7.0f), u = clamp(up[i], -7.0f, 7.0f);
    out[i] = g / (1.0f + exp(-1.702f * g)) * (u + 1.0f);
    return;
  }
  const float g = gate[i];
  if (act == 3) {
    out[i] = up[i] / (1.0f + exp(-g));
    return;
  }
  const float a = act == 0 ? g / (1.0f + exp(-g))
                           : 0.5f * g * (1.0f + tanh(0.7978845608028654f * (g + 0.044715f * g * g * g)));
  out[i] = a * up[i];
}

// One work-group per row; y may be x (each thread rewrites what it read).
kernel __attribute__((reqd_work_group_size(NORM_WG, 1, 1))) void rms_norm(
    global const float* x, global const float* w, int has_w, int dim, float eps, global float* y) {
  local float red[NORM_WG];
  const int lid = get_local_id(0);
  const size_t base = (size_t)get_group_id(0) * dim;
  float ss = 0.0f;
  for (int i = lid; i < dim; i += NORM_WG) {
    const float v = x[base + i];
    ss += v * v;
  }
  red[lid] = ss;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = NORM_WG / 2; s > 0; s >>= 1) {
    if (lid < s) red[lid] += red[lid + s];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  const float inv = 1.0f / sqrt(red[0] / (float)dim + eps);
  for (int i = lid; i < dim; i += NORM_WG) {
    const float v = x[base + i] * inv;
    y[base + i] = has_w ? v * w[i] : v;
  }
}

// ---------------------------------------------------------------- rope
// inv_freq holds each pair's frequency (freq_scale and factors folded in) as
// a float pair hi + lo computed in double on the host. theta = pos * freq is
// kept as hi + lo too (fma gives the product's rounding error), so large
// positions keep their angle to double-like accuracy.
inline float2 rope_cos_sin(int pos, global const float* inv_freq, int i, float mscale) {
  const float p = (float)pos, fh = inv_freq[2 * i], fl = inv_freq[2 * i + 1];
  const float hi = p * fh;
  const float lo = fma(p, fh, -hi) + p * fl;
  const float c = cos(hi), s = sin(hi);
  return (float2)(c - s * lo, s + c * lo) * mscale;
}

// Pair i of a head: (i, i + n_rot/2) for neox, else (2i, 2i + 1).
inline int2 rope_pair(int i, int n_rot, int neox) {
  return neox ? (int2)(i, i + n_rot / 2) : (int2)(2 * i, 2 * i + 1);
}

// x[t, h, :] in place; one work-item per rotated pair.
kernel void rope(global float* x, int n_heads, int head_dim, int n_rot, int neox, global const float* inv_freq,
                 float mscale, global const int* meta, int pos_off) {
  const int i = get_global_id(0), h = get_global_id(1), t = get_global_id(2);
  if (i >= n_rot / 2) return;
  const float2 cs = rope_cos_sin(meta[pos_off + t], inv_freq, i, mscale);
  const int2 ab = rope_pair(i, n_rot, neox);
  global float* v = x + ((size_t)t * n_heads + h) * head_dim;
  const float a = v[ab.x], b = v[ab.y];
  v[ab.x] = a * cs.x - b * cs.y;
  v[ab.y] = a * cs.y + b * cs.x;
}

// ---------------------------------------------------------------- kv cache
// One work-item per two values of a head: a rotated pair when n_rot > 0 and
// i < n_rot / 2 (k is rotated in place too), else two pass-through values.
// Cache: [block][kv head][offset in block][head_dim], f32 or f16.
kernel void store_kv(global float* k, global const float* v, global uchar* kc, global uchar* vc, int f16,
                     int n_kv_heads, int block_size, int head_dim, global const int* meta, int slot_off, int pos_off,
                     int n_rot, int neox, global const float* inv_freq, float mscale) {
  const int i = get_global_id(0), g = get_global_id(1), t = get_global_id(2);
  if (i >= head_dim / 2) return;
  const int half_rot = n_rot / 2;
  const size_t src = ((size_t)t * n_kv_heads + g) * head_dim;
  int2 ab;
  float ka, kb;
  if (i < half_rot) {
    ab = rope_pair(i, n_rot, neox);
    const float2 cs = rope_cos_sin(meta[pos_off + t], inv_freq, i, mscale);
    const float a = k[src + ab.x], b = k[src + ab.y];
    ka = a * cs.x - b * cs.y;
    kb = a * cs.y + b * cs.x;
    k[src + ab.x] = ka;
    k[src + ab.y] = kb;
  } else {
    ab.x = n_rot + 2 * (i - half_rot);
    ab.y = ab.x + 1;
    ka = k[src + ab.x];
    kb = k[src + ab.y];
  }
  const int slot = meta[slot_off + t], blk = slot / block_size, off = slot - blk * block_size;
  const size_t dst = (((size_t)blk * n_kv_heads + g) * block_size + off) * head_dim;
  const float va = v[src + ab.x], vb = v[src + ab.y];
  if (f16) {
    vstore_half_rte(ka, dst + ab.x, (global half*)kc);
    vstore_half_rte(kb, dst + ab.y, (global half*)kc);
    vstore_half_rte(va, dst + ab.x, (global half*)vc);
    vstore_half_rte(vb, dst + ab.y, (global half*)vc);
  } else {
    ((global float*)kc)[dst + ab.x] = ka;
    ((global float*)kc)[dst + ab.y] = kb;
    ((global float*)vc)[dst + ab.x] = va;
    ((global float*)vc)[dst + ab.y] = vb;
  }
}

// ---------------------------------------------------------------- attention
inline float kv_at(global const uchar* c, int f16, size_t i) {
  return f16 ? vload_half(i, (global const half*)c) : ((global const float*)c)[i];
}

// Flash-style paged attention. A work-group takes one tile of a sequence's
// query tokens (tiles[3 * group] = first row, tokens, sequence) and a chunk
// of heads of one KV head: up to ATT_ROWS (token, head) rows that share
// every key and value it loads. Keys come in chunks of ATT_CHUNK (never
// across a cache block) staged in local memory as float; thread (row r, lane)
// scores key `lane` of the chunk, then every thread of row r takes the
// row's ATT_CHUNK scores for the online-softmax update of the head_dim /
// ATT_LANES output values it owns (dims lane, lane + 16, ...).
// seqs[4 * s] = q_start, q_len, ctx_len, offset of its block table in bt.
// With n_split > 1 (decode of long contexts), split z of get_group_id(2)
// takes its share of the key range and writes (max, sum, unnormalised
// output) to part for attention_merge.
kernel __attribute__((reqd_work_group_size(ATT_WG, 1, 1))) void attention(
    global const float* q, global float* out, global const uchar* kc, global const uchar* vc, int f16,
    global const int* meta, int tiles_off, int seqs_off, int bt_off, int n_head, int group,
    int heads_per_wg, int head_splits, int n_kv_heads, int head_dim, int block_size, float scale, int window,
    float softcap, int n_split, int n_part_rows, global float* part, local float* qs, local float* kv, local float* sc) {
  const int lid = get_local_id(0);
  const int tile = get_group_id(0), gs = get_group_id(1), split = get_group_id(2);
  const int g = gs / head_splits, h0 = (gs - g * head_splits) * heads_per_wg;
  const int nh = min(heads_per_wg, group - h0);
  global const int* tiles = meta + tiles_off;
  global const int* seqs = meta + seqs_off;
  const int row0 = tiles[3 * tile], ntok = tiles[3 * tile + 1], si = tiles[3 * tile + 2];
  const int q_start = seqs[4 * si], q_len = seqs[4 * si + 1], ctx = seqs[4 * si + 2];
  global const int* table = meta + bt_off + seqs[4 * si + 3];
  const int D = head_dim, KS = D + 1;  // padded key rows: no bank conflicts in the scores
  const int R = ntok * nh;
  const int pos0 = ctx - q_len + (row0 - q_start);
  const size_t q_stride = (size_t)n_head * D;

  for (int i = lid; i < R * D; i += ATT_WG) {
    const int r = i / D, d = i - r * D;
    qs[i] = q[(size_t)(row0 + r / nh) * q_stride + (size_t)(g * group + h0 + r % nh) * D + d] * scale;
  }
  const int r = lid / ATT_LANES, lane = lid - r * ATT_LANES;
  const bool active = r < R;
  const int p = pos0 + (active ? r / nh : 0);
  float acc[ATT_MAX_D / ATT_LANES];
  for (int e = 0; e < ATT_MAX_D / ATT_LANES; ++e) acc[e] = 0.0f;
  float m = -INFINITY, l = 0.0f;

  int j0 = window > 0 ? max(0, pos0 - window + 1) : 0;
  int j1 = pos0 + ntok;
  if (n_split > 1) {
    const int span = j1 - j0, a = j0 + (int)((long)span * split / n_split);
    j1 = j0 + (int)((long)span * (split + 1) / n_split);
    j0 = a;
  }
  for (int j = j0; j < j1;) {
    const int blk = j / block_size, off = j - blk * block_size;
    const int cnt = min(ATT_CHUNK, min(block_size - off, j1 - j));
    const size_t base = (((size_t)table[blk] * n_kv_heads + g) * block_size + off) * D;
    barrier(CLK_LOCAL_MEM_FENCE);  // q staged; the last chunk's readers are done
    for (int i = lid; i < cnt * D; i += ATT_WG) {
      const int kk = i / D;
      kv[kk * KS + (i - kk * D)] = kv_at(kc, f16, base + i);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    float s = -INFINITY;
    const int jk = j + lane;
    if (active && lane < cnt && jk <= p && (window <= 0 || jk > p - window)) {
      local const float* qr = qs + r * D;
      local const float* kr = kv + lane * KS;
      float dsum = 0.0f;
      for (int d = 0; d < D; ++d) dsum = mad(qr[d], kr[d], dsum);
      s = softcap > 0.0f ? softcap * tanh(dsum / softcap) : dsum;
    }
    sc[r * ATT_CHUNK + lane] = s;
    barrier(CLK_LOCAL_MEM_FENCE);  // scores written, keys no longer read
    for (int i = lid; i < cnt * D; i += ATT_WG) {
      const int kk = i / D;
      kv[kk * KS + (i - kk * D)] = kv_at(vc, f16, base + i);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    // Constant trip counts with guards: the private arrays stay in registers.
    if (active) {
      local const float* sr = sc + r * ATT_CHUNK;
      float pk[ATT_CHUNK];
      float mx = m;
      // Keys in range and unmasked. Others' values are skipped, not weighted
      // by 0: a slot never written (the cache is not cleared) may hold NaN.
      uint live = 0;
#pragma unroll
      for (int k = 0; k < ATT_CHUNK; ++k) {
        pk[k] = sr[k];  // -INFINITY past cnt and where masked
        if (pk[k] != -INFINITY) live |= 1u << k;
        mx = fmax(mx, pk[k]);
      }
      if (mx != -INFINITY) {
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < ATT_CHUNK; ++k) {
          pk[k] = exp(pk[k] - mx);
          sum += pk[k];
        }
        const float corr = exp(m - mx);
        l = l * corr + sum;
        m = mx;
#pragma unroll
        for (int e = 0; e < ATT_MAX_D / ATT_LANES; ++e) {
          if (lane + e * ATT_LANES < D) {
            local const float* vv = kv + lane + e * ATT_LANES;
            float a = acc[e] * corr;
#pragma unroll
            for (int k = 0; k < ATT_CHUNK; ++k)
              if (live & (1u << k)) a = mad(pk[k], vv[k * KS], a);
            acc[e] = a;
          }
        }
      }
    }
    j += cnt;
  }
  if (!active) return;
  const int qh = g * group + h0 + r % nh;
  const size_t orow = (size_t)(row0 + r / nh) * q_stride + (size_t)qh * D;
  if (n_split > 1) {
    // part: [split][token row * n_head + head][max, sum, D values]
    const size_t row_id = (size_t)(row0 + r / nh) * n_head + qh;
    global float* pr = part + ((size_t)split * n_part_rows + row_id) * (2 + D);
    if (lane == 0) {
      pr[0] = m;
      pr[1] = l;
    }
#pragma unroll
    for (int e = 0; e < ATT_MAX_D / ATT_LANES; ++e)
      if (lane + e * ATT_LANES < D) pr[2 + lane + e * ATT_LANES] = acc[e];
    return;
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
  for (int e = 0; e < ATT_MAX_D / ATT_LANES; ++e)
    if (lane + e * ATT_LANES < D) out[orow + lane + e * ATT_LANES] = acc[e] * inv;
}

// Joins the n_split partial results of each (token, head) row: value d of
// work-item (d, row).
kernel void attention_merge(global const float* part, int n_split, int n_part_rows, int head_dim,
                            global float* out) {
  const int d = get_global_id(0), row = get_global_id(1);
  if (d >= head_dim || row >= n_part_rows) return;
  const size_t stride = (size_t)n_part_rows * (2 + head_dim);
  global const float* pr = part + (size_t)row * (2 + head_dim);
  float mx = -INFINITY;
  for (int s = 0; s < n_split; ++s) mx = fmax(mx, pr[s * stride]);
  float l = 0.0f, a = 0.0f;
  if (mx != -INFINITY) {
    for (int s = 0; s < n_split; ++s) {
      global const float* ps = pr + s * stride;
      if (ps[0] == -INFINITY) continue;  // this split saw no key of this row
      const float w = exp(ps[0] - mx);
      l += ps[1] * w;
      a += ps[2 + d] * w;
    }
  }
  out[(size_t)row * head_dim + d] = l > 0.0f ? a / l : 0.0f;
}
)CLC";

}  // namespace pagellm::opencl
