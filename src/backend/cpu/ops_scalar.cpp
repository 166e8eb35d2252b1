// Baseline x86-64 build of the CPU ops (the reference and the no-AVX2 path).
#define OPS_NS scalar
#include "backend/cpu/ops_impl.h"

#include <vector>

#include "core/fp16.h"

namespace pagellm::cpu {

const OpsTable& ops_scalar() { return scalar::kTable; }

const uint16_t* gelu_table() {
  static const std::vector<uint16_t> table = [] {
    std::vector<uint16_t> t(1 << 16);
    constexpr float kSqrt2OverPi = 0.79788456080286535587989211986876f;
    for (uint32_t h = 0; h < t.size(); ++h) {
      const float x = fp16_to_fp32(static_cast<uint16_t>(h));
      t[h] = fp32_to_fp16(0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * x * (1.0f + 0.044715f * x * x))));
    }
    return t;
  }();
  return table.data();
}

const OpsTable& ops_table(Isa isa) { return isa == Isa::Scalar ? ops_scalar() : ops_avx2(); }

}  // namespace pagellm::cpu
