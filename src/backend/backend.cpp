#include "backend/backend.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"

namespace pagellm {

// Defaults of the optional parts of the Backend interface.
void Backend::allocate_swap_space(int) { fail("the {} backend cannot swap KV blocks to host memory", name()); }
void Backend::swap_out(const BlockPairs&) { fail("the {} backend cannot swap KV blocks to host memory", name()); }
void Backend::swap_in(const BlockPairs&) { fail("the {} backend cannot swap KV blocks to host memory", name()); }
void Backend::read_kv_blocks(std::span<const int32_t>, uint8_t*) {
  fail("the {} backend cannot copy KV blocks to host memory", name());
}
void Backend::write_kv_blocks(std::span<const int32_t>, const uint8_t*) {
  fail("the {} backend cannot copy KV blocks from host memory", name());
}
void Backend::set_deterministic(bool on) {
  if (on) fail("the {} backend has no deterministic mode (its results may depend on batch and thread count)", name());
}

double rope_pair_frequencies(const RopeConfig& c, const float* factors, std::vector<double>& inv_freq) {
  const int half = c.n_rot / 2;
  inv_freq.resize(static_cast<size_t>(std::max(half, 0)));
  const double base = c.freq_base, scale = c.freq_scale;
  // The pair index where a frequency completes `turns` rotations over n_ctx_orig tokens.
  auto pair_of_turns = [&](double turns) {
    return c.n_rot * std::log(c.n_ctx_orig / (turns * 2 * M_PI)) / (2 * std::log(base));
  };
  double low = 0, high = 0;
  const bool yarn = c.ext_factor > 0 && c.n_ctx_orig > 0;
  if (yarn) {
    low = pair_of_turns(c.beta_fast);
    high = pair_of_turns(c.beta_slow);
    if (c.yarn_truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(0.0, low);
    high = std::min(c.n_rot - 1.0, high);
  }
  for (int i = 0; i < half; ++i) {
    const double extrapolated = std::pow(base, -2.0 * i / c.n_rot);
    double f = extrapolated * scale;  // interpolated
    if (yarn) {
      const double ramp = 1.0 - std::clamp((i - low) / std::max(0.001, high - low), 0.0, 1.0);
      const double mix = ramp * c.ext_factor;
      f = f * (1 - mix) + extrapolated * mix;
    }
    if (factors) f /= factors[i];
    inv_freq[i] = f;
  }
  return yarn ? c.attn_factor * (1.0 + 0.1 * std::log(1.0 / scale)) : c.attn_factor;
}

TensorData expert_slice(const TensorData& t, int64_t e) {
  PAGELLM_CHECK(t.shape.size() == 2 || t.shape.size() == 3,
                "tensor '{}' is not a stack of experts (it has {} dimensions)", t.name, t.shape.size());
  const int64_t n_expert = t.shape.back();
  PAGELLM_CHECK(e >= 0 && e < n_expert, "expert {} of tensor '{}' (it has {})", e, t.name, n_expert);
  TensorData s;
  s.name = t.name + "[" + std::to_string(e) + "]";
  s.type = t.type;
  s.shape.assign(t.shape.begin(), t.shape.end() - 1);
  const size_t bytes = dtype_row_bytes(t.type, t.shape[0]) * static_cast<size_t>(s.rows());
  s.data = static_cast<const uint8_t*>(t.data) + bytes * static_cast<size_t>(e);
  return s;
}

namespace {
[[noreturn]] void no_moe(const Backend& b) {
  fail("the {} backend does not run Mixture-of-Experts layers (use --device cpu)", b.name());
}
}  // namespace

void Backend::moe_route(const Buffer&, int64_t, const MoeRouting&, Buffer&, Buffer&) { no_moe(*this); }
void Backend::matmul_experts(const std::vector<const Weight*>&, const Buffer&, int64_t, int, bool, const Buffer&,
                             Buffer&, const std::vector<const Weight*>&) {
  no_moe(*this);
}
void Backend::moe_combine(const Buffer&, const Buffer&, int64_t, int, int64_t, Buffer&) { no_moe(*this); }
void Backend::lora_matmul(const std::vector<const Weight*>& a, const std::vector<const Weight*>& b, const Buffer& x,
                          int64_t n, const Buffer& slots, Buffer& y, Buffer* t_scratch, Buffer* d_scratch) {
  PAGELLM_CHECK(t_scratch && d_scratch && !b.empty(), "lora_matmul: the {} backend needs scratch buffers", name());
  matmul_experts(a, x, n, 1, false, slots, *t_scratch);
  matmul_experts(b, *t_scratch, n, 1, true, slots, *d_scratch);
  add(y, *d_scratch, n * b[0]->rows);
}
void Backend::scale_rows_sigmoid(Buffer&, const Buffer&, int64_t, int64_t) { no_moe(*this); }

namespace {
[[noreturn]] void no_linear_attention(const Backend& b) {
  fail("the {} backend does not run linear-attention (Gated DeltaNet) layers (use --device cpu)", b.name());
}
}  // namespace

void Backend::causal_conv1d(int, const Buffer&, const Weight&, const Weight*, Buffer&) { no_linear_attention(*this); }
void Backend::gated_delta_rule(int, const Buffer&, const Buffer&, const Buffer&, const Weight&, const Weight&,
                               const GatedDeltaConfig&, Buffer&) {
  no_linear_attention(*this);
}
void Backend::copy_states(const BlockPairs&) { no_linear_attention(*this); }

OpQuery op_query(pglb_op op, std::initializer_list<std::pair<DType, std::vector<int64_t>>> operands) {
  OpQuery q{};
  q.struct_size = sizeof q;
  q.op = op;
  PAGELLM_CHECK(operands.size() <= 4, "an op query has at most 4 operands");
  for (const auto& [type, shape] : operands) {
    const int i = q.n_operands++;
    q.types[i] = static_cast<pglb_dtype>(type);
    for (size_t d = 0; d < shape.size() && d < 4; ++d) q.shapes[i][d] = shape[d];
  }
  return q;
}

const char* op_name(pglb_op op) {
  static const char* const names[] = {"embed",          "matmul",      "add_bias",    "rms_norm",
                                      "rope",           "store_kv",    "attention",   "glu",
                                      "add",            "gather_rows", "moe_route",   "matmul_experts",
                                      "moe_combine",    "scale_rows_sigmoid", "softcap", "sample",
                                      "causal_conv1d",  "gated_delta_rule", "layer_norm", "activation",
                                      "lora_matmul",    "attention_kv", "gather_kv"};
  static_assert(sizeof names / sizeof names[0] == PGLB_OP_COUNT, "a name for every op");
  return op >= 0 && op < PGLB_OP_COUNT ? names[op] : "unknown op";
}

bool Backend::supports_op(const OpQuery& q) const {
  switch (q.op) {
    case PGLB_OP_MOE_ROUTE:
    case PGLB_OP_MATMUL_EXPERTS:
    case PGLB_OP_MOE_COMBINE:
    case PGLB_OP_SCALE_ROWS_SIGMOID:
      return supports(Feature::MixtureOfExperts);
    case PGLB_OP_CAUSAL_CONV1D:
    case PGLB_OP_GATED_DELTA_RULE:
      return supports(Feature::LinearAttention);
    case PGLB_OP_MATMUL:  // a weight's type: operand 0
      return q.n_operands == 0 || supports_weight(static_cast<DType>(q.types[0]));
    case PGLB_OP_SOFTCAP:
    case PGLB_OP_SAMPLE:
    case PGLB_OP_LAYER_NORM:
    case PGLB_OP_ACTIVATION:
    case PGLB_OP_LORA_MATMUL:
    case PGLB_OP_ATTENTION_KV:
    case PGLB_OP_GATHER_KV:
      return false;
    default:
      return q.op >= 0 && q.op < PGLB_OP_COUNT;
  }
}

void Backend::softcap(Buffer&, int64_t, float) { fail("the {} backend has no softcap op", name()); }
void Backend::attention_kv(const Buffer&, const Buffer&, const KvRowLayout&, Buffer&, const AttentionConfig&) {
  fail("the {} backend has no attention_kv op", name());
}
void Backend::gather_kv(int, std::span<const uint8_t>, Buffer&) { fail("the {} backend has no gather_kv op", name()); }
void Backend::layer_norm(const Buffer&, const Weight*, const Weight*, int64_t, int64_t, float, Buffer&) {
  fail("the {} backend has no layer_norm op", name());
}
void Backend::activation(const Buffer&, int64_t, Activation, Buffer&) {
  fail("the {} backend has no activation op", name());
}
void Backend::scale(Buffer& x, int64_t n, float s) {
  std::vector<float> host(static_cast<size_t>(n));
  copy_to_host(x, 0, host.size() * sizeof(float), host.data());
  synchronize();
  for (float& v : host) v *= s;
  copy_from_host(host.data(), x, 0, host.size() * sizeof(float));
  synchronize();  // `host` goes out of scope
}
void Backend::sample(const Buffer&, int64_t, const std::vector<SampleDraw>&, Buffer&) {
  fail("the {} backend has no sample op", name());
}
std::vector<uint8_t> Backend::comm_unique_id() { fail("the {} backend has no device communicator", name()); }
std::unique_ptr<DeviceComm> Backend::comm_init(int, int, const std::vector<uint8_t>&) {
  fail("the {} backend has no device communicator", name());
}


}  // namespace pagellm
