// The gated delta rule's kernel built for AVX-512 (linear_attention_impl.h).
#define LA_NS avx512
#include "backend/cpu/linear_attention_impl.h"

namespace pagellm::cpu {

void delta_rule_head_avx512(const DeltaHeadArgs& args) { avx512::delta_rule_head(args); }

}  // namespace pagellm::cpu
