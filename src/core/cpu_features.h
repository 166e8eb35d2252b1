// What the CPU can run, detected once. The CPU backend picks kernels from it.
#pragma once

#include <string>

namespace pagellm {

// ISA levels of the x86 kernels, each a superset of the one before:
//   avx2        AVX2 + FMA + F16C
//   avx512      + AVX-512 F/BW/VL/DQ
//   avx512-vnni + AVX-512 VNNI (vpdpbusd int8 dot products)
// (AVX-512 BF16 is not a level of its own yet: no kernel uses it.)
enum class Isa { Scalar = 0, Avx2 = 1, Avx512 = 2, Avx512Vnni = 3 };

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512vnni = false, avx512bf16 = false, avxvnni = false;

  // The highest level this CPU supports (regardless of PAGELLM_ISA).
  Isa detected() const;
  // The level the kernels use: detected(), capped by the environment variable
  // PAGELLM_ISA=scalar|avx2|avx512|avx512-vnni (tests and benchmarks use it to
  // run a lower level on any machine). Read on every call; an unknown value
  // throws Error naming the accepted ones.
  Isa best() const;
  std::string describe() const;
};

const CpuFeatures& cpu_features();
const char* isa_name(Isa isa);
// The Isa named as isa_name() spells it; false if the name is unknown.
bool parse_isa(const char* name, Isa& isa);

}  // namespace pagellm
