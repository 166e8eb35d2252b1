// AVX-512 build of the CPU ops: the AVX2 code (same source as
// ops_scalar.cpp), with attention's scores and value sums 16 lanes wide, and
// the plain loops vectorised for 512 bits.
#define OPS_NS avx512
#define OPS_AVX2 1
#define OPS_AVX512 1
#include "backend/cpu/ops_impl.h"

namespace pagellm::cpu {

const OpsTable& ops_avx512() { return avx512::kTable; }

}  // namespace pagellm::cpu
