// Scalar reference conversions between float and the GGUF block formats.
// Dequantization does the same float operations in the same order as ggml /
// gguf-py, so the results are bit-identical to theirs. Quantizers of the
// legacy formats (Q4_0 .. Q8_0) follow ggml's reference quantizers exactly;
// the K-quant and IQ4 quantizers use a weighted least-squares search of each
// sub-block's scale (and min) before the scales themselves are quantized
// (not llama.cpp's searches: their bytes differ; MXFP4 follows gguf-py).
//
// No fused multiply-adds: a contracted a*b+c rounds differently, and these
// functions must give the same bits on every machine and build.
#pragma GCC optimize("fp-contract=off")

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/fp16.h"
#include "core/quant_blocks.h"

namespace pagellm {
namespace {

// ggml's roundf: halves away from zero.
inline int round_away(float x) { return static_cast<int>(std::round(x)); }

uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// ---- dequantization ---------------------------------------------------------

void dequant_q4_0(const BlockQ4_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK4_0) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < QK4_0 / 2; ++j) {
      y[j] = static_cast<float>((b[i].qs[j] & 0x0F) - 8) * d;
      y[j + QK4_0 / 2] = static_cast<float>((b[i].qs[j] >> 4) - 8) * d;
    }
  }
}

void dequant_q4_1(const BlockQ4_1* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK4_1) {
    const float d = fp16_to_fp32(b[i].d), m = fp16_to_fp32(b[i].m);
    for (int j = 0; j < QK4_1 / 2; ++j) {
      y[j] = static_cast<float>(b[i].qs[j] & 0x0F) * d + m;
      y[j + QK4_1 / 2] = static_cast<float>(b[i].qs[j] >> 4) * d + m;
    }
  }
}

void dequant_q5_0(const BlockQ5_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK5_0) {
    const float d = fp16_to_fp32(b[i].d);
    const uint32_t qh = load_u32(b[i].qh);
    for (int j = 0; j < QK5_0 / 2; ++j) {
      const int h0 = ((qh >> j) & 1) << 4, h1 = ((qh >> (j + 16)) & 1) << 4;
      y[j] = static_cast<float>(((b[i].qs[j] & 0x0F) | h0) - 16) * d;
      y[j + QK5_0 / 2] = static_cast<float>(((b[i].qs[j] >> 4) | h1) - 16) * d;
    }
  }
}

void dequant_q5_1(const BlockQ5_1* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK5_1) {
    const float d = fp16_to_fp32(b[i].d), m = fp16_to_fp32(b[i].m);
    const uint32_t qh = load_u32(b[i].qh);
    for (int j = 0; j < QK5_1 / 2; ++j) {
      const int h0 = ((qh >> j) & 1) << 4, h1 = ((qh >> (j + 16)) & 1) << 4;
      y[j] = static_cast<float>((b[i].qs[j] & 0x0F) | h0) * d + m;
      y[j + QK5_1 / 2] = static_cast<float>((b[i].qs[j] >> 4) | h1) * d + m;
    }
  }
}

void dequant_q8_0(const BlockQ8_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK8_0) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < QK8_0; ++j) y[j] = static_cast<float>(b[i].qs[j]) * d;
  }
}

void dequant_q8_1(const BlockQ8_1* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK8_1) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < QK8_1; ++j) y[j] = static_cast<float>(b[i].qs[j]) * d;
  }
}

void dequant_q4_k(const BlockQ4_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(b[i].d), dmin = fp16_to_fp32(b[i].dmin);
    const uint8_t* q = b[i].qs;
    for (int c = 0; c < QK_K / 64; ++c, q += 32) {
      uint8_t sc, m;
      kquant_scale_min(2 * c, b[i].scales, sc, m);
      const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
      kquant_scale_min(2 * c + 1, b[i].scales, sc, m);
      const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0x0F) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  }
}

void dequant_q5_k(const BlockQ5_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(b[i].d), dmin = fp16_to_fp32(b[i].dmin);
    const uint8_t* q = b[i].qs;
    const uint8_t* qh = b[i].qh;
    for (int c = 0; c < QK_K / 64; ++c, q += 32) {
      uint8_t sc, m;
      kquant_scale_min(2 * c, b[i].scales, sc, m);
      const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
      kquant_scale_min(2 * c + 1, b[i].scales, sc, m);
      const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
      const int s1 = 2 * c, s2 = 2 * c + 1;  // bit of qh[l] holding the 5th bit
      for (int l = 0; l < 32; ++l)
        *y++ = d1 * static_cast<float>((q[l] & 0x0F) | (((qh[l] >> s1) & 1) << 4)) - m1;
      for (int l = 0; l < 32; ++l)
        *y++ = d2 * static_cast<float>((q[l] >> 4) | (((qh[l] >> s2) & 1) << 4)) - m2;
    }
  }
}

