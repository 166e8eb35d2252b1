// Repacking of GGUF row-major blocks into the 8-row interleaved layouts.
#include "backend/cpu/matmul_repack.h"

#include <cstring>
#include <type_traits>
#include <vector>

#include "backend/cpu/quants_kernels.h"
#include "core/error.h"

namespace pagellm::cpu {
namespace {

// dst[i][r][4] = quad i of src_r, for i < n_quads (src_r: that row's field).
void interleave_quads(const uint8_t* const* src_rows, size_t field_offset, int n_quads, uint8_t* dst) {
  for (int i = 0; i < n_quads; ++i)
    for (int r = 0; r < kGroupRows; ++r) std::memcpy(dst + (i * kGroupRows + r) * 4, src_rows[r] + field_offset + 4 * i, 4);
}

template <typename Src>
const Src& block_of(const uint8_t* const* rows, int r, int64_t b) {
  return reinterpret_cast<const Src*>(rows[r])[b];
}

// Q5_0 / Q5_1 fifth bits: byte b, bit j of the result = bit 4j+b of qh.
uint32_t reorder_fifth_bits(const uint8_t* qh) {
  uint32_t bits;
  std::memcpy(&bits, qh, 4);
  uint32_t out = 0;
  for (int b = 0; b < 4; ++b)
    for (int j = 0; j < 8; ++j) out |= ((bits >> (4 * j + b)) & 1u) << (8 * b + j);
  return out;
}

// Q4_K / Q5_K: unpack the 6-bit scales and mins into byte pairs.
template <typename Src, typename Dst>
void pack_k45(const uint8_t* const* rows, int64_t b, Dst* o) {
  const uint8_t* q[kGroupRows];
  const uint8_t* h[kGroupRows];
  for (int r = 0; r < kGroupRows; ++r) {
    const auto& s = block_of<Src>(rows, r, b);
    o->d[r] = s.d;
    o->dmin[r] = s.dmin;
    q[r] = s.qs;
    if constexpr (std::is_same_v<Src, BlockQ5_K>) h[r] = s.qh;
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      kquant_scale_min(j, s.scales, sc, m);
      o->scales[(j / 2) * 16 + r * 2 + j % 2] = sc;
      o->mins[(j / 2) * 16 + r * 2 + j % 2] = m;
    }
  }
  for (int c = 0; c < 4; ++c) interleave_quads(q, 32 * c, 8, o->qs + c * 256);
  if constexpr (std::is_same_v<Src, BlockQ5_K>) interleave_quads(h, 0, 8, o->qh);
}

void pack_block(DType type, const uint8_t* const* rows, int64_t b, uint8_t* out) {
  switch (type) {
    case DType::Q4_0:
    case DType::IQ4_NL: {  // the same block layout (fp16 scale, 16 nibble bytes)
      static_assert(sizeof(BlockQ4_0) == sizeof(BlockIQ4_NL));
      auto* o = reinterpret_cast<BlockQ4_0x8*>(out);
      const uint8_t* q[kGroupRows];
      for (int r = 0; r < kGroupRows; ++r) {
        const auto& s = block_of<BlockQ4_0>(rows, r, b);
        o->d[r] = s.d;
        q[r] = s.qs;
      }
      interleave_quads(q, 0, 4, o->qs);
      return;
    }
    case DType::Q2_K: {
      auto* o = reinterpret_cast<BlockQ2_Kx8*>(out);
      const uint8_t* q[kGroupRows];
      for (int r = 0; r < kGroupRows; ++r) {
        const auto& s = block_of<BlockQ2_K>(rows, r, b);
        o->d[r] = s.d;
        o->dmin[r] = s.dmin;
        for (int j = 0; j < 16; ++j) o->scales[j * kGroupRows + r] = s.scales[j];
        q[r] = s.qs;
      }
      for (int h = 0; h < 2; ++h) interleave_quads(q, 32 * h, 8, o->qs + h * 256);
      return;
    }
    case DType::Q3_K: {
      auto* o = reinterpret_cast<BlockQ3_Kx8*>(out);
      const uint8_t* q[kGroupRows];
      const uint8_t* h[kGroupRows];
      for (int r = 0; r < kGroupRows; ++r) {
        const auto& s = block_of<BlockQ3_K>(rows, r, b);
        o->d[r] = s.d;
        int8_t sc[16];
        q3k_scales(s.scales, sc);
        for (int j = 0; j < 16; ++j) o->scales[j * kGroupRows + r] = sc[j];
        q[r] = s.qs;
        h[r] = s.hmask;
      }
      for (int hh = 0; hh < 2; ++hh) interleave_quads(q, 32 * hh, 8, o->qs + hh * 256);
      interleave_quads(h, 0, 8, o->hmask);
      return;
    }
    case DType::IQ4_XS: {
      auto* o = reinterpret_cast<BlockIQ4_XSx8*>(out);
      const uint8_t* q[kGroupRows];
      for (int r = 0; r < kGroupRows; ++r) {
        const auto& s = block_of<BlockIQ4_XS>(rows, r, b);
        o->d[r] = s.d;
        for (int j = 0; j < 8; ++j) o->scales[j * kGroupRows + r] = static_cast<int8_t>(iq4xs_scale(s, j));
        q[r] = s.qs;
      }
      for (int j = 0; j < 8; ++j) interleave_quads(q, 16 * j, 4, o->qs + j * 128);
      return;
    }
    case DType::MXFP4: {
      auto* o = reinterpret_cast<BlockMXFP4x8*>(out);
      const uint8_t* q[kGroupRows];
      for (int r = 0; r < kGroupRows; ++r) {
        const auto& s = block_of<BlockMXFP4>(rows, r, b);
        o->e[r] = s.e;
        q[r] = s.qs;
      }
      interleave_quads(q, 0, 4, o->qs);
      return;
    }
    case DType::Q4_1: {
      auto* o = reinterpret_cast<BlockQ4_1x8*>(out);
      const uint8_t* q[kGroupRows];
      for (int r = 0; r < kGroupRows; ++r) {
        const auto& s = block_of<BlockQ4_1>(rows, r, b);
        o->d[r] = s.d;
        o->m[r] = s.m;
        q[r] = s.qs;
      }
      interleave_quads(q, 0, 4, o->qs);
      return;
    }
    case DType::Q5_0: {
      auto* o = reinterpret_cast<BlockQ5_0x8*>(out);
      const uint8_t* q[kGroupRows];
      for (int r = 0; r < kGroupRows; ++r) {
        const auto& s = block_of<BlockQ5_0>(rows, r, b);
        o->d[r] = s.d;
        const uint32_t h = reorder_fifth_bits(s.qh);
        std::memcpy(o->qh + 4 * r, &h, 4);
        q[r] = s.qs;
      }
      interleave_quads(q, 0, 4, o->qs);
      return;
    }
    case DType::Q5_1: {
      auto* o = reinterpret_cast<BlockQ5_1x8*>(out);
      const uint8_t* q[kGroupRows];
      for (int r = 0; r < kGroupRows; ++r) {
        const auto& s = block_of<BlockQ5_1>(rows, r, b);
        o->d[r] = s.d;
        o->m[r] = s.m;
        const uint32_t h = reorder_fifth_bits(s.qh);
        std::memcpy(o->qh + 4 * r, &h, 4);
        q[r] = s.qs;
      }
      interleave_quads(q, 0, 4, o->qs);
      return;
    }
    case DType::Q8_0: {
      auto* o = reinterpret_cast<BlockQ8_0x8*>(out);
      const uint8_t* q[kGroupRows];
      for (int r = 0; r < kGroupRows; ++r) {
        const auto& s = block_of<BlockQ8_0>(rows, r, b);
        o->d[r] = s.d;
        q[r] = reinterpret_cast<const uint8_t*>(s.qs);
      }
      interleave_quads(q, 0, 8, reinterpret_cast<uint8_t*>(o->qs));
      return;
    }
    case DType::Q4_K: return pack_k45<BlockQ4_K>(rows, b, reinterpret_cast<BlockQ4_Kx8*>(out));
    case DType::Q5_K: return pack_k45<BlockQ5_K>(rows, b, reinterpret_cast<BlockQ5_Kx8*>(out));
    case DType::Q6_K: {
      auto* o = reinterpret_cast<BlockQ6_Kx8*>(out);
      const uint8_t* ql[kGroupRows];
      const uint8_t* qh[kGroupRows];
      for (int r = 0; r < kGroupRows; ++r) {
        const auto& s = block_of<BlockQ6_K>(rows, r, b);
        o->d[r] = s.d;
        ql[r] = s.ql;
        qh[r] = s.qh;
        for (int j = 0; j < 16; ++j) o->scales[(j / 2) * 16 + r * 2 + j % 2] = s.scales[j];
      }
      for (int hp = 0; hp < 4; ++hp) interleave_quads(ql, 32 * hp, 8, o->ql + hp * 256);
      for (int h = 0; h < 2; ++h) interleave_quads(qh, 32 * h, 8, o->qh + h * 256);
      return;
    }
    default: fail("repack: no interleaved layout for {}", dtype_name(type));
  }
}

}  // namespace

