// Baseline build of the CPU ops (the reference and the no-AVX2 path; on
// aarch64 the only one: its baseline has NEON, which the compiler vectorises for).
#define OPS_NS scalar
#include "backend/cpu/ops_impl.h"

namespace pagellm::cpu {

const OpsTable& ops_scalar() { return scalar::kTable; }


const OpsTable& ops_table(Isa isa) {
#if defined(PAGELLM_CPU_X86)
  return isa == Isa::Scalar ? ops_scalar() : ops_avx2();
#else
  return ops_scalar();
#endif
}

}  // namespace pagellm::cpu