void dequant_q6_k(const BlockQ6_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = b[i].ql + 64 * h;
      const uint8_t* qh = b[i].qh + 32 * h;
      const int8_t* sc = b[i].scales + 8 * h;
      float* yh = y + 128 * h;
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        yh[l] = d * static_cast<float>(sc[is + 0]) * static_cast<float>(q1);
        yh[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        yh[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        yh[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
    }
    y += QK_K;
  }
}

void dequant_q2_k(const BlockQ2_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(b[i].d), dmin = fp16_to_fp32(b[i].dmin);
    for (int e = 0; e < QK_K; ++e) {
      const uint8_t sc = b[i].scales[e / 16];
      const float dl = d * static_cast<float>(sc & 0x0F), ml = dmin * static_cast<float>(sc >> 4);
      y[e] = dl * static_cast<float>(q2k_low_bits(b[i].qs, e)) - ml;
    }
    y += QK_K;
  }
}

void dequant_q3_k(const BlockQ3_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    int8_t sc[16];
    q3k_scales(b[i].scales, sc);
    for (int e = 0; e < QK_K; ++e) {
      const int low = q2k_low_bits(b[i].qs, e), high = q3k_high_bit(b[i].hmask, e);
      const float dl = d * static_cast<float>(sc[e / 16]);
      y[e] = dl * static_cast<float>(low - (high ? 0 : 4));
    }
    y += QK_K;
  }
}

// 32 values from 16 bytes of 4-bit indices into a level table (low nibbles
// are the first 16), times d: an IQ4_NL or MXFP4 block, an IQ4_XS sub-block.
void dequant_nibble_levels(const uint8_t* q, const int8_t* levels, float d, float* y) {
  for (int l = 0; l < 16; ++l) {
    y[l] = d * static_cast<float>(levels[q[l] & 0x0F]);
    y[l + 16] = d * static_cast<float>(levels[q[l] >> 4]);
  }
}
static_assert(QK4_NL == 32 && QK_MXFP4 == 32);

void dequant_iq4_nl(const BlockIQ4_NL* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK4_NL) dequant_nibble_levels(b[i].qs, kIQ4NLValues, fp16_to_fp32(b[i].d), y);
}

void dequant_iq4_xs(const BlockIQ4_XS* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < QK_K / 32; ++j, y += 32)
      dequant_nibble_levels(b[i].qs + 16 * j, kIQ4NLValues, d * static_cast<float>(iq4xs_scale(b[i], j)), y);
  }
}

void dequant_mxfp4(const BlockMXFP4* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK_MXFP4)
    dequant_nibble_levels(b[i].qs, kMXFP4Values, e8m0_to_fp32_half(b[i].e), y);
}

void dequant_q8_k(const BlockQ8_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK_K)
    for (int j = 0; j < QK_K; ++j) y[j] = b[i].d * static_cast<float>(b[i].qs[j]);
}

// ---- legacy quantizers (ggml's reference behaviour) -------------------------

