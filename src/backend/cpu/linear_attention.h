// Gated DeltaNet kernels of the CPU backend (Qwen3-Next, Qwen3.5): the
// depthwise causal conv that feeds q, k, v, and the gated delta rule, one
// sequence at a time, continuing from the sequence's state. Tokens go in order
// (the recurrence is sequential); the work splits over channels (conv) and
// value heads (delta rule).
#pragma once

#include <cstdint>

#include "backend/backend.h"

namespace pagellm::cpu {

// Channels [c0, c1) of one sequence's n_tokens rows of x (row stride `dim`):
// out[t][c] = silu(bias[c] + sum_j w[c * K + j] * in[t - K + 1 + j][c]), where
// in[i] for i < 0 is state row K - 1 + i. The state [K - 1, dim] then holds
// the last K - 1 inputs. bias may be null.
void causal_conv1d_seq(const float* x, int64_t n_tokens, int64_t dim, const float* w, int K, const float* bias,
                       int64_t c0, int64_t c1, float* state, float* out);

// Value head h of one sequence over its n_tokens rows: qkv rows of
// cfg.qkv_dim() values, a and b rows of n_v_heads, S the head's
// [head_k_dim, head_v_dim] state (updated), out rows of n_v_heads * head_v_dim
// (only head h's part is written). See GatedDeltaConfig for the recurrence.
void gated_delta_rule_head(const float* qkv, const float* a, const float* b, int64_t n_tokens,
                           const GatedDeltaConfig& cfg, int h, float ssm_a, float dt_bias, float* S, float* out);

}  // namespace pagellm::cpu
