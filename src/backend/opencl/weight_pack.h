// How matrices are laid out in device memory, and the host-side packing
// into those layouts (done once, at upload).
//
//   F32, F16  the file's rows as they are.
//   Q4_K      the file's 144-byte blocks as they are (16-byte multiples, so
//             the kernels read them with aligned vector loads).
//   Q8_0      split into structure-of-arrays: all int8 quants of the matrix
//             [rows * cols], then (at scale_offset) one fp16 scale per 32.
//   Q4_0      the same: packed nibbles [rows * cols / 2] (each block's 16
//             bytes unchanged), then the fp16 scales. The 34- and 18-byte
//             blocks of the file would leave the quants unaligned.
//   Q5_0      the same: per block qh (4 bytes) then qs (16), i.e. 20-byte
//             records (4-byte aligned: qh is one uint load), then the scales.
//   Q6_K      the same: per block ql, qh, scales (208 bytes, 16-byte
//             aligned, where the file's 210 are not), then the fp16 d's.
//             The split types take the file's bytes plus < 64 of padding.
//   others    (Q4_1, Q5_1, Q2_K, Q3_K, Q5_K, IQ4_NL, IQ4_XS, MXFP4, BF16,
//             Q8_1) converted to Q8_0 through the
//             scalar references: 34 bytes per 32 values, i.e. +70% memory
//             for Q4_1, +55% for Q5_K, -47% for BF16, and one extra
//             rounding to 8 bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/dtype.h"

namespace pagellm::opencl {

// Types the matmul and embedding kernels read directly.
bool native_matrix_type(DType t);
// Types converted to Q8_0 at upload.
bool convertible_matrix_type(DType t);

struct PackedMatrix {
  DType held_type = DType::F32;
  std::vector<uint8_t> bytes;  // the device image; empty: upload the source bytes as they are
  size_t scale_offset = 0;     // split types: byte offset of the scales in the image
  size_t device_bytes = 0;     // size of the device image
};

// Packs a [rows, cols] matrix of `type` (file layout at data). Throws Error
// for a type it cannot hold or a row length the kernels cannot handle.
PackedMatrix pack_matrix(DType type, int64_t rows, int64_t cols, const void* data);

}  // namespace pagellm::opencl
