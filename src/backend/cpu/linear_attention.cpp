#include "backend/cpu/linear_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"

// The baseline build of the delta rule's kernel (linear_attention_impl.h).
#define LA_NS scalar
#include "backend/cpu/linear_attention_impl.h"
#undef LA_NS

namespace pagellm::cpu {

namespace {

float silu(float x) { return x / (1.0f + std::exp(-x)); }

}  // namespace

void causal_conv1d_seq(const float* x, int64_t n_tokens, int64_t dim, const float* w, int K, const float* bias,
                       int64_t c0, int64_t c1, float* state, float* out) {
  const int hist = K - 1;
  for (int64_t t = 0; t < n_tokens; ++t) {
    float* o = out + t * dim;
    for (int64_t c = c0; c < c1; ++c) o[c] = bias ? bias[c] : 0.0f;
    for (int j = 0; j < K; ++j) {
      const int64_t i = t - hist + j;  // input row; < 0 reads the state
      const float* in = i < 0 ? state + (hist + i) * dim : x + i * dim;
      for (int64_t c = c0; c < c1; ++c) o[c] += w[c * K + j] * in[c];
    }
    for (int64_t c = c0; c < c1; ++c) o[c] = silu(o[c]);
  }
  // The new state: the last `hist` rows of [state; x]. Row r reads row r + n
  // of the old state (later, not yet overwritten) or an input row.
  for (int r = 0; r < hist; ++r) {
    const int64_t i = n_tokens - hist + r;
    const float* src = i < 0 ? state + (hist + i) * dim : x + i * dim;
    float* dst = state + static_cast<int64_t>(r) * dim;
    if (src != dst) std::copy(src + c0, src + c1, dst + c0);
  }
}

void gated_delta_rule_head(const float* qkv, const float* a, const float* b, int64_t n_tokens,
                           const GatedDeltaConfig& cfg, int h, float ssm_a, float dt_bias, float* S, float* out,
                           Isa isa, bool allow_chunked) {
  const int dk = cfg.head_k_dim, dv = cfg.head_v_dim;
  PAGELLM_CHECK(dk <= kMaxDeltaHeadDim && dv <= kMaxDeltaHeadDim, "gated delta rule: head dims {}/{} over {}", dk,
                dv, kMaxDeltaHeadDim);
  const int kh = cfg.key_head(h);
  DeltaHeadArgs p;
  p.q = qkv + static_cast<int64_t>(kh) * dk;
  p.k = qkv + static_cast<int64_t>(cfg.n_k_heads) * dk + static_cast<int64_t>(kh) * dk;
  p.v = qkv + 2 * static_cast<int64_t>(cfg.n_k_heads) * dk + static_cast<int64_t>(h) * dv;
  p.qkv_stride = cfg.qkv_dim();
  p.a = a + h;
  p.b = b + h;
  p.ab_stride = cfg.n_v_heads;
  p.n_tokens = n_tokens;
  p.head_k_dim = dk;
  p.head_v_dim = dv;
  p.scale = cfg.scale;
  p.ssm_a = ssm_a;
  p.dt_bias = dt_bias;
  p.state = S;
  p.out = out + static_cast<int64_t>(h) * dv;
  p.out_stride = static_cast<int64_t>(cfg.n_v_heads) * dv;
#if defined(PAGELLM_CPU_X86)
  if (isa >= Isa::Avx512 && isa <= Isa::Avx512Vnni) {
    // A work space given is the kernel's cue for the chunked form.
    if (allow_chunked && n_tokens >= kDeltaChunkMinTokens && dv % 32 == 0) {
      thread_local std::vector<float> scratch;
      scratch.resize(static_cast<size_t>(delta_rule_scratch_floats(dk, dv)));
      p.scratch = scratch.data();
    }
    return delta_rule_head_avx512(p);
  }
  if (isa == Isa::Avx2) return delta_rule_head_avx2(p);
#else
  (void)isa;
  (void)allow_chunked;
#endif
  delta_rule_head_scalar(p);
}

void delta_rule_head_scalar(const DeltaHeadArgs& args) { scalar::delta_rule_head(args); }

}  // namespace pagellm::cpu
