// AVX2 + FMA + F16C build of the CPU ops (same source as ops_scalar.cpp).
#define OPS_NS avx2
#define OPS_AVX2 1
#include "backend/cpu/ops_impl.h"

namespace pagellm::cpu {

const OpsTable& ops_avx2() { return avx2::kTable; }

}  // namespace pagellm::cpu
