// The GEMM kernels behind matmul(), per ISA. Internal to the CPU backend.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace pagellm::cpu {

// Activations of one matmul call, quantized once: token t's blocks start at
// blocks + t * block_stride, its per-block ActSide* extras at side + t * side_stride.
struct ActRows {
  const uint8_t* blocks = nullptr;
  size_t block_stride = 0;
  const uint8_t* side = nullptr;
  size_t side_stride = 0;
  // Whole tiles of kActTileTokens tokens for the AVX-512 wide kernels (Q8_0 /
  // Q8_1 activations; null: none): tile j holds tokens [8j, 8j + 8), per
  // block their quads interleaved ([quad][token], 4 bytes each), then their
  // 8 side values. A tile's broadcasts then come from one pointer: with a
  // pointer per token the kernels ran out of registers.
  const uint8_t* tiles = nullptr;
  size_t tile_stride = 0;  // bytes per tile
};

// Tokens per activation tile, and bytes per block in one (8 x 32 quads'
// bytes, then 8 sides of 8 bytes).
constexpr int kActTileTokens = 8;
constexpr size_t kActTileBlockBytes = kActTileTokens * 32 + kActTileTokens * 8;

namespace avx2 {

// Tokens per register tile of the interleaved kernels.
constexpr int kTileTokens = 4;

// One interleaved row group (8 rows, nb blocks at w) times tokens
// [t0, t0 + nt): y[t * ldy + r] for r < nrows (<= 8).
void gemm_x8(DType type, const void* w, int64_t nb, const ActRows& a, int64_t t0, int64_t nt, float* y,
             int64_t ldy, int nrows);

// Rows [r0, r1) of a row-major F32 / F16 / BF16 matrix (cols wide) times
// x[n][cols]: y[t * ldy + r].
void gemm_float(DType type, const void* w, int64_t r0, int64_t r1, int64_t cols, const float* x, int64_t n,
                float* y, int64_t ldy);

}  // namespace avx2

// Compiled with the AVX-512 flags; call only when isa_supported(Isa::Avx512Vnni).
namespace avx512 {

constexpr int kTileTokens = 4;

// Row groups per gemm_groups call: 4 (32 rows) for the types whose kernels
// take two pairs of groups, 2 for the other types with a kernel, 0 for none
// (those run avx2::gemm_x8).
int gemm_group_count(DType type);

// groups interleaved row groups (2, or gemm_group_count), group g's nb blocks
// at w + g * group_bytes, times tokens [t0, t0 + nt): y[t * ldy + r] for
// r < nrows (<= 8 * groups). Bit-identical to avx2::gemm_x8 on each group.
// The activation side's c holds 8 * sum for Q4_0 and 16 * sum for Q5_0 (as
// for AVX2), and 128 * sum for Q8_0, IQ4_NL and MXFP4 (AVX2 does not read it
// for those).
void gemm_groups(DType type, const uint8_t* w, int64_t group_bytes, int groups, int64_t nb, const ActRows& a,
                 int64_t t0, int64_t nt, float* y, int64_t ldy, int nrows);

// True if gemm_groups reads ActRows::tiles (when given) for the type.
bool gemm_reads_act_tiles(DType type);

// True if gemv_x8 has a kernel for the type (the others run avx2::gemm_x8).
bool has_gemv_x8(DType type);

// One interleaved row group (8 rows, nb blocks at w) times token t (decode):
// y[r] for r < nrows (<= 8). Bit-identical to avx2::gemm_x8; the activation
// side's c as for gemm_groups.
void gemv_x8(DType type, const void* w, int64_t nb, const ActRows& a, int64_t t, float* y, int nrows);

// ---- F16 / BF16 weights in 32-row panels (matmul_float_avx512.cpp) ----
// F16 needs AVX-512F + F16C, BF16 AVX512-BF16 (matmul.cpp checks).
constexpr int kFloatPanelRows = 32;
// Tokens per register tile: 2 x 12 accumulators, 2 weight vectors and a broadcast.
constexpr int kFloatTileTokens = 12;

// Bytes of one panel of a [rows][cols] F16 or BF16 matrix.
size_t float_panel_bytes(DType type, int64_t cols);
// Rows [32 * panel, 32 * panel + 32) of the row-major matrix w into dst
// (float_panel_bytes): BF16 as [ceil(cols / 2)][32][2], F16 as [cols][32];
// rows past the end are 0.
void pack_float_panel(DType type, const void* w, int64_t rows, int64_t cols, int64_t panel, uint8_t* dst);
// Activations for the panels: in tiles of kFloatTileTokens tokens (the last
// may be shorter), tile j at j * kFloatTileTokens * units 4-byte units, each
// tile [units][its tokens] so that a tile's broadcasts read one stream: f32
// values (F16; units = cols) or bf16 pairs rounded to nearest even (BF16;
// units = ceil(cols / 2), an odd last column paired with 0).
int64_t float_act_units(DType type, int64_t cols);
// Tiles [tile0, tile1) of x[n][cols] into dst (the whole call's buffer).
void pack_float_acts(DType type, const float* x, int64_t cols, int64_t n, int64_t tile0, int64_t tile1, void* dst);
// One panel times the nt tokens whose packed tiles start at acts (at a tile
// boundary): y[t * ldy + r] for r < nrows (<= 32).
void gemm_float_panel(DType type, const uint8_t* panel, int64_t cols, const void* acts, int64_t nt, float* y,
                      int64_t ldy, int nrows);

}  // namespace avx512
}  // namespace pagellm::cpu