size_t interleaved_block_bytes(DType type) {
  switch (type) {
    case DType::Q4_0:
    case DType::IQ4_NL: return sizeof(BlockQ4_0x8);
    case DType::MXFP4: return sizeof(BlockMXFP4x8);
    case DType::IQ4_XS: return sizeof(BlockIQ4_XSx8);
    case DType::Q2_K: return sizeof(BlockQ2_Kx8);
    case DType::Q3_K: return sizeof(BlockQ3_Kx8);
    case DType::Q4_1: return sizeof(BlockQ4_1x8);
    case DType::Q5_0: return sizeof(BlockQ5_0x8);
    case DType::Q5_1: return sizeof(BlockQ5_1x8);
    case DType::Q8_0: return sizeof(BlockQ8_0x8);
    case DType::Q4_K: return sizeof(BlockQ4_Kx8);
    case DType::Q5_K: return sizeof(BlockQ5_Kx8);
    case DType::Q6_K: return sizeof(BlockQ6_Kx8);
    default: return 0;
  }
}

void repack_group_x8(DType type, const void* src, int64_t rows, int64_t cols, int64_t g, void* dst) {
  const size_t row_bytes = dtype_row_bytes(type, cols);
  const int64_t nb = cols / dtype_block_size(type);
  const size_t out_bytes = interleaved_block_bytes(type);
  PAGELLM_CHECK(out_bytes > 0, "repack: no interleaved layout for {}", dtype_name(type));
  // Rows past the end read from one row of zero blocks.
  static thread_local std::vector<uint8_t> zeros;
  if (zeros.size() < row_bytes) zeros.assign(row_bytes, 0);
  const uint8_t* row_ptr[kGroupRows];
  for (int r = 0; r < kGroupRows; ++r) {
    const int64_t row = g * kGroupRows + r;
    row_ptr[r] = row < rows ? static_cast<const uint8_t*>(src) + static_cast<size_t>(row) * row_bytes : zeros.data();
  }
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t b = 0; b < nb; ++b) pack_block(type, row_ptr, b, out + static_cast<size_t>(b) * out_bytes);
}

}  // namespace pagellm::cpu
