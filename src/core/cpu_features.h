// What the CPU can run, detected once. The CPU backend picks kernels from it.
#pragma once

#include <string>

namespace pagellm {

enum class Isa { Scalar = 0, Avx2 = 1, Avx512 = 2 };

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512vnni = false, avx512bf16 = false, avxvnni = false;

  // Best ISA level for our kernels: AVX2 needs avx2+fma+f16c; AVX-512 needs
  // f/bw/vl/dq. The environment variable PAGELLM_ISA=scalar|avx2|avx512 caps it
  // (tests use this to run the portable path on any machine).
  Isa best() const;
  std::string describe() const;
};

const CpuFeatures& cpu_features();
const char* isa_name(Isa isa);

}  // namespace pagellm
