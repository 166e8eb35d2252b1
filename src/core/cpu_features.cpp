#include "core/cpu_features.h"

#if defined(PAGELLM_CPU_X86)
#include <cpuid.h>
#elif defined(PAGELLM_CPU_ARM)
#include <sys/auxv.h>
#endif

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace pagellm {
namespace {

#if defined(PAGELLM_CPU_X86)
constexpr Isa kLevels[] = {Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Avx512Vnni};

bool os_saves_ymm_zmm(bool zmm) {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  __cpuid(1, eax, ebx, ecx, edx);
  if (!(ecx & (1u << 27))) return false;  // OSXSAVE
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  const unsigned need = zmm ? 0xe6u : 0x6u;  // XMM|YMM (+ opmask|ZMM_hi256|Hi16_ZMM)
  return (lo & need) == need;
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid(1, eax, ebx, ecx, edx);
  const bool ymm = os_saves_ymm_zmm(false);
  const bool zmm = os_saves_ymm_zmm(true);
  f.fma = ymm && (ecx & (1u << 12));
  f.f16c = ymm && (ecx & (1u << 29));
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  f.avx2 = ymm && (ebx & (1u << 5));
  f.avx512f = zmm && (ebx & (1u << 16));
  f.avx512dq = zmm && (ebx & (1u << 17));
  f.avx512bw = zmm && (ebx & (1u << 30));
  f.avx512vl = zmm && (ebx & (1u << 31));
  f.avx512vnni = zmm && (ecx & (1u << 11));
  __cpuid_count(7, 1, eax, ebx, ecx, edx);
  f.avxvnni = ymm && (eax & (1u << 4));
  f.avx512bf16 = zmm && (eax & (1u << 5));
  return f;
}
#elif defined(PAGELLM_CPU_ARM)
constexpr Isa kLevels[] = {Isa::Scalar, Isa::Neon, Isa::NeonDotprod, Isa::NeonI8mm};

// Linux's bits (asm/hwcap.h), spelled out: older kernel headers lack HWCAP2_I8MM.
constexpr unsigned long kHwcapAsimd = 1ul << 1, kHwcapAsimdDp = 1ul << 20, kHwcap2I8mm = 1ul << 13;

CpuFeatures detect() {
  CpuFeatures f;
  const unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
  f.neon = (hw & kHwcapAsimd) != 0;
  f.dotprod = f.neon && (hw & kHwcapAsimdDp) != 0;
  f.i8mm = f.neon && (hw2 & kHwcap2I8mm) != 0;
  return f;
}
#else
constexpr Isa kLevels[] = {Isa::Scalar};

CpuFeatures detect() { return {}; }
#endif

std::string level_names() {
  std::string s;
  for (Isa i : kLevels) s += (s.empty() ? "" : ", ") + std::string(isa_name(i));
  return s;
}

}  // namespace

Isa CpuFeatures::detected() const {
  Isa isa = Isa::Scalar;
#if defined(PAGELLM_CPU_X86)
  if (avx2 && fma && f16c) isa = Isa::Avx2;
  if (isa == Isa::Avx2 && avx512f && avx512bw && avx512vl && avx512dq) isa = Isa::Avx512;
  if (isa == Isa::Avx512 && avx512vnni) isa = Isa::Avx512Vnni;
#elif defined(PAGELLM_CPU_ARM)
  if (neon) isa = Isa::Neon;
  if (isa == Isa::Neon && dotprod) isa = Isa::NeonDotprod;
  // i8mm without dotprod exists on no known core; the level needs both.
  if (isa == Isa::NeonDotprod && i8mm) isa = Isa::NeonI8mm;
#endif
  return isa;
}

bool CpuFeatures::supports(Isa isa) const {
  return std::find(std::begin(kLevels), std::end(kLevels), isa) != std::end(kLevels) && isa <= detected();
}

Isa CpuFeatures::best() const {
  Isa isa = detected();
  if (const char* cap = std::getenv("PAGELLM_ISA"); cap != nullptr && *cap != '\0') {
    Isa limit = Isa::Scalar;
    const bool known = parse_isa(cap, limit);
    PAGELLM_CHECK(known && std::find(std::begin(kLevels), std::end(kLevels), limit) != std::end(kLevels),
                  "PAGELLM_ISA={}: {} one of {}", cap, known ? "a level of another architecture, not" : "not",
                  level_names());
    if (limit < isa) isa = limit;
  }
  return isa;
}

std::string CpuFeatures::describe() const {
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(avx2, "avx2");
  add(fma, "fma");
  add(f16c, "f16c");
  add(avxvnni, "avxvnni");
  add(avx512f, "avx512f");
  add(avx512bw, "avx512bw");
  add(avx512vl, "avx512vl");
  add(avx512dq, "avx512dq");
  add(avx512vnni, "avx512vnni");
  add(avx512bf16, "avx512bf16");
  add(neon, "asimd");
  add(dotprod, "asimddp");
  add(i8mm, "i8mm");
#if defined(PAGELLM_CPU_ARM)
  return s.empty() ? "baseline aarch64" : s;
#else
  return s.empty() ? "baseline x86-64" : s;
#endif
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

std::span<const Isa> isa_levels() { return kLevels; }

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Avx512Vnni: return "avx512-vnni";
    case Isa::Avx512: return "avx512";
    case Isa::Avx2: return "avx2";
    case Isa::Neon: return "neon";
    case Isa::NeonDotprod: return "neon-dotprod";
    case Isa::NeonI8mm: return "neon-i8mm";
    default: return "scalar";
  }
}

bool parse_isa(const char* name, Isa& isa) {
  for (Isa i : {Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Avx512Vnni, Isa::Neon, Isa::NeonDotprod, Isa::NeonI8mm}) {
    if (std::strcmp(name, isa_name(i)) == 0) {
      isa = i;
      return true;
    }
  }
  return false;
}

}  // namespace pagellm
