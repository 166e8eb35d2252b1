// Interleaved weight layouts for the SIMD GEMM kernels: 8 consecutive rows
// share each block, with every row's bytes grouped in 4-byte "quads" so that
// one 256-bit vector holds the same 4 elements of 8 rows (lane r = row r).
// An integer dot of 4 elements then lands in lane r directly: no horizontal
// sums, and one broadcast activation quad feeds all 8 rows.
//
// Notation below: "quad i of row r" = bytes [4i, 4i+4) of that row's field in
// the original GGUF block; a field [i][r][4] lists quads i, rows r.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/cpu/quants.h"

namespace pagellm::cpu {

constexpr int kGroupRows = 8;

// qs[i][r][4]: quad i (0..3) of row r's qs. Low nibbles are elements
// 4i..4i+3, high nibbles 16+4i..16+4i+3.
struct BlockQ4_0x8 { uint16_t d[8]; uint8_t qs[128]; };
struct BlockQ4_1x8 { uint16_t d[8], m[8]; uint8_t qs[128]; };
// qh[r][4]: row r's 5th bits reordered so that byte b, bit j is the 5th bit of
// element 4j+b (the element that quad j's byte b holds): quad j's 5th bits are
// then (qh >> j) & 1 per byte.
struct BlockQ5_0x8 { uint16_t d[8]; uint8_t qh[32]; uint8_t qs[128]; };
struct BlockQ5_1x8 { uint16_t d[8], m[8]; uint8_t qh[32]; uint8_t qs[128]; };
// qs[i][r][4]: quad i (0..7) of row r.
struct BlockQ8_0x8 { uint16_t d[8]; int8_t qs[256]; };
// IQ4_NL interleaves as Q4_0 does (BlockQ4_0x8: fp16 scales, nibbles in the
// same order; only the levels differ). MXFP4 keeps its e8m0 exponent bytes.
struct BlockMXFP4x8 { uint8_t e[8]; uint8_t qs[128]; };
// IQ4_XS: scales[j][r] = sub-block j's scale of row r (offset taken out);
// qs[j][i][r][4] = quad i of row r's sub-block j bytes (16j + 4i ..): low
// nibbles are elements 32j + 4i.., high nibbles 32j + 16 + 4i...
struct BlockIQ4_XSx8 { uint16_t d[8]; int8_t scales[64]; uint8_t qs[1024]; };
// Q2_K: scales[j][r] = sub-block j's (scale | min << 4) byte of row r, as
// stored; qs[h][i][r][4] = quad i of row r's qs bytes [32h, 32h + 32): bits
// 2k..2k+1 of its byte c are element 128h + 32k + 4i + c.
struct BlockQ2_Kx8 { uint16_t d[8], dmin[8]; uint8_t scales[128]; uint8_t qs[512]; };
// Q3_K: scales[j][r] = sub-block j's signed scale of row r (offset 32 taken
// out); qs as Q2_K's; hmask[i][r][4] = quad i of row r's hmask: bit 4h + k
// of its byte c is the third bit of element 128h + 32k + 4i + c.
struct BlockQ3_Kx8 { uint16_t d[8]; int8_t scales[128]; uint8_t hmask[256]; uint8_t qs[512]; };
// Scales and mins unpacked to bytes, in pairs: scales[p][r][2] = scale of
// sub-blocks 2p and 2p+1 of row r (sub-block = 32 elements); qs[c][i][r][4] =
// quad i of row r's qs bytes [32c, 32c+32): low nibbles are sub-block 2c,
// high nibbles 2c+1. Q5_K's qh[i][r][4]: quad i of row r's qh, bit j of each
// byte belongs to sub-block j.
struct BlockQ4_Kx8 { uint16_t d[8], dmin[8]; uint8_t scales[64]; uint8_t mins[64]; uint8_t qs[1024]; };
struct BlockQ5_Kx8 {
  uint16_t d[8], dmin[8];
  uint8_t scales[64];
  uint8_t mins[64];
  uint8_t qh[256];
  uint8_t qs[1024];
};
// scales[p][r][2]: scales of sub-blocks 2p, 2p+1 (sub-block = 16 elements).
// ql[h][part][i][r][4]: quad i of row r's ql bytes [64h + 32 part, +32);
// qh[h][i][r][4]: quad i of row r's qh bytes [32h, 32h+32).
struct BlockQ6_Kx8 { uint16_t d[8]; int8_t scales[128]; uint8_t ql[1024]; uint8_t qh[512]; };

static_assert(sizeof(BlockMXFP4x8) == 136 && sizeof(BlockIQ4_XSx8) == 1104 && sizeof(BlockQ2_Kx8) == 672 &&
              sizeof(BlockQ3_Kx8) == 912);
static_assert(sizeof(BlockQ4_0x8) == 144 && sizeof(BlockQ4_1x8) == 160 && sizeof(BlockQ5_0x8) == 176 &&
              sizeof(BlockQ5_1x8) == 192 && sizeof(BlockQ8_0x8) == 272);
static_assert(sizeof(BlockQ4_Kx8) == 1184 && sizeof(BlockQ5_Kx8) == 1440 && sizeof(BlockQ6_Kx8) == 1680);

// Bytes of one interleaved block (8 rows x one block of `type`), or 0 if the
// type has no interleaved layout.
size_t interleaved_block_bytes(DType type);

// Writes rows [8g, 8g+8) of the row-major matrix `src` (rows x cols of type)
// as cols / block_size interleaved blocks at dst. Rows past the end are zero
// blocks (they compute zeros, which are never stored).
void repack_group_x8(DType type, const void* src, int64_t rows, int64_t cols, int64_t g, void* dst);

}  // namespace pagellm::cpu