// The element of largest magnitude, with its sign (first one on ties).
float signed_absmax(const float* x, int n) {
  float amax = 0, max = 0;
  for (int j = 0; j < n; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

void quant_q4_0(const float* x, BlockQ4_0* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK4_0) {
    const float d = signed_absmax(x, QK4_0) / -8;  // the extreme maps to -8
    const float id = d != 0 ? 1.0f / d : 0.0f;
    b[i].d = fp32_to_fp16(d);
    for (int j = 0; j < QK4_0 / 2; ++j) {
      const int q0 = std::min(15, static_cast<int>(x[j] * id + 8.5f));
      const int q1 = std::min(15, static_cast<int>(x[j + QK4_0 / 2] * id + 8.5f));
      b[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void quant_q4_1(const float* x, BlockQ4_1* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK4_1) {
    float min = x[0], max = x[0];
    for (int j = 1; j < QK4_1; ++j) {
      min = std::min(min, x[j]);
      max = std::max(max, x[j]);
    }
    const float d = (max - min) / 15;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    b[i].d = fp32_to_fp16(d);
    b[i].m = fp32_to_fp16(min);
    for (int j = 0; j < QK4_1 / 2; ++j) {
      const int q0 = std::min(15, static_cast<int>((x[j] - min) * id + 0.5f));
      const int q1 = std::min(15, static_cast<int>((x[j + QK4_1 / 2] - min) * id + 0.5f));
      b[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void quant_q5_0(const float* x, BlockQ5_0* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK5_0) {
    const float d = signed_absmax(x, QK5_0) / -16;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    b[i].d = fp32_to_fp16(d);
    uint32_t qh = 0;
    for (int j = 0; j < QK5_0 / 2; ++j) {
      const int q0 = std::min(31, static_cast<int>(x[j] * id + 16.5f));
      const int q1 = std::min(31, static_cast<int>(x[j + QK5_0 / 2] * id + 16.5f));
      b[i].qs[j] = static_cast<uint8_t>((q0 & 0x0F) | ((q1 & 0x0F) << 4));
      qh |= static_cast<uint32_t>((q0 >> 4) & 1) << j;
      qh |= static_cast<uint32_t>((q1 >> 4) & 1) << (j + QK5_0 / 2);
    }
    std::memcpy(b[i].qh, &qh, 4);
  }
}

void quant_q5_1(const float* x, BlockQ5_1* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK5_1) {
    float min = x[0], max = x[0];
    for (int j = 1; j < QK5_1; ++j) {
      min = std::min(min, x[j]);
      max = std::max(max, x[j]);
    }
    const float d = (max - min) / 31;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    b[i].d = fp32_to_fp16(d);
    b[i].m = fp32_to_fp16(min);
    uint32_t qh = 0;
    for (int j = 0; j < QK5_1 / 2; ++j) {
      const int q0 = std::min(31, static_cast<int>((x[j] - min) * id + 0.5f));
      const int q1 = std::min(31, static_cast<int>((x[j + QK5_1 / 2] - min) * id + 0.5f));
      b[i].qs[j] = static_cast<uint8_t>((q0 & 0x0F) | ((q1 & 0x0F) << 4));
      qh |= static_cast<uint32_t>((q0 >> 4) & 1) << j;
      qh |= static_cast<uint32_t>((q1 >> 4) & 1) << (j + QK5_1 / 2);
    }
    std::memcpy(b[i].qh, &qh, 4);
  }
}

// ---- K-quant quantizers ------------------------------------------------------

// Fits x[i] ~ scale * L[i] - min with L[i] in [0, nmax] (min >= 0), minimizing
// sum w[i] * err^2: tries a range of step sizes around (max - min) / nmax and
// refits (scale, min) by least squares for each rounding. Returns the scale,
// writes min (as a positive offset) and L.
float fit_scale_min(const float* x, const float* w, int n, int nmax, uint8_t* L, float& min_out) {
  float lo = x[0], hi = x[0];
  for (int i = 1; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  lo = std::min(lo, 0.0f);  // the offset only ever shifts down
  if (hi <= lo) {
    std::fill(L, L + n, 0);
    min_out = -lo;
    return 0;
  }
  float sum_w = 0, sum_x = 0;
  for (int i = 0; i < n; ++i) {
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  auto error_of = [&](float scale, float min) {
    float err = 0;
    for (int i = 0; i < n; ++i) {
      const float diff = scale * static_cast<float>(L[i]) + min - x[i];
      err += w[i] * diff * diff;
    }
    return err;
  };

  float best_scale = (hi - lo) / static_cast<float>(nmax), best_min = lo;
  {
    const float iscale = static_cast<float>(nmax) / (hi - lo);
    for (int i = 0; i < n; ++i) L[i] = static_cast<uint8_t>(std::clamp(round_away(iscale * (x[i] - lo)), 0, nmax));
  }
  float best_err = error_of(best_scale, best_min);
  uint8_t trial[QK_K];
  uint8_t best_L[QK_K];
  std::copy(L, L + n, best_L);
  // Step sizes from (nmax - 1) / range to (nmax + 1) / range.
  constexpr int kSteps = 20;
  for (int step = 0; step <= kSteps; ++step) {
    const float iscale = (static_cast<float>(nmax) - 1.0f + 2.0f * static_cast<float>(step) / kSteps) / (hi - lo);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(round_away(iscale * (x[i] - lo)), 0, nmax);
      trial[i] = static_cast<uint8_t>(l);
      const float fl = static_cast<float>(l);
      sum_l += w[i] * fl;
      sum_l2 += w[i] * fl * fl;
      sum_xl += w[i] * fl * x[i];
    }
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (!(det > 0)) continue;
    float scale = (sum_w * sum_xl - sum_x * sum_l) / det;
    float min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
    if (min > 0) {  // the model has no positive offset: refit the scale alone
      min = 0;
      scale = sum_l2 > 0 ? sum_xl / sum_l2 : 0;
    }
    std::copy(trial, trial + n, L);
    const float err = error_of(scale, min);
    if (err < best_err) {
      best_err = err;
      best_scale = scale;
      best_min = min;
      std::copy(trial, trial + n, best_L);
    }
  }
  std::copy(best_L, best_L + n, L);
  min_out = -best_min;
  return best_scale;
}

// Packs 6-bit scales and mins of 8 sub-blocks into the 12-byte K layout.
void pack_scale_min(const uint8_t* sc, const uint8_t* m, uint8_t* q) {
  for (int j = 0; j < 4; ++j) {
    q[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    q[j + 4] = static_cast<uint8_t>((m[j] & 63) | ((m[j + 4] >> 4) << 6));
    q[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0x0F) | ((m[j + 4] & 0x0F) << 4));
  }
}

// Shared by Q4_K and Q5_K: levels L[256] in [0, nmax], d/dmin and packed scales.
void quant_k_asym(const float* x, int nmax, uint16_t& d_out, uint16_t& dmin_out, uint8_t* scales_out,
                  uint8_t* L) {
  constexpr int kSub = 32, kNumSub = QK_K / kSub;
  float scales[kNumSub], mins[kNumSub], w[kSub];
  float sum_x2 = 0;
  for (int l = 0; l < QK_K; ++l) sum_x2 += x[l] * x[l];
  const float av_x = std::sqrt(sum_x2 / QK_K);
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < kNumSub; ++j) {
    // Larger values matter more, but every value keeps some weight.
    for (int l = 0; l < kSub; ++l) w[l] = av_x + std::fabs(x[kSub * j + l]);
    scales[j] = fit_scale_min(x + kSub * j, w, kSub, nmax, L + kSub * j, mins[j]);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
  uint8_t ls[kNumSub], lm[kNumSub];
  for (int j = 0; j < kNumSub; ++j) {
    ls[j] = static_cast<uint8_t>(std::min(63, round_away(inv_scale * scales[j])));
    lm[j] = static_cast<uint8_t>(std::min(63, round_away(inv_min * mins[j])));
  }
  pack_scale_min(ls, lm, scales_out);
  d_out = fp32_to_fp16(max_scale / 63.0f);
  dmin_out = fp32_to_fp16(max_min / 63.0f);
  // Requantize against the scales as they will be read back.
  const float d = fp16_to_fp32(d_out), dmin = fp16_to_fp32(dmin_out);
  for (int j = 0; j < kNumSub; ++j) {
    const float dl = d * static_cast<float>(ls[j]);
    if (dl == 0) {
      std::fill(L + kSub * j, L + kSub * (j + 1), 0);
      continue;
    }
    const float dm = dmin * static_cast<float>(lm[j]);
    for (int l = 0; l < kSub; ++l)
      L[kSub * j + l] = static_cast<uint8_t>(std::clamp(round_away((x[kSub * j + l] + dm) / dl), 0, nmax));
  }
}

void quant_q4_k(const float* x, BlockQ4_K* b, int64_t nb) {
  uint8_t L[QK_K];
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    quant_k_asym(x, 15, b[i].d, b[i].dmin, b[i].scales, L);
    for (int c = 0; c < QK_K / 64; ++c)
      for (int l = 0; l < 32; ++l)
        b[i].qs[32 * c + l] = static_cast<uint8_t>(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
  }
}

void quant_q5_k(const float* x, BlockQ5_K* b, int64_t nb) {
  uint8_t L[QK_K];
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    quant_k_asym(x, 31, b[i].d, b[i].dmin, b[i].scales, L);
    std::memset(b[i].qh, 0, sizeof(b[i].qh));
    for (int c = 0; c < QK_K / 64; ++c) {
      for (int l = 0; l < 32; ++l) {
        const int lo = L[64 * c + l], hi = L[64 * c + 32 + l];
        b[i].qs[32 * c + l] = static_cast<uint8_t>((lo & 0x0F) | ((hi & 0x0F) << 4));
        b[i].qh[l] |= static_cast<uint8_t>(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
      }
    }
  }
}

// Symmetric fit x ~ scale * L, L in [-half, half - 1], weighted by x^2:
// tries step sizes around max / half and keeps the one whose least-squares
// scale explains the most of x (n <= 16).
float fit_scale_sym(const float* x, int n, int half, int8_t* L) {
  float amax = 0, max = 0;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  if (amax < 1e-30f) {
    std::fill(L, L + n, 0);
    return 0;
  }
  float best_scale = 0, best_score = -1;
  for (int step = -9; step <= 9; ++step) {
    // The extreme maps to -half (the side with one more level).
    const float iscale = -(static_cast<float>(half) + 0.1f * static_cast<float>(step)) / max;
    float sum_lx = 0, sum_l2 = 0;
    int8_t trial[16];
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(round_away(iscale * x[i]), -half, half - 1);
      trial[i] = static_cast<int8_t>(l);
      const float w = x[i] * x[i], fl = static_cast<float>(l);
      sum_lx += w * x[i] * fl;
      sum_l2 += w * fl * fl;
    }
    if (!(sum_l2 > 0)) continue;
    const float score = sum_lx * sum_lx / sum_l2;  // error reduction of the LS fit
    if (score > best_score) {
      best_score = score;
      best_scale = sum_lx / sum_l2;
      std::copy(trial, trial + n, L);
    }
  }
  return best_scale;
}

void quant_q6_k(const float* x, BlockQ6_K* b, int64_t nb) {
  constexpr int kSub = 16, kNumSub = QK_K / kSub;
  int8_t L[QK_K];
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    float scales[kNumSub];
    float max_scale = 0, amax_scale = 0;
    for (int j = 0; j < kNumSub; ++j) {
      scales[j] = fit_scale_sym(x + kSub * j, kSub, 32, L + kSub * j);
      if (std::fabs(scales[j]) > amax_scale) {
        amax_scale = std::fabs(scales[j]);
        max_scale = scales[j];
      }
    }
    std::memset(b[i].ql, 0, sizeof(b[i].ql));
    std::memset(b[i].qh, 0, sizeof(b[i].qh));
    if (amax_scale < 1e-30f) {
      std::memset(b[i].scales, 0, sizeof(b[i].scales));
      b[i].d = 0;
      for (int h = 0; h < 2; ++h)  // all levels at the zero point (32)
        for (int l = 0; l < 32; ++l) b[i].qh[32 * h + l] = 0xAA;
      continue;
    }
    const float iscale = -128.0f / max_scale;
    b[i].d = fp32_to_fp16(1.0f / iscale);
    const float d = fp16_to_fp32(b[i].d);
    uint8_t q[QK_K];
    for (int j = 0; j < kNumSub; ++j) {
      const int sc = std::min(127, round_away(iscale * scales[j]));
      b[i].scales[j] = static_cast<int8_t>(sc);
      const float dl = d * static_cast<float>(sc);
      for (int l = 0; l < kSub; ++l) {
        const int v = dl != 0 ? std::clamp(round_away(x[kSub * j + l] / dl), -32, 31) : 0;
        q[kSub * j + l] = static_cast<uint8_t>(v + 32);
      }
    }
    for (int h = 0; h < 2; ++h) {
      uint8_t* ql = b[i].ql + 64 * h;
      uint8_t* qh = b[i].qh + 32 * h;
      const uint8_t* qq = q + 128 * h;
      for (int l = 0; l < 32; ++l) {
        const int q1 = qq[l], q2 = qq[l + 32], q3 = qq[l + 64], q4 = qq[l + 96];
        ql[l] = static_cast<uint8_t>((q1 & 0x0F) | ((q3 & 0x0F) << 4));
        ql[l + 32] = static_cast<uint8_t>((q2 & 0x0F) | ((q4 & 0x0F) << 4));
        qh[l] = static_cast<uint8_t>((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
      }
    }
  }
}

// ---- Q2_K / Q3_K quantizers ----------------------------------------------------
// Our own searches (simpler than llama.cpp's make_qkx2 / make_q3_quants, so
// the bytes differ from its quantizer); the format is the same.

void quant_q2_k(const float* x, BlockQ2_K* b, int64_t nb) {
  constexpr int kSub = 16, kNumSub = QK_K / kSub;
  uint8_t L[QK_K];
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    float scales[kNumSub], mins[kNumSub], w[kSub];
    float sum_x2 = 0;
    for (int l = 0; l < QK_K; ++l) sum_x2 += x[l] * x[l];
    const float av_x = std::sqrt(sum_x2 / QK_K);
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < kNumSub; ++j) {
      for (int l = 0; l < kSub; ++l) w[l] = av_x + std::fabs(x[kSub * j + l]);
      scales[j] = fit_scale_min(x + kSub * j, w, kSub, 3, L + kSub * j, mins[j]);
      max_scale = std::max(max_scale, scales[j]);
      max_min = std::max(max_min, mins[j]);
    }
    const float inv_scale = max_scale > 0 ? 15.0f / max_scale : 0.0f;
    const float inv_min = max_min > 0 ? 15.0f / max_min : 0.0f;
    uint8_t ls[kNumSub], lm[kNumSub];
    for (int j = 0; j < kNumSub; ++j) {
      ls[j] = static_cast<uint8_t>(std::clamp(round_away(inv_scale * scales[j]), 0, 15));
      lm[j] = static_cast<uint8_t>(std::clamp(round_away(inv_min * mins[j]), 0, 15));
      b[i].scales[j] = static_cast<uint8_t>(ls[j] | (lm[j] << 4));
    }
    b[i].d = fp32_to_fp16(max_scale / 15.0f);
    b[i].dmin = fp32_to_fp16(max_min / 15.0f);
    // Requantize against the scales as they will be read back.
    const float d = fp16_to_fp32(b[i].d), dmin = fp16_to_fp32(b[i].dmin);
    for (int j = 0; j < kNumSub; ++j) {
      const float dl = d * static_cast<float>(ls[j]), dm = dmin * static_cast<float>(lm[j]);
      for (int l = 0; l < kSub; ++l)
        L[kSub * j + l] =
            dl == 0 ? 0 : static_cast<uint8_t>(std::clamp(round_away((x[kSub * j + l] + dm) / dl), 0, 3));
    }
    std::memset(b[i].qs, 0, sizeof(b[i].qs));
    for (int e = 0; e < QK_K; ++e) b[i].qs[32 * (e / 128) + e % 32] |= static_cast<uint8_t>(L[e] << (2 * ((e / 32) % 4)));
  }
}

void quant_q3_k(const float* x, BlockQ3_K* b, int64_t nb) {
  constexpr int kSub = 16, kNumSub = QK_K / kSub;
  int8_t L[QK_K];
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    float scales[kNumSub];
    float max_scale = 0, amax_scale = 0;
    for (int j = 0; j < kNumSub; ++j) {
      scales[j] = fit_scale_sym(x + kSub * j, kSub, 4, L + kSub * j);
      if (std::fabs(scales[j]) > amax_scale) {
        amax_scale = std::fabs(scales[j]);
        max_scale = scales[j];
      }
    }
    int sc[kNumSub];
    if (amax_scale < 1e-30f) {
      b[i].d = 0;
      std::fill(sc, sc + kNumSub, 0);
      std::fill(L, L + QK_K, 0);
    } else {
      const float iscale = -32.0f / max_scale;  // the largest scale maps to -32
      b[i].d = fp32_to_fp16(1.0f / iscale);
      const float d = fp16_to_fp32(b[i].d);
      for (int j = 0; j < kNumSub; ++j) {
        sc[j] = std::clamp(round_away(iscale * scales[j]), -32, 31);
        const float dl = d * static_cast<float>(sc[j]);
        for (int l = 0; l < kSub; ++l)
          L[kSub * j + l] = static_cast<int8_t>(dl != 0 ? std::clamp(round_away(x[kSub * j + l] / dl), -4, 3) : 0);
      }
    }
    std::memset(b[i].scales, 0, sizeof(b[i].scales));
    for (int k = 0; k < kNumSub; ++k) {
      const int v = sc[k] + 32;
      if (k < 8) b[i].scales[k] |= static_cast<uint8_t>(v & 0x0F);
      else b[i].scales[k - 8] |= static_cast<uint8_t>((v & 0x0F) << 4);
      b[i].scales[8 + k % 4] |= static_cast<uint8_t>((v >> 4) << (2 * (k / 4)));
    }
    std::memset(b[i].qs, 0, sizeof(b[i].qs));
    std::memset(b[i].hmask, 0, sizeof(b[i].hmask));
    for (int e = 0; e < QK_K; ++e) {
      const int q = L[e] + 4;  // 0..7: low 2 bits in qs, bit 2 in hmask
      b[i].qs[32 * (e / 128) + e % 32] |= static_cast<uint8_t>((q & 3) << (2 * ((e / 32) % 4)));
      if (q & 4) b[i].hmask[e % 32] |= static_cast<uint8_t>(1 << (e / 32));
    }
  }
}

// ---- IQ4_NL / IQ4_XS / MXFP4 quantizers --------------------------------------

// Index of the IQ4_NL level nearest to v (the levels ascend; ties go up).
int nearest_iq4(float v) {
  if (v <= kIQ4NLValues[0]) return 0;
  if (v >= kIQ4NLValues[15]) return 15;
  int lo = 0, hi = 15;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (v < static_cast<float>(kIQ4NLValues[mid])) hi = mid;
    else lo = mid;
  }
  return v - static_cast<float>(kIQ4NLValues[lo]) < static_cast<float>(kIQ4NLValues[hi]) - v ? lo : hi;
}

// Fits x ~ s * kIQ4NLValues[q] over n <= 32 values, weighted by av + |x|:
// tries inverse scales around -127 / max (the extreme on the -127 level) and
// keeps the least-squares s that explains the most of x. Returns s.
float fit_iq4(const float* x, int n, float av) {
  float amax = 0, max = 0;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  if (amax < 1e-30f) return 0;
  float best_s = max / static_cast<float>(kIQ4NLValues[0]), best_score = -1;
  for (int step = -7; step <= 7; ++step) {
    const float id = (static_cast<float>(kIQ4NLValues[0]) + static_cast<float>(step)) / max;
    float sum_xv = 0, sum_v2 = 0;
    for (int i = 0; i < n; ++i) {
      const float v = static_cast<float>(kIQ4NLValues[nearest_iq4(id * x[i])]);
      const float w = av + std::fabs(x[i]);
      sum_xv += w * x[i] * v;
      sum_v2 += w * v * v;
    }
    if (!(sum_v2 > 0)) continue;
    const float score = sum_xv * sum_xv / sum_v2;
    if (score > best_score) {
      best_score = score;
      best_s = sum_xv / sum_v2;
    }
  }
  return best_s;
}

// Packs the levels nearest to x / dl as IQ4_NL nibbles (elements j, j + 16 in byte j).
void pack_iq4(const float* x, float dl, uint8_t* qs) {
  const float id = dl != 0 ? 1.0f / dl : 0.0f;
  for (int j = 0; j < 16; ++j)
    qs[j] = static_cast<uint8_t>(nearest_iq4(id * x[j]) | (nearest_iq4(id * x[j + 16]) << 4));
}

float rms(const float* x, int n) {
  float s = 0;
  for (int i = 0; i < n; ++i) s += x[i] * x[i];
  return std::sqrt(s / static_cast<float>(n));
}

void quant_iq4_nl(const float* x, BlockIQ4_NL* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK4_NL) {
    b[i].d = fp32_to_fp16(fit_iq4(x, QK4_NL, rms(x, QK4_NL)));
    pack_iq4(x, fp16_to_fp32(b[i].d), b[i].qs);
  }
}

void quant_iq4_xs(const float* x, BlockIQ4_XS* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    const float av = rms(x, QK_K);
    float scales[8], max_scale = 0, amax_scale = 0;
    for (int j = 0; j < 8; ++j) {
      scales[j] = fit_iq4(x + 32 * j, 32, av);
      if (std::fabs(scales[j]) > amax_scale) {
        amax_scale = std::fabs(scales[j]);
        max_scale = scales[j];
      }
    }
    b[i].d = fp32_to_fp16(amax_scale < 1e-30f ? 0.0f : -max_scale / 32.0f);  // the largest maps to -32
    const float d = fp16_to_fp32(b[i].d);
    b[i].scales_h = 0;
    std::memset(b[i].scales_l, 0, sizeof(b[i].scales_l));
    for (int j = 0; j < 8; ++j) {
      const int ls = d != 0 ? std::clamp(round_away(scales[j] / d), -32, 31) : 0;
      const int v = ls + 32;
      b[i].scales_l[j / 2] |= static_cast<uint8_t>((v & 0x0F) << (4 * (j % 2)));
      b[i].scales_h = static_cast<uint16_t>(b[i].scales_h | ((v >> 4) << (2 * j)));
      pack_iq4(x + 32 * j, d * static_cast<float>(ls), b[i].qs + 16 * j);
    }
  }
}

// As gguf-py's quantizer: the shared exponent puts the block's largest
// magnitude in [4, 8) times the halved scale (e2m1 tops out at 6, doubled 12),
// then each value takes the nearest level (the first one on ties).
void quant_mxfp4(const float* x, BlockMXFP4* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK_MXFP4) {
    float amax = 0;
    for (int j = 0; j < QK_MXFP4; ++j) amax = std::max(amax, std::fabs(x[j]));
    int e = 0;
    if (amax > 0) {
      int ex = 0;
      std::frexp(amax, &ex);  // amax = m * 2^ex, m in [0.5, 1): floor(log2(amax)) = ex - 1
      e = std::clamp(ex - 1 - 2 + 127, 0, 255);
    }
    b[i].e = static_cast<uint8_t>(e);
    const float d = e8m0_to_fp32_half(b[i].e);
    uint8_t q[QK_MXFP4];
    for (int j = 0; j < QK_MXFP4; ++j) {
      int best = 0;
      float best_err = std::fabs(d * static_cast<float>(kMXFP4Values[0]) - x[j]);
      for (int k = 1; k < 16; ++k) {
        const float err = std::fabs(d * static_cast<float>(kMXFP4Values[k]) - x[j]);
        if (err < best_err) {
          best_err = err;
          best = k;
        }
      }
      q[j] = static_cast<uint8_t>(best);
    }
    for (int j = 0; j < QK_MXFP4 / 2; ++j) b[i].qs[j] = static_cast<uint8_t>(q[j] | (q[j + 16] << 4));
  }
}

}  // namespace

