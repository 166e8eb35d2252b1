#include "backend/opencl/weight_pack.h"

#include <cstddef>
#include <cstring>

#include "core/error.h"
#include "core/quant_blocks.h"

namespace pagellm::opencl {
namespace {

// Scales start on a 64-byte boundary: aligned for any vector load.
size_t align64(size_t n) { return (n + 63) & ~size_t{63}; }

// Splits blocks of `block_bytes` whose fp16 scale is at byte `d_at` into all
// blocks without their scale (the rest in file order), then all scales.
PackedMatrix split_blocks(DType type, const uint8_t* src, int64_t n_blocks, size_t block_bytes, size_t d_at = 0) {
  PackedMatrix p;
  p.held_type = type;
  const size_t nb = static_cast<size_t>(n_blocks), qs_bytes = block_bytes - 2;
  p.scale_offset = align64(nb * qs_bytes);
  p.device_bytes = p.scale_offset + nb * 2;
  p.bytes.resize(p.device_bytes);
  uint8_t* qs = p.bytes.data();
  uint8_t* d = p.bytes.data() + p.scale_offset;
  for (size_t b = 0; b < nb; ++b) {
    const uint8_t* blk = src + b * block_bytes;
    uint8_t* q = qs + b * qs_bytes;
    std::memcpy(d + b * 2, blk + d_at, 2);
    std::memcpy(q, blk, d_at);
    std::memcpy(q + d_at, blk + d_at + 2, qs_bytes - d_at);
  }
  return p;
}

}  // namespace

bool native_matrix_type(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::Q8_0 || t == DType::Q4_0 || t == DType::Q4_K ||
         t == DType::Q5_0 || t == DType::Q6_K;
}

bool convertible_matrix_type(DType t) {
  switch (t) {
    case DType::BF16:
    case DType::Q4_1:
    case DType::Q5_1:
    case DType::Q8_1:
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q5_K:
    case DType::IQ4_NL:
    case DType::IQ4_XS:
    case DType::MXFP4: return true;
    default: return false;
  }
}

PackedMatrix pack_matrix(DType type, int64_t rows, int64_t cols, const void* data) {
  PAGELLM_CHECK(rows > 0 && cols > 0, "matrix of {} x {} values", rows, cols);
  // Quant blocks never straddle rows. Float rows of any length: those not a
  // multiple of 8 take the scalar kernels (matmul_any, embed_any).
  const int bs = dtype_block_size(type);
  PAGELLM_CHECK(cols % bs == 0, "{} rows of {} values are not whole blocks", dtype_name(type), cols);
  const auto* src = static_cast<const uint8_t*>(data);
  const int64_t n = rows * cols;
  switch (type) {
    case DType::F32:
    case DType::F16:
    case DType::Q4_K: {
      PackedMatrix p;
      p.held_type = type;
      p.device_bytes = dtype_row_bytes(type, cols) * static_cast<size_t>(rows);
      return p;
    }
    case DType::Q8_0: return split_blocks(type, src, n / QK8_0, sizeof(BlockQ8_0));
    case DType::Q4_0: return split_blocks(type, src, n / QK4_0, sizeof(BlockQ4_0));
    case DType::Q5_0: return split_blocks(type, src, n / QK5_0, sizeof(BlockQ5_0));
    case DType::Q6_K: return split_blocks(type, src, n / QK_K, sizeof(BlockQ6_K), offsetof(BlockQ6_K, d));
    default: break;
  }
  PAGELLM_CHECK(convertible_matrix_type(type), "the OpenCL backend cannot hold {} matrices", dtype_name(type));
  PAGELLM_CHECK(cols % QK8_0 == 0, "{} rows of {} values cannot be converted to Q8_0", dtype_name(type), cols);
  // Row by row, so the float copy stays one row long.
  const size_t in_row = dtype_row_bytes(type, cols), q8_row = dtype_row_bytes(DType::Q8_0, cols);
  std::vector<float> f(static_cast<size_t>(cols));
  std::vector<uint8_t> q8(q8_row * static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_row_ref(type, src + static_cast<size_t>(r) * in_row, f.data(), cols);
    quantize_row_ref(DType::Q8_0, f.data(), q8.data() + static_cast<size_t>(r) * q8_row, cols);
  }
  return split_blocks(DType::Q8_0, q8.data(), n / QK8_0, sizeof(BlockQ8_0));
}

}  // namespace pagellm::opencl
