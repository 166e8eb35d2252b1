#include "core/dtype.h"

#include <algorithm>
#include <cctype>

#include "core/error.h"

namespace pagellm {
namespace {

struct Entry {
  uint32_t id;
  DTypeInfo info;
};

// Block layouts follow GGUF/ggml: see core/quant_blocks.h for the structs.
constexpr Entry kTypes[] = {
    {0, {"F32", 1, 4, true}},        {1, {"F16", 1, 2, true}},
    {2, {"Q4_0", 32, 18, true}},     {3, {"Q4_1", 32, 20, true}},
    {6, {"Q5_0", 32, 22, true}},     {7, {"Q5_1", 32, 24, true}},
    {8, {"Q8_0", 32, 34, true}},     {9, {"Q8_1", 32, 36, false}},
    {10, {"Q2_K", 256, 84, true}},   {11, {"Q3_K", 256, 110, true}},
    {12, {"Q4_K", 256, 144, true}},  {13, {"Q5_K", 256, 176, true}},
    {14, {"Q6_K", 256, 210, true}},  {15, {"Q8_K", 256, 292, false}},
    {16, {"IQ2_XXS", 256, 66, false}}, {17, {"IQ2_XS", 256, 74, false}},
    {18, {"IQ3_XXS", 256, 98, false}}, {19, {"IQ1_S", 256, 50, false}},
    {20, {"IQ4_NL", 32, 18, true}}, {21, {"IQ3_S", 256, 110, false}},
    {22, {"IQ2_S", 256, 82, false}}, {23, {"IQ4_XS", 256, 136, true}},
    {24, {"I8", 1, 1, false}},       {25, {"I16", 1, 2, false}},
    {26, {"I32", 1, 4, false}},      {27, {"I64", 1, 8, false}},
    {28, {"F64", 1, 8, false}},      {29, {"IQ1_M", 256, 56, false}},
    {30, {"BF16", 1, 2, true}},      {39, {"MXFP4", 32, 17, true}},
};

}  // namespace

const DTypeInfo* dtype_info(uint32_t raw_type) {
  for (const auto& e : kTypes)
    if (e.id == raw_type) return &e.info;
  return nullptr;
}

const DTypeInfo& dtype_info(DType t) {
  const DTypeInfo* info = dtype_info(static_cast<uint32_t>(t));
  PAGELLM_CHECK(info != nullptr, "unknown tensor type id {}", static_cast<uint32_t>(t));
  return *info;
}

std::string dtype_name(DType t) {
  const DTypeInfo* info = dtype_info(static_cast<uint32_t>(t));
  return info ? info->name : "type#" + std::to_string(static_cast<uint32_t>(t));
}

DType dtype_from_name(const std::string& name) {
  std::string upper = name;
  std::transform(upper.begin(), upper.end(), upper.begin(), [](unsigned char c) { return std::toupper(c); });
  for (const auto& e : kTypes)
    if (upper == e.info.name) return static_cast<DType>(e.id);
  fail("unknown weight type '{}' (try f32, f16, bf16, q8_0, q4_0, q4_k, q3_k, iq4_xs, mxfp4)", name);
}

size_t dtype_row_bytes(DType t, int64_t n) {
  const DTypeInfo& info = dtype_info(t);
  PAGELLM_CHECK(n % info.block_size == 0, "row of {} elements is not a multiple of {}'s block size {}", n,
                info.name, info.block_size);
  return static_cast<size_t>(n / info.block_size) * static_cast<size_t>(info.block_bytes);
}

bool dtype_is_quantized(DType t) { return dtype_info(t).block_size > 1; }

}  // namespace pagellm
