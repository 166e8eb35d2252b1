// Element types of weights and caches. The numeric values are GGUF's
// (ggml_type) so a GGUF tensor's type maps without a table.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace pagellm {

enum class DType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ4_NL = 20,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  BF16 = 30,
  MXFP4 = 39,
};

struct DTypeInfo {
  const char* name;
  int block_size;    // elements per block (1 for plain types)
  int block_bytes;   // bytes per block
  bool supported;    // we can load and compute with it
};

// Info for a raw GGUF type id; returns nullptr for ids we do not know.
const DTypeInfo* dtype_info(uint32_t raw_type);
const DTypeInfo& dtype_info(DType t);
std::string dtype_name(DType t);
// Parses "f32", "Q4_K", "q8_0", ... (case-insensitive). Throws Error if unknown.
DType dtype_from_name(const std::string& name);

inline int dtype_block_size(DType t) { return dtype_info(t).block_size; }
// Bytes of one row of n elements; n must be a multiple of the block size.
size_t dtype_row_bytes(DType t, int64_t n);
bool dtype_is_quantized(DType t);
// Bytes of one element of a plain (not block-quantized) type; 0 for block types.
inline size_t dtype_size(DType t) {
  const DTypeInfo& i = dtype_info(t);
  return i.block_size == 1 ? static_cast<size_t>(i.block_bytes) : 0;
}

}  // namespace pagellm
