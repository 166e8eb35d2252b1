#include "core/cpu_features.h"

#include <cpuid.h>

#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace pagellm {
namespace {

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

}  // namespace

Isa CpuFeatures::detected() const {
  Isa isa = Isa::Scalar;
  if (avx2 && fma && f16c) isa = Isa::Avx2;
  if (isa == Isa::Avx2 && avx512f && avx512bw && avx512vl && avx512dq) isa = Isa::Avx512;
  if (isa == Isa::Avx512 && avx512vnni) isa = Isa::Avx512Vnni;
  return isa;
}

Isa CpuFeatures::best() const {
  Isa isa = detected();
  if (const char* cap = std::getenv("PAGELLM_ISA"); cap != nullptr && *cap != '\0') {
    Isa limit = Isa::Scalar;
    PAGELLM_CHECK(parse_isa(cap, limit), "PAGELLM_ISA={}: not one of scalar, avx2, avx512, avx512-vnni", cap);
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
  return s.empty() ? "baseline x86-64" : s;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Avx512Vnni: return "avx512-vnni";
    case Isa::Avx512: return "avx512";
    case Isa::Avx2: return "avx2";
    default: return "scalar";
  }
}

bool parse_isa(const char* name, Isa& isa) {
  for (Isa i : {Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Avx512Vnni}) {
    if (std::strcmp(name, isa_name(i)) == 0) {
      isa = i;
      return true;
    }
  }
  return false;
}

}  // namespace pagellm
