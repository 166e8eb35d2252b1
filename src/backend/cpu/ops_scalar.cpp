// Baseline build of the CPU ops (the reference and the no-AVX2 path; on
// aarch64 the only one: its baseline has NEON, which the compiler vectorises for).
#define OPS_NS scalar
#include "backend/cpu/ops_impl.h"

namespace pagellm::cpu {

const OpsTable& ops_scalar() { return scalar::kTable; }


const OpsTable& ops_table(Isa isa) {
#if defined(PAGELLM_CPU_X86)
  if (isa == Isa::Scalar) return ops_scalar();
  return isa >= Isa::Avx512 && isa <= Isa::Avx512Vnni ? ops_avx512() : ops_avx2();
#else
  return ops_scalar();
#endif
}

}  // namespace pagellm::cpu
