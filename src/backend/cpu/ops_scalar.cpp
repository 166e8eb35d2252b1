// Baseline x86-64 build of the CPU ops (the reference and the no-AVX2 path).
#define OPS_NS scalar
#include "backend/cpu/ops_impl.h"

namespace pagellm::cpu {

const OpsTable& ops_scalar() { return scalar::kTable; }


const OpsTable& ops_table(Isa isa) { return isa == Isa::Scalar ? ops_scalar() : ops_avx2(); }

}  // namespace pagellm::cpu