// ---- 8-bit activation formats (shared with the scalar kernels) ---------------

namespace quant_ref {

void quantize_q8_0(const float* x, BlockQ8_0* b, int64_t n) {
  for (int64_t i = 0; i < n / QK8_0; ++i, x += QK8_0) {
    float amax = 0;
    for (int j = 0; j < QK8_0; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    b[i].d = fp32_to_fp16(d);
    for (int j = 0; j < QK8_0; ++j) b[i].qs[j] = static_cast<int8_t>(round_away(x[j] * id));
  }
}

void quantize_q8_1(const float* x, BlockQ8_1* b, int64_t n) {
  for (int64_t i = 0; i < n / QK8_1; ++i, x += QK8_1) {
    float amax = 0;
    for (int j = 0; j < QK8_1; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    int sum = 0;
    for (int j = 0; j < QK8_1; ++j) {
      b[i].qs[j] = static_cast<int8_t>(round_away(x[j] * id));
      sum += b[i].qs[j];
    }
    b[i].d = fp32_to_fp16(d);
    b[i].s = fp32_to_fp16(static_cast<float>(sum) * d);
  }
}

void quantize_q8_K(const float* x, BlockQ8_K* b, int64_t n) {
  for (int64_t i = 0; i < n / QK_K; ++i, x += QK_K) {
    float amax = 0;
    for (int j = 0; j < QK_K; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    b[i].d = d;
    for (int j = 0; j < QK_K; ++j) b[i].qs[j] = static_cast<int8_t>(round_away(x[j] * id));
    for (int g = 0; g < QK_K / 16; ++g) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) sum += b[i].qs[16 * g + l];
      b[i].bsums[g] = static_cast<int16_t>(sum);
    }
  }
}

}  // namespace quant_ref

void kquant_scale_min(int j, const uint8_t* q, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = static_cast<uint8_t>((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4));
    m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

void q3k_scales(const uint8_t* p, int8_t* out) {
  for (int k = 0; k < 16; ++k) {
    const int low = k < 8 ? p[k] & 0x0F : p[k - 8] >> 4;
    const int high = (p[8 + k % 4] >> (2 * (k / 4))) & 3;
    out[k] = static_cast<int8_t>((low | (high << 4)) - 32);
  }
}

static void check_row(DType type, int64_t n, const char* what) {
  const int bs = dtype_block_size(type);
  PAGELLM_CHECK(n >= 0 && n % bs == 0, "{}: {} elements is not a multiple of {}'s block size {}", what, n,
                dtype_name(type), bs);
}

std::vector<float> dequantize_rows_ref(DType type, const void* src, int64_t rows, int64_t cols) {
  std::vector<float> out(static_cast<size_t>(rows * cols));
  const size_t row_bytes = dtype_row_bytes(type, cols);
  for (int64_t r = 0; r < rows; ++r)
    dequantize_row_ref(type, static_cast<const uint8_t*>(src) + static_cast<size_t>(r) * row_bytes,
                       out.data() + r * cols, cols);
  return out;
}

void dequantize_row_ref(DType type, const void* src, float* dst, int64_t n) {
  check_row(type, n, "dequantize_row_ref");
  const int64_t nb = n / dtype_block_size(type);
  switch (type) {
    case DType::F32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); return;
    case DType::F16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(s[i]);
      return;
    }
    case DType::BF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(s[i]);
      return;
    }
    case DType::Q4_0: return dequant_q4_0(static_cast<const BlockQ4_0*>(src), dst, nb);
    case DType::Q4_1: return dequant_q4_1(static_cast<const BlockQ4_1*>(src), dst, nb);
    case DType::Q5_0: return dequant_q5_0(static_cast<const BlockQ5_0*>(src), dst, nb);
    case DType::Q5_1: return dequant_q5_1(static_cast<const BlockQ5_1*>(src), dst, nb);
    case DType::Q8_0: return dequant_q8_0(static_cast<const BlockQ8_0*>(src), dst, nb);
    case DType::Q8_1: return dequant_q8_1(static_cast<const BlockQ8_1*>(src), dst, nb);
    case DType::Q4_K: return dequant_q4_k(static_cast<const BlockQ4_K*>(src), dst, nb);
    case DType::Q5_K: return dequant_q5_k(static_cast<const BlockQ5_K*>(src), dst, nb);
    case DType::Q6_K: return dequant_q6_k(static_cast<const BlockQ6_K*>(src), dst, nb);
    case DType::Q8_K: return dequant_q8_k(static_cast<const BlockQ8_K*>(src), dst, nb);
    case DType::Q2_K: return dequant_q2_k(static_cast<const BlockQ2_K*>(src), dst, nb);
    case DType::Q3_K: return dequant_q3_k(static_cast<const BlockQ3_K*>(src), dst, nb);
    case DType::IQ4_NL: return dequant_iq4_nl(static_cast<const BlockIQ4_NL*>(src), dst, nb);
    case DType::IQ4_XS: return dequant_iq4_xs(static_cast<const BlockIQ4_XS*>(src), dst, nb);
    case DType::MXFP4: return dequant_mxfp4(static_cast<const BlockMXFP4*>(src), dst, nb);
    default: fail("dequantize: no kernel for tensor type {}", dtype_name(type));
  }
}

