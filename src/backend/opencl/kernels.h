// The OpenCL C source of every kernel (kernels.cl.cpp), built once per
// backend, and the launch geometry the host and the kernels agree on.
#pragma once

namespace pagellm::opencl {

extern const char* const kKernelSource;

// Matmul: a reduction over each weight row (kMvRows rows per work-group)
// for up to kMvTokens activation rows, else tiles of kTileTokens x kTileRows
// outputs.
constexpr int kMvGroup = 64, kMvRows = 4, kMvTokens = 8;
constexpr int kTileTokens = 32, kTileRows = 64;
constexpr int kNormGroup = 256;
// Attention: 128 threads = up to 8 query rows x 16 lanes; keys in chunks of 16.
constexpr int kAttnGroup = 128, kAttnRows = 8, kAttnLanes = 16, kAttnChunk = 16;
constexpr int kAttnMaxHeadDim = 256;

}  // namespace pagellm::opencl
