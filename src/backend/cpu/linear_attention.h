// Gated DeltaNet kernels of the CPU backend (Qwen3-Next, Qwen3.5): the
// depthwise causal conv that feeds q, k, v, and the gated delta rule, one
// sequence at a time, continuing from the sequence's state. Tokens go in order
// (the recurrence is sequential); the work splits over channels (conv) and
// value heads (delta rule).
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "core/cpu_features.h"

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
// Runs the kernel built for `isa` (scalar, AVX2 + FMA, AVX-512; the
// baseline build elsewhere): the same steps, rounded as each ISA's FMAs do.
// allow_chunked false keeps the recurrence for every run, so a token's bits
// do not depend on how its sequence was cut into steps (deterministic mode).
void gated_delta_rule_head(const float* qkv, const float* a, const float* b, int64_t n_tokens,
                           const GatedDeltaConfig& cfg, int h, float ssm_a, float dt_bias, float* S, float* out,
                           Isa isa, bool allow_chunked = true);

// One head's work in plain values, for the per-ISA kernels
// (linear_attention_impl.h).
constexpr int kMaxDeltaHeadDim = 512;
struct DeltaHeadArgs {
  const float* q = nullptr;  // token 0's query head (its key head's), then every qkv_stride floats
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t qkv_stride = 0;
  const float* a = nullptr;  // token 0's a and b of the head, then every ab_stride floats
  const float* b = nullptr;
  int64_t ab_stride = 0;
  int64_t n_tokens = 0;
  int head_k_dim = 0, head_v_dim = 0;
  float scale = 1.0f, ssm_a = 0.0f, dt_bias = 0.0f;
  float* state = nullptr;  // [head_k_dim, head_v_dim]
  float* out = nullptr;    // token 0's output head, then every out_stride floats
  int64_t out_stride = 0;
  // The chunked form's work space (delta_rule_scratch_floats; AVX-512
  // builds, head_v_dim a multiple of 32), or null for the token-by-token
  // recurrence.
  float* scratch = nullptr;
};
// Under AVX-512, runs of at least kDeltaChunkMinTokens tokens take the
// chunked form, kDeltaChunk tokens per chunk (prefill); shorter ones, and
// other ISAs, the recurrence.
constexpr int kDeltaChunk = 32, kDeltaChunkMinTokens = 16;
constexpr int64_t delta_rule_scratch_floats(int head_k_dim, int head_v_dim) {
  return int64_t{kDeltaChunk} * (3 * head_k_dim + 2 * head_v_dim + 2 * kDeltaChunk);
}
void delta_rule_head_scalar(const DeltaHeadArgs& args);
void delta_rule_head_avx2(const DeltaHeadArgs& args);
void delta_rule_head_avx512(const DeltaHeadArgs& args);

}  // namespace pagellm::cpu