void quantize_row_ref(DType type, const float* src, void* dst, int64_t n) {
  check_row(type, n, "quantize_row_ref");
  const int64_t nb = n / dtype_block_size(type);
  switch (type) {
    case DType::F32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); return;
    case DType::F16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = fp32_to_fp16(src[i]);
      return;
    }
    case DType::BF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = fp32_to_bf16(src[i]);
      return;
    }
    case DType::Q4_0: return quant_q4_0(src, static_cast<BlockQ4_0*>(dst), nb);
    case DType::Q4_1: return quant_q4_1(src, static_cast<BlockQ4_1*>(dst), nb);
    case DType::Q5_0: return quant_q5_0(src, static_cast<BlockQ5_0*>(dst), nb);
    case DType::Q5_1: return quant_q5_1(src, static_cast<BlockQ5_1*>(dst), nb);
    case DType::Q8_0: return quant_ref::quantize_q8_0(src, static_cast<BlockQ8_0*>(dst), n);
    case DType::Q8_1: return quant_ref::quantize_q8_1(src, static_cast<BlockQ8_1*>(dst), n);
    case DType::Q4_K: return quant_q4_k(src, static_cast<BlockQ4_K*>(dst), nb);
    case DType::Q5_K: return quant_q5_k(src, static_cast<BlockQ5_K*>(dst), nb);
    case DType::Q6_K: return quant_q6_k(src, static_cast<BlockQ6_K*>(dst), nb);
    case DType::Q8_K: return quant_ref::quantize_q8_K(src, static_cast<BlockQ8_K*>(dst), n);
    case DType::Q2_K: return quant_q2_k(src, static_cast<BlockQ2_K*>(dst), nb);
    case DType::Q3_K: return quant_q3_k(src, static_cast<BlockQ3_K*>(dst), nb);
    case DType::IQ4_NL: return quant_iq4_nl(src, static_cast<BlockIQ4_NL*>(dst), nb);
    case DType::IQ4_XS: return quant_iq4_xs(src, static_cast<BlockIQ4_XS*>(dst), nb);
    case DType::MXFP4: return quant_mxfp4(src, static_cast<BlockMXFP4*>(dst), nb);
    default: fail("quantize: no quantizer for tensor type {}", dtype_name(type));
  }
}

}  // namespace pagellm
