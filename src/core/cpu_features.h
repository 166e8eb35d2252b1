// What the CPU can run, detected once. The CPU backend picks kernels from it.
#pragma once

#include <span>
#include <string>

// The architecture this file is compiled for: the kernels of the other one
// are not in the build.
#if defined(__x86_64__)
#define PAGELLM_CPU_X86 1
#elif defined(__aarch64__)
#define PAGELLM_CPU_ARM 1
#endif

namespace pagellm {

// ISA levels of the kernels, each a superset of the one before within its
// architecture (levels compare only within one architecture; scalar is in both):
//   x86-64:  avx2         AVX2 + FMA + F16C
//            avx512       + AVX-512 F/BW/VL/DQ
//            avx512-vnni  + AVX-512 VNNI (vpdpbusd int8 dot products)
//   aarch64: neon         Advanced SIMD (every aarch64 CPU)
//            neon-dotprod + SDOT/UDOT (vdotq_s32)
//            neon-i8mm    + the int8 matrix multiply (vmmlaq_s32)
// (AVX-512 BF16 is not a level of its own yet: no kernel uses it.)
enum class Isa { Scalar = 0, Avx2 = 1, Avx512 = 2, Avx512Vnni = 3, Neon = 8, NeonDotprod = 9, NeonI8mm = 10 };

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512vnni = false, avx512bf16 = false, avxvnni = false;
  bool neon = false, dotprod = false, i8mm = false;  // aarch64 HWCAP asimd, asimddp, HWCAP2 i8mm

  // The highest level this CPU supports (regardless of PAGELLM_ISA).
  Isa detected() const;
  // True if isa is a level of this build's architecture that this CPU runs.
  bool supports(Isa isa) const;
  // The level the kernels use: detected(), capped by the environment variable
  // PAGELLM_ISA (a name of isa_levels(): scalar|avx2|avx512|avx512-vnni on
  // x86-64, scalar|neon|neon-dotprod|neon-i8mm on aarch64; tests and
  // benchmarks use it to run a lower level on any machine). Read on every
  // call; an unknown name or one of the other architecture throws Error
  // naming the accepted ones.
  Isa best() const;
  std::string describe() const;
};

const CpuFeatures& cpu_features();
// The levels of this build's architecture, scalar first.
std::span<const Isa> isa_levels();
const char* isa_name(Isa isa);
// The Isa named as isa_name() spells it (either architecture); false if the name is unknown.
bool parse_isa(const char* name, Isa& isa);

}  // namespace pagellm
