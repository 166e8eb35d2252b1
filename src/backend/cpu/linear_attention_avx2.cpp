// The gated delta rule's kernel built for AVX2 + FMA (linear_attention_impl.h).
#define LA_NS avx2
#include "backend/cpu/linear_attention_impl.h"

namespace pagellm::cpu {

void delta_rule_head_avx2(const DeltaHeadArgs& args) { avx2::delta_rule_head(args); }

}  // namespace pagellm::cpu
