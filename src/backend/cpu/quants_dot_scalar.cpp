// Portable dot products of a weight row with a quantized activation row.
// Integer sums are exact per block; the float part is one multiply per block.
// These define what the SIMD kernels must reproduce.
//
// No fused multiply-adds (as in core/quant_ref.cpp): aarch64's baseline has
// FMA, and GCC would contract `sum += isum * d` differently from kernel to
// kernel; the NEON kernels repeat these exact float steps.
#pragma GCC optimize("fp-contract=off")

#include <cstring>

#include "backend/cpu/quants_kernels.h"
#include "core/error.h"
#include "core/fp16.h"

namespace pagellm::cpu::scalar {
namespace {

uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

float dot_q4_0(int64_t nb, const BlockQ4_0* w, const BlockQ8_0* a) {
  float sum = 0;
  for (int64_t i = 0; i < nb; ++i) {
    int isum = 0;
    for (int j = 0; j < 16; ++j)
      isum += ((w[i].qs[j] & 0x0F) - 8) * a[i].qs[j] + ((w[i].qs[j] >> 4) - 8) * a[i].qs[j + 16];
    sum += static_cast<float>(isum) * (fp16_to_fp32(w[i].d) * fp16_to_fp32(a[i].d));
  }
  return sum;
}

float dot_q4_1(int64_t nb, const BlockQ4_1* w, const BlockQ8_1* a) {
  float sum = 0;
  for (int64_t i = 0; i < nb; ++i) {
    int isum = 0;
    for (int j = 0; j < 16; ++j) isum += (w[i].qs[j] & 0x0F) * a[i].qs[j] + (w[i].qs[j] >> 4) * a[i].qs[j + 16];
    sum += static_cast<float>(isum) * (fp16_to_fp32(w[i].d) * fp16_to_fp32(a[i].d)) +
           fp16_to_fp32(w[i].m) * fp16_to_fp32(a[i].s);
  }
  return sum;
}

float dot_q5_0(int64_t nb, const BlockQ5_0* w, const BlockQ8_0* a) {
  float sum = 0;
  for (int64_t i = 0; i < nb; ++i) {
    const uint32_t qh = load_u32(w[i].qh);
    int isum = 0;
    for (int j = 0; j < 16; ++j) {
      const int q0 = ((w[i].qs[j] & 0x0F) | (((qh >> j) & 1) << 4)) - 16;
      const int q1 = ((w[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16;
      isum += q0 * a[i].qs[j] + q1 * a[i].qs[j + 16];
    }
    sum += static_cast<float>(isum) * (fp16_to_fp32(w[i].d) * fp16_to_fp32(a[i].d));
  }
  return sum;
}

float dot_q5_1(int64_t nb, const BlockQ5_1* w, const BlockQ8_1* a) {
  float sum = 0;
  for (int64_t i = 0; i < nb; ++i) {
    const uint32_t qh = load_u32(w[i].qh);
    int isum = 0;
    for (int j = 0; j < 16; ++j) {
      const int q0 = (w[i].qs[j] & 0x0F) | (((qh >> j) & 1) << 4);
      const int q1 = (w[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
      isum += q0 * a[i].qs[j] + q1 * a[i].qs[j + 16];
    }
    sum += static_cast<float>(isum) * (fp16_to_fp32(w[i].d) * fp16_to_fp32(a[i].d)) +
           fp16_to_fp32(w[i].m) * fp16_to_fp32(a[i].s);
  }
  return sum;
}

float dot_q8_0(int64_t nb, const BlockQ8_0* w, const BlockQ8_0* a) {
  float sum = 0;
  for (int64_t i = 0; i < nb; ++i) {
    int isum = 0;
    for (int j = 0; j < 32; ++j) isum += w[i].qs[j] * a[i].qs[j];
    sum += static_cast<float>(isum) * (fp16_to_fp32(w[i].d) * fp16_to_fp32(a[i].d));
  }
  return sum;
}

// Sum over the 8 sub-blocks of 32 of min_j * (activation sum of sub-block j).
int kquant_min_sum(const uint8_t* scales, const int16_t* bsums) {
  int s = 0;
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    kquant_scale_min(j, scales, sc, m);
    s += m * (bsums[2 * j] + bsums[2 * j + 1]);
  }
  return s;
}

float dot_q4_k(int64_t nb, const BlockQ4_K* w, const BlockQ8_K* a) {
  float sum = 0;
  for (int64_t i = 0; i < nb; ++i) {
    int isum = 0;
    for (int c = 0; c < 4; ++c) {
      uint8_t sc_lo, sc_hi, m;
      kquant_scale_min(2 * c, w[i].scales, sc_lo, m);
      kquant_scale_min(2 * c + 1, w[i].scales, sc_hi, m);
      const uint8_t* q = w[i].qs + 32 * c;
      const int8_t* y = a[i].qs + 64 * c;
      int lo = 0, hi = 0;
      for (int l = 0; l < 32; ++l) {
        lo += (q[l] & 0x0F) * y[l];
        hi += (q[l] >> 4) * y[l + 32];
      }
      isum += sc_lo * lo + sc_hi * hi;
    }
    const int imin = kquant_min_sum(w[i].scales, a[i].bsums);
    sum += a[i].d * (fp16_to_fp32(w[i].d) * static_cast<float>(isum) -
                     fp16_to_fp32(w[i].dmin) * static_cast<float>(imin));
  }
  return sum;
}

float dot_q5_k(int64_t nb, const BlockQ5_K* w, const BlockQ8_K* a) {
  float sum = 0;
  for (int64_t i = 0; i < nb; ++i) {
    int isum = 0;
    for (int c = 0; c < 4; ++c) {
      uint8_t sc_lo, sc_hi, m;
      kquant_scale_min(2 * c, w[i].scales, sc_lo, m);
      kquant_scale_min(2 * c + 1, w[i].scales, sc_hi, m);
      const uint8_t* q = w[i].qs + 32 * c;
      const int8_t* y = a[i].qs + 64 * c;
      int lo = 0, hi = 0;
      for (int l = 0; l < 32; ++l) {
        lo += ((q[l] & 0x0F) | (((w[i].qh[l] >> (2 * c)) & 1) << 4)) * y[l];
        hi += ((q[l] >> 4) | (((w[i].qh[l] >> (2 * c + 1)) & 1) << 4)) * y[l + 32];
      }
      isum += sc_lo * lo + sc_hi * hi;
    }
    const int imin = kquant_min_sum(w[i].scales, a[i].bsums);
    sum += a[i].d * (fp16_to_fp32(w[i].d) * static_cast<float>(isum) -
                     fp16_to_fp32(w[i].dmin) * static_cast<float>(imin));
  }
  return sum;
}

float dot_q6_k(int64_t nb, const BlockQ6_K* w, const BlockQ8_K* a) {
  float sum = 0;
  for (int64_t i = 0; i < nb; ++i) {
    int isum = 0;
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = w[i].ql + 64 * h;
      const uint8_t* qh = w[i].qh + 32 * h;
      const int8_t* sc = w[i].scales + 8 * h;
      const int8_t* y = a[i].qs + 128 * h;
      int part[8] = {};  // per sub-block of 16
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        part[is + 0] += (((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32) * y[l];
        part[is + 2] += (((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32) * y[l + 32];
        part[is + 4] += (((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32) * y[l + 64];
        part[is + 6] += (((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32) * y[l + 96];
      }
      for (int s = 0; s < 8; ++s) isum += sc[s] * part[s];
    }
    sum += a[i].d * (fp16_to_fp32(w[i].d) * static_cast<float>(isum));
  }
  return sum;
}

// Level sums in the dequantizers' element order (see core/quant_blocks.h):
// element 128h + 32s + l of a Q2_K / Q3_K block is bits 2s..2s+1 of qs[32h + l].
float dot_q2_k(int64_t nb, const BlockQ2_K* w, const BlockQ8_K* a) {
  float sum = 0;
  for (int64_t i = 0; i < nb; ++i) {
    int isum = 0, imin = 0;
    for (int j = 0; j < 16; ++j) {
      int part = 0;
      for (int e = 16 * j; e < 16 * j + 16; ++e)
        part += q2k_low_bits(w[i].qs, e) * a[i].qs[e];
      isum += (w[i].scales[j] & 0x0F) * part;
      imin += (w[i].scales[j] >> 4) * a[i].bsums[j];
    }
    sum += a[i].d * (fp16_to_fp32(w[i].d) * static_cast<float>(isum) -
                     fp16_to_fp32(w[i].dmin) * static_cast<float>(imin));
  }
  return sum;
}

float dot_q3_k(int64_t nb, const BlockQ3_K* w, const BlockQ8_K* a) {
  float sum = 0;
  for (int64_t i = 0; i < nb; ++i) {
    int8_t sc[16];
    q3k_scales(w[i].scales, sc);
    int isum = 0;
    for (int j = 0; j < 16; ++j) {
      int part = 0;
      for (int e = 16 * j; e < 16 * j + 16; ++e) {
        const int low = q2k_low_bits(w[i].qs, e), high = q3k_high_bit(w[i].hmask, e);
        part += (low - (high ? 0 : 4)) * a[i].qs[e];
      }
      isum += sc[j] * part;
    }
    sum += a[i].d * (fp16_to_fp32(w[i].d) * static_cast<float>(isum));
  }
  return sum;
}

float dot_iq4_xs(int64_t nb, const BlockIQ4_XS* w, const BlockQ8_K* a) {
  float sum = 0;
  for (int64_t i = 0; i < nb; ++i) {
    int isum = 0;
    for (int j = 0; j < 8; ++j) {
      const uint8_t* q = w[i].qs + 16 * j;
      const int8_t* y = a[i].qs + 32 * j;
      int part = 0;
      for (int l = 0; l < 16; ++l) part += kIQ4NLValues[q[l] & 0x0F] * y[l] + kIQ4NLValues[q[l] >> 4] * y[l + 16];
      isum += iq4xs_scale(w[i], j) * part;
    }
    sum += a[i].d * (fp16_to_fp32(w[i].d) * static_cast<float>(isum));
  }
  return sum;
}

// IQ4_NL and MXFP4: a 16-entry level table on Q4_0's nibble layout.
template <typename Block, const int8_t* Levels, float (*Scale)(const Block&)>
float dot_table4(int64_t nb, const Block* w, const BlockQ8_0* a) {
  float sum = 0;
  for (int64_t i = 0; i < nb; ++i) {
    int isum = 0;
    for (int j = 0; j < 16; ++j) isum += Levels[w[i].qs[j] & 0x0F] * a[i].qs[j] + Levels[w[i].qs[j] >> 4] * a[i].qs[j + 16];
    sum += static_cast<float>(isum) * (Scale(w[i]) * fp16_to_fp32(a[i].d));
  }
  return sum;
}
float iq4nl_scale(const BlockIQ4_NL& b) { return fp16_to_fp32(b.d); }
float mxfp4_scale(const BlockMXFP4& b) { return e8m0_to_fp32_half(b.e); }

float dot_f32(int64_t n, const float* w, const float* x) {
  float s[4] = {};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int k = 0; k < 4; ++k) s[k] += w[i + k] * x[i + k];
  for (; i < n; ++i) s[0] += w[i] * x[i];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

template <float (*Convert)(uint16_t)>
float dot_half(int64_t n, const uint16_t* w, const float* x) {
  float s[4] = {};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int k = 0; k < 4; ++k) s[k] += Convert(w[i + k]) * x[i + k];
  for (; i < n; ++i) s[0] += Convert(w[i]) * x[i];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

}  // namespace

float vec_dot(DType type, int64_t n, const void* w, const void* a) {
  const int64_t nb = n / dtype_block_size(type);
  switch (type) {
    case DType::F32: return dot_f32(n, static_cast<const float*>(w), static_cast<const float*>(a));
    case DType::F16: return dot_half<fp16_to_fp32>(n, static_cast<const uint16_t*>(w), static_cast<const float*>(a));
    case DType::BF16: return dot_half<bf16_to_fp32>(n, static_cast<const uint16_t*>(w), static_cast<const float*>(a));
    case DType::Q4_0: return dot_q4_0(nb, static_cast<const BlockQ4_0*>(w), static_cast<const BlockQ8_0*>(a));
    case DType::Q4_1: return dot_q4_1(nb, static_cast<const BlockQ4_1*>(w), static_cast<const BlockQ8_1*>(a));
    case DType::Q5_0: return dot_q5_0(nb, static_cast<const BlockQ5_0*>(w), static_cast<const BlockQ8_0*>(a));
    case DType::Q5_1: return dot_q5_1(nb, static_cast<const BlockQ5_1*>(w), static_cast<const BlockQ8_1*>(a));
    case DType::Q8_0: return dot_q8_0(nb, static_cast<const BlockQ8_0*>(w), static_cast<const BlockQ8_0*>(a));
    case DType::Q4_K: return dot_q4_k(nb, static_cast<const BlockQ4_K*>(w), static_cast<const BlockQ8_K*>(a));
    case DType::Q5_K: return dot_q5_k(nb, static_cast<const BlockQ5_K*>(w), static_cast<const BlockQ8_K*>(a));
    case DType::Q6_K: return dot_q6_k(nb, static_cast<const BlockQ6_K*>(w), static_cast<const BlockQ8_K*>(a));
    case DType::Q2_K: return dot_q2_k(nb, static_cast<const BlockQ2_K*>(w), static_cast<const BlockQ8_K*>(a));
    case DType::Q3_K: return dot_q3_k(nb, static_cast<const BlockQ3_K*>(w), static_cast<const BlockQ8_K*>(a));
    case DType::IQ4_XS: return dot_iq4_xs(nb, static_cast<const BlockIQ4_XS*>(w), static_cast<const BlockQ8_K*>(a));
    case DType::IQ4_NL:
      return dot_table4<BlockIQ4_NL, kIQ4NLValues, iq4nl_scale>(nb, static_cast<const BlockIQ4_NL*>(w),
                                                               static_cast<const BlockQ8_0*>(a));
    case DType::MXFP4:
      return dot_table4<BlockMXFP4, kMXFP4Values, mxfp4_scale>(nb, static_cast<const BlockMXFP4*>(w),
                                                              static_cast<const BlockQ8_0*>(a));
    default: fail("vec_dot: no kernel for weight type {}", dtype_name(type));
  }
}

}  // namespace pagellm::cpu::scalar
