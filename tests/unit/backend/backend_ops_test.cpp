// The op suite every backend passes: the same test bodies, parameterized over
// each backend present in the build (the CPU with its portable and AVX2
// kernels always; OpenCL when its plugin was built and a device exists; the
// C11 test plugin of tests/plugins/c_scalar, through the plain C ABI),
// against plain double-precision references on random data. Tests reach the
// backend only through its own calls: alloc, copy_from_host, the op,
// copy_to_host, synchronize. docs/backends.md points new backends here.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <numeric>
#include <random>

#include "backend/backend.h"
#include "backend/registry.h"
#include "core/cpu_features.h"
#include "core/error.h"
#include "core/fp16.h"
#include "core/quant_blocks.h"
#include "sampling/sampler.h"
#include "backend_test_util.h"
#include "hostile_input.h"

namespace pagellm {
namespace {

using namespace backend_test;

struct BackendCase {
  const char* label;   // test name suffix
  const char* device;  // --device
  const char* isa;     // PAGELLM_ISA for the CPU, or null
};

std::ostream& operator<<(std::ostream& os, const BackendCase& c) { return os << c.label; }

// Creates the backend of the case, or skips the test when it is not in this
// build or has no device here.
class BackendOps : public ::testing::TestWithParam<BackendCase> {
 public:
  void SetUp() override {
    const BackendCase& c = GetParam();
    if (c.isa) {
      Isa isa = Isa::Scalar;
      ASSERT_TRUE(parse_isa(c.isa, isa)) << c.isa;
      if (!cpu_features().supports(isa)) GTEST_SKIP() << "this CPU (or architecture) has no " << c.isa;
      setenv("PAGELLM_ISA", c.isa, 1);
    }
    BackendOptions o;
    if (std::string(c.device) == "cpu") o["threads"] = "2";
    // The C11 plugin (tests/plugins/c_scalar) is loaded from the build, as any plugin is.
    if (std::string(c.device) == "cscalar") load_backend_plugin(PAGELLM_TEST_PLUGIN_DIR "/libpagellm_backend_cscalar.so");
    try {
      be_ = create_backend(c.device, o);
    } catch (const Error& e) {
      const std::string what = e.what();
      if (what.find("built without") != std::string::npos || what.find("no OpenCL") != std::string::npos ||
          what.find("no device") != std::string::npos)
        GTEST_SKIP() << what;
      throw;
    }
  }
  void TearDown() override {
    be_.reset();
    if (GetParam().isa) unsetenv("PAGELLM_ISA");
  }

  BufferPtr put(const std::vector<float>& v) { return upload(*be_, v); }
  BufferPtr zeros_like(size_t n, float fill = -7.0f) { return put(std::vector<float>(n, fill)); }
  std::vector<float> get(const Buffer& b, size_t n) { return download(*be_, b, n); }
  std::unique_ptr<Weight> upload_weight(const std::string& name, DType type, std::vector<int64_t> shape,
                                       const void* data) {
    TensorData t{name, type, std::move(shape), data};
    return be_->upload(t);
  }

  std::unique_ptr<Backend> be_;
};

// ---------------------------------------------------------------- matmul, embed

// The values a backend multiplies with: the file's, or, when it converted the
// type at upload (Weight::held_type), those of the reference conversion.
std::vector<float> as_held(const Weight& w, std::vector<float> values) {
  if (w.held_type == w.type || w.rows == 1) return values;
  return dequantize_rows(w.held_type, quantize_rows(w.held_type, values, w.rows, w.cols), w.rows, w.cols);
}

// The start-up line names the kernels that run (the forced level for the CPU).
TEST_P(BackendOps, DescribeNamesTheKernels) {
  const BackendCase& c = GetParam();
  if (!c.isa) GTEST_SKIP() << "not a CPU case";
  EXPECT_NE(be_->describe().find(c.isa), std::string::npos) << be_->describe();
}

TEST_P(BackendOps, MatmulEveryWeightTypeMatchesDequantizedReference) {
  const int64_t rows = 78, cols = 512;  // rows: not a whole number of tiles or row groups
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0,
                  DType::Q5_1, DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_NL,
                  DType::IQ4_XS, DType::MXFP4}) {
    if (!be_->supports_weight(t)) continue;
    const auto q = quantize_rows(t, randn(static_cast<size_t>(rows * cols), 11), rows, cols);
    auto w = upload_weight("w", t, {cols, rows}, q.data());
    const auto wref = as_held(*w, dequantize_rows(t, q, rows, cols));
    EXPECT_GT(w->held_bytes, 0u) << dtype_name(t);
    for (int64_t n : {1, 3, 17, 64}) {
      const auto x = randn(static_cast<size_t>(n * cols), 12 + static_cast<uint32_t>(n));
      auto xb = put(x);
      auto yb = zeros_like(static_cast<size_t>(n * rows));
      be_->matmul(*w, *xb, n, *yb);
      const auto y = get(*yb, static_cast<size_t>(n * rows));
      std::vector<double> ref(y.size());
      for (int64_t i = 0; i < n; ++i)
        for (int64_t r = 0; r < rows; ++r) {
          double s = 0;
          for (int64_t c = 0; c < cols; ++c) s += static_cast<double>(x[i * cols + c]) * wref[r * cols + c];
          ref[i * rows + r] = s;
        }
      // Float weights: float accumulation. Quantized ones may round the
      // activations to 8 bits (the CPU does): about 1% relative. BF16 ones
      // may round them to bf16 (the CPU's AVX512-BF16 kernels do): a
      // relative rms of ~1.6e-3 per product and per dot (see matmul_test.cpp).
      const double tol = dtype_is_quantized(w->held_type) ? 2e-2 : w->held_type == DType::BF16 ? 1e-2 : 1e-5;
      EXPECT_LT(rel_l2(y, ref), tol) << dtype_name(t) << " n " << n;
    }
  }
}

TEST_P(BackendOps, EmbedLooksUpScaledRows) {
  const int64_t vocab = 300, dim = 256;
  for (DType t : {DType::F32, DType::F16, DType::Q8_0, DType::Q4_K, DType::Q6_K, DType::Q3_K, DType::IQ4_XS,
                  DType::MXFP4}) {
    if (!be_->supports_weight(t)) continue;
    const auto q = quantize_rows(t, randn(static_cast<size_t>(vocab * dim), 21), vocab, dim);
    auto table = upload_weight("token_embd.weight", t, {dim, vocab}, q.data());
    const auto ref_table = as_held(*table, dequantize_rows(t, q, vocab, dim));
    BatchInfo b;
    for (int32_t id : {5, 0, 299, 17, 5}) {
      b.token_ids.push_back(id);
      b.positions.push_back(static_cast<int32_t>(b.positions.size()));
      b.slot_mapping.push_back(0);
    }
    be_->set_batch(b);
    auto out = zeros_like(static_cast<size_t>(b.n_tokens() * dim));
    be_->embed(*table, 1.5f, *out);
    const auto y = get(*out, static_cast<size_t>(b.n_tokens() * dim));
    std::vector<double> ref(y.size());
    for (int64_t i = 0; i < b.n_tokens(); ++i)
      for (int64_t c = 0; c < dim; ++c) ref[i * dim + c] = 1.5 * ref_table[b.token_ids[i] * dim + c];
    EXPECT_LT(rel_l2(y, ref), 1e-6) << dtype_name(t);
  }
}

// ---------------------------------------------------------------- attention

// Writes random K/V for every position of each sequence into a paged cache
// (shuffled, non-contiguous block tables), runs attention, and compares with a
// full-softmax reference computed from the same (rounded) K/V.
void check_attention(BackendOps& t, Backend& be, const AttnCase& c, uint32_t seed) {
  const int D = c.head_dim, B = c.block;
  int total_blocks = 1;
  for (auto [ql, ctx] : c.seqs) total_blocks += (ctx + B - 1) / B;
  KVCacheSpec spec;
  spec.n_layers = 1;
  spec.n_kv_heads = c.n_kv;
  spec.head_dim = D;
  spec.block_size = B;
  spec.num_blocks = total_blocks + 3;
  spec.dtype = c.int8 ? DType::I8 : c.f16 ? DType::F16 : DType::F32;
  spec.v_is_k = c.v_is_k;
  be.allocate_kv_cache(spec);
  std::vector<int32_t> free_blocks(spec.num_blocks - 1);
  std::iota(free_blocks.begin(), free_blocks.end(), 1);
  std::mt19937 rng(seed);
  std::shuffle(free_blocks.begin(), free_blocks.end(), rng);

  // Pass 1: fill each sequence's cache for all ctx positions (one batch).
  BatchInfo fill;
  std::vector<std::vector<int32_t>> tables;
  for (auto [ql, ctx] : c.seqs) {
    std::vector<int32_t> tb;
    for (int b = 0; b < (ctx + B - 1) / B; ++b) {
      tb.push_back(free_blocks.back());
      free_blocks.pop_back();
    }
    SeqInfo s;
    s.q_start = static_cast<int32_t>(fill.token_ids.size());
    s.q_len = ctx;
    s.ctx_len = ctx;
    s.block_table = tb;
    for (int p = 0; p < ctx; ++p) {
      fill.token_ids.push_back(0);
      fill.positions.push_back(p);
      fill.slot_mapping.push_back(static_cast<int64_t>(tb[p / B]) * B + p % B);
    }
    fill.seqs.push_back(s);
    tables.push_back(tb);
  }
  const int64_t n_fill = fill.n_tokens();
  auto k = randn(n_fill * c.n_kv * D, seed + 1), v = randn(n_fill * c.n_kv * D, seed + 2);
  be.set_batch(fill);
  {
    auto kb = t.put(k), vb = t.put(v);
    be.store_kv(0, *kb, *vb);  // with v_is_k, v is ignored
    be.synchronize();
  }
  if (c.v_is_k) v = k;
  if (c.int8) {
    // What the cache holds: each (token, head) vector as q * max|x| / 127.
    for (auto* x : {&k, &v})
      for (size_t r = 0; r < x->size(); r += static_cast<size_t>(D)) {
        float amax = 0;
        for (int d = 0; d < D; ++d) amax = std::max(amax, std::fabs((*x)[r + d]));
        for (int d = 0; d < D; ++d) (*x)[r + d] = std::nearbyint((*x)[r + d] * (127.0f / amax)) * (amax / 127.0f);
      }
  } else if (c.f16) {
    for (auto* x : {&k, &v})
      for (auto& e : *x) e = fp16_to_fp32(fp32_to_fp16(e));
  }

  // Pass 2: the query batch: the last q_len positions of each sequence.
  BatchInfo qb;
  std::vector<int64_t> fill_start;
  int64_t at = 0;
  for (size_t si = 0; si < c.seqs.size(); ++si) {
    auto [ql, ctx] = c.seqs[si];
    SeqInfo s;
    s.q_start = static_cast<int32_t>(qb.token_ids.size());
    s.q_len = ql;
    s.ctx_len = ctx;
    s.block_table = tables[si];
    s.kv_sinks = c.evict_sinks;
    s.kv_evicted_to = c.evict_to;
    for (int p = ctx - ql; p < ctx; ++p) {
      qb.token_ids.push_back(0);
      qb.positions.push_back(p);
      qb.slot_mapping.push_back(static_cast<int64_t>(tables[si][p / B]) * B + p % B);
    }
    qb.seqs.push_back(s);
    fill_start.push_back(at);
    at += ctx;
  }
  const int64_t nq = qb.n_tokens();
  auto q = randn(nq * c.n_head * D, seed + 3);
  AttentionConfig ac;
  ac.n_head = c.n_head;
  ac.n_head_kv = c.n_kv;
  ac.head_dim = D;
  ac.scale = 1.0f / std::sqrt(static_cast<float>(D));
  ac.sliding_window = c.window;
  ac.softcap = c.softcap;
  ac.non_causal = c.non_causal;
  std::vector<float> sinks;
  std::unique_ptr<Weight> sink_w;
  if (c.sinks) {
    sinks = randn(static_cast<size_t>(c.n_head), seed + 4, 2.0f);
    sink_w = t.upload_weight("attn_sinks.weight", DType::F32, {c.n_head}, sinks.data());
    ac.sinks = sink_w.get();
  }
  be.set_batch(qb);
  auto qbuf = t.put(q);
  auto obuf = t.zeros_like(q.size());
  be.attention(0, *qbuf, *obuf, ac);
  const auto out = t.get(*obuf, q.size());

  std::vector<double> ref(out.size());
  const int G = c.n_head / c.n_kv;
  for (size_t si = 0; si < c.seqs.size(); ++si) {
    auto [ql, ctx] = c.seqs[si];
    for (int i = 0; i < ql; ++i) {
      const int row = qb.seqs[si].q_start + i, p = ctx - ql + i;
      for (int h = 0; h < c.n_head; ++h) {
        const int g = h / G;
        std::vector<double> w;
        std::vector<int> js;
        double mx = -1e300;
        for (int j = 0; j <= (c.non_causal ? ctx - 1 : p); ++j) {
          if (c.window > 0 && j <= p - c.window) continue;
          if (c.non_causal && c.window > 0 && j >= p + c.window) continue;  // symmetric: |p - j| < window
          if (j >= c.evict_sinks && j < c.evict_to) continue;
          const float* kr = k.data() + ((fill_start[si] + j) * c.n_kv + g) * D;
          double s = 0;
          for (int d = 0; d < D; ++d) s += static_cast<double>(q[(row * c.n_head + h) * D + d]) * kr[d];
          s *= ac.scale;
          if (c.softcap > 0) s = c.softcap * std::tanh(s / c.softcap);
          w.push_back(s);
          js.push_back(j);
          mx = std::max(mx, s);
        }
        if (c.sinks) mx = std::max(mx, static_cast<double>(sinks[h]));
        double l = c.sinks ? std::exp(sinks[h] - mx) : 0.0;
        for (auto& x : w) l += (x = std::exp(x - mx));
        for (int d = 0; d < D; ++d) {
          double acc = 0;
          for (size_t tt = 0; tt < js.size(); ++tt)
            acc += w[tt] * v[((fill_start[si] + js[tt]) * c.n_kv + g) * D + d];
          ref[(row * c.n_head + h) * D + d] = acc / l;
        }
      }
    }
  }
  // int8: the kernel applies each key's scale to its dot product, not to
  // every element, which rounds differently.
  EXPECT_LT(rel_l2(out, ref), c.int8 ? 1e-5 : 2e-6) << "heads " << c.n_head << "/" << c.n_kv << " D " << D << " B " << B
                                       << " window " << c.window << " softcap " << c.softcap << " f16 " << c.f16;
}

TEST_P(BackendOps, PagedAttentionMatchesReference) {
  const std::vector<AttnCase> cases = {
      // prefill of one sequence (tiles), GQA 8:1, Llama-like
      {32, 4, 64, 16, 0, 0, true, {{70, 70}}},
      // mixed batch: prefill chunk continuing a prefix, decodes, a one-token prompt
      {8, 2, 64, 16, 0, 0, false, {{33, 90}, {1, 200}, {1, 17}, {1, 1}}},
      // Gemma-like: head_dim 256, one KV head, sliding window, softcap
      {4, 1, 256, 16, 24, 0, true, {{40, 40}, {1, 300}}},
      {4, 1, 256, 32, 24, 30.0f, false, {{5, 100}}},
      // MHA, head_dim 128, block 64, long decode (split key ranges)
      {4, 4, 128, 64, 0, 0, true, {{1, 700}}},
      {2, 1, 64, 8, 0, 0, false, {{1, 1000}}},
      {16, 16, 64, 16, 0, 0, true, {{3, 3}, {2, 50}}},
      // stories260K-like: head_dim 8, GQA 8:4; an odd head_dim of 40; more
      // query heads per KV head than a GPU work-group row set (12:1)
      {8, 4, 8, 16, 0, 0, true, {{1, 40}, {5, 37}, {16, 16}, {1, 1}}},
      {8, 4, 8, 16, 0, 0, false, {{1, 1500}}},
      {6, 2, 40, 16, 0, 0, false, {{7, 60}, {1, 700}}},
      {12, 1, 64, 32, 0, 0, true, {{2, 33}, {9, 9}}},
  };
  uint32_t seed = 100;
  for (const auto& c : cases) check_attention(*this, *be_, c, seed++);
}

// Bidirectional attention (encoders): each sequence's whole prompt in one
// step, every query over every key, whatever its tile; GQA and MHA, F16 and
// F32 caches, several sequences in one batch.
TEST_P(BackendOps, NonCausalAttentionSeesEveryKey) {
  if (!be_->supports(Feature::NonCausalAttention)) GTEST_SKIP() << "no non-causal attention";
  std::vector<AttnCase> cases = {
      {4, 4, 64, 16, 0, 0, false, {{37, 37}}},
      {8, 2, 64, 16, 0, 0, true, {{70, 70}, {1, 1}, {5, 5}}},
      {12, 4, 32, 32, 0, 0, true, {{9, 9}, {40, 40}}},
      {6, 1, 128, 16, 0, 0, false, {{2, 2}, {33, 33}}},
  };
  for (auto& c : cases) c.non_causal = true;
  uint32_t seed = 500;
  for (const auto& c : cases) check_attention(*this, *be_, c, seed++);
}

// Bidirectional sliding windows (EmbeddingGemma's local layers): a query at
// p sees keys at |p - j| < window; windows shorter and longer than a tile
// and a block, prompts shorter and longer than the window, GQA and MHA.
TEST_P(BackendOps, NonCausalAttentionSymmetricWindow) {
  if (!be_->supports(Feature::SymmetricWindowAttention)) GTEST_SKIP() << "no symmetric-window attention";
  std::vector<AttnCase> cases = {
      {4, 1, 64, 16, 5, 0, false, {{37, 37}, {3, 3}}},
      {8, 2, 64, 16, 17, 0, true, {{70, 70}, {1, 1}, {16, 16}}},
      {3, 3, 32, 32, 1, 0, false, {{9, 9}}},
      {6, 1, 128, 16, 40, 0, false, {{2, 2}, {100, 100}}},
  };
  for (auto& c : cases) c.non_causal = true;
  uint32_t seed = 600;
  for (const auto& c : cases) check_attention(*this, *be_, c, seed++);
}

// Attention over keys and values the step made (attention_kv: MLA's
// expanded form): whole sequences, keys and values in one row per token and
// KV head with room around them, values narrower than keys; compared with a
// full-softmax reference.
TEST_P(BackendOps, AttentionOverStepKeysMatchesReference) {
  if (!be_->supports_op(op_query(PGLB_OP_ATTENTION_KV))) GTEST_SKIP() << "no attention_kv";
  struct Case {
    int n_head, n_kv, D, Dv, v_offset, row, window;
    std::vector<int> seqs;
  };
  const std::vector<Case> cases = {
      {16, 16, 192, 128, 192, 320, 0, {70, 1, 33}},  // DeepSeek's expanded heads
      {8, 2, 24, 16, 32, 56, 0, {40, 5}},            // GQA, a gap between key and value
      {4, 4, 64, 64, 64, 128, 0, {130}},             // more than two 64-key chunks
      {4, 1, 32, 32, 32, 64, 10, {50, 9}},           // a sliding window
  };
  uint32_t seed = 1300;
  for (const Case& c : cases) {
    KVCacheSpec spec;  // attention_kv reads no cache, but a batch has its blocks
    spec.n_layers = 1;
    spec.n_kv_heads = 1;
    spec.head_dim = 8;
    spec.num_blocks = 1;
    for (int len : c.seqs) spec.num_blocks += (len + 15) / 16;
    be_->allocate_kv_cache(spec);
    BatchInfo b;
    int32_t next_block = 1;
    for (int len : c.seqs) {
      SeqInfo si;
      si.q_start = static_cast<int32_t>(b.token_ids.size());
      si.q_len = si.ctx_len = len;
      for (int p = 0; p < len; ++p) {
        if (p % 16 == 0) si.block_table.push_back(next_block++);
        b.token_ids.push_back(0);
        b.positions.push_back(p);
        b.slot_mapping.push_back(int64_t{si.block_table.back()} * 16 + p % 16);
      }
      b.seqs.push_back(si);
    }
    const int64_t n = b.n_tokens();
    const auto q = randn(n * c.n_head * c.D, seed++);
    const auto kv = randn(n * c.n_kv * c.row, seed++);
    AttentionConfig ac;
    ac.n_head = c.n_head;
    ac.n_head_kv = c.n_kv;
    ac.head_dim = c.D;
    ac.scale = 1.0f / std::sqrt(static_cast<float>(c.D));
    ac.sliding_window = c.window;
    be_->set_batch(b);
    auto qb = put(q), kvb = put(kv);
    auto ob = zeros_like(n * c.n_head * c.Dv);
    be_->attention_kv(*qb, *kvb, KvRowLayout{c.row, c.v_offset, c.Dv}, *ob, ac);
    const auto out = get(*ob, static_cast<size_t>(n * c.n_head * c.Dv));

    std::vector<double> ref(out.size());
    const int G = c.n_head / c.n_kv;
    for (const SeqInfo& si : b.seqs)
      for (int i = 0; i < si.q_len; ++i)
        for (int h = 0; h < c.n_head; ++h) {
          const int64_t row = si.q_start + i;
          const float* kv_of = kv.data() + static_cast<int64_t>(si.q_start) * c.n_kv * c.row + (h / G) * c.row;
          std::vector<double> w;
          double mx = -1e300;
          const int j0 = c.window > 0 ? std::max(0, i - c.window + 1) : 0;
          for (int j = j0; j <= i; ++j) {
            double dot = 0;
            for (int d = 0; d < c.D; ++d)
              dot += static_cast<double>(q[(row * c.n_head + h) * c.D + d]) * kv_of[j * c.n_kv * c.row + d];
            w.push_back(dot * ac.scale);
            mx = std::max(mx, w.back());
          }
          double l = 0;
          for (auto& x : w) l += (x = std::exp(x - mx));
          for (int d = 0; d < c.Dv; ++d) {
            double acc = 0;
            for (int j = j0; j <= i; ++j) acc += w[j - j0] * kv_of[j * c.n_kv * c.row + c.v_offset + d];
            ref[(row * c.n_head + h) * c.Dv + d] = acc / l;
          }
        }
    EXPECT_LT(rel_l2(out, ref), 2e-6) << "heads " << c.n_head << "/" << c.n_kv << " D " << c.D << " Dv " << c.Dv;
  }
  // A sequence with cached keys before the step (row 0) is left to the
  // cache's attention: its output row keeps what it held.
  BatchInfo mixed;
  mixed.token_ids = {0, 0, 0, 0};
  mixed.positions = {5, 0, 1, 2};
  mixed.slot_mapping = {16 + 5, 32, 33, 34};
  SeqInfo cached;
  cached.q_len = 1;
  cached.ctx_len = 6;
  cached.block_table = {1};
  SeqInfo fresh;
  fresh.q_start = 1;
  fresh.q_len = fresh.ctx_len = 3;
  fresh.block_table = {2};
  mixed.seqs = {cached, fresh};
  be_->set_batch(mixed);
  AttentionConfig ac;
  ac.n_head = ac.n_head_kv = 1;
  ac.head_dim = 8;
  auto qb = put(randn(4 * 8, 1)), kvb = put(randn(4 * 16, 2));
  auto ob = zeros_like(4 * 8);
  be_->attention_kv(*qb, *kvb, KvRowLayout{16, 8, 8}, *ob, ac);
  const auto out = get(*ob, 4 * 8);
  for (int d = 0; d < 8; ++d) EXPECT_EQ(out[d], -7.0f) << d;
  for (int d = 8; d < 32; ++d) EXPECT_NE(out[d], -7.0f) << d;
}

// Attention over every key of some sequences given as rows (attention_kv
// with context rows: MLA's expanded form for a prompt chunk after cached
// keys): a chunk after 30 cached keys, a whole prompt, and an unmarked
// decode whose row keeps what it held.
TEST_P(BackendOps, AttentionOverGivenContextKeysMatchesReference) {
  if (!be_->supports_op(op_query(PGLB_OP_ATTENTION_KV))) GTEST_SKIP() << "no attention_kv";
  const int n_head = 8, n_kv = 2, D = 48, Dv = 32, v_offset = 48, row = 80;
  be_->allocate_kv_cache(cache_spec(1, 1, 8, 16));
  struct S {
    int q_len, ctx_len;
  };
  const std::vector<S> seqs = {{20, 50}, {9, 9}, {1, 40}};
  const std::vector<uint8_t> marked = {1, 1, 0};
  BatchInfo b;
  int32_t next_block = 1;
  for (const S& x : seqs) {
    SeqInfo si;
    si.q_start = static_cast<int32_t>(b.token_ids.size());
    si.q_len = x.q_len;
    si.ctx_len = x.ctx_len;
    for (int p = 0; p < x.ctx_len; p += 16) si.block_table.push_back(next_block++);
    for (int p = x.ctx_len - x.q_len; p < x.ctx_len; ++p) {
      b.token_ids.push_back(0);
      b.positions.push_back(p);
      b.slot_mapping.push_back(int64_t{si.block_table[static_cast<size_t>(p / 16)]} * 16 + p % 16);
    }
    b.seqs.push_back(si);
  }
  be_->set_batch(b);
  const int64_t n = b.n_tokens(), kv_rows = 50 + 9;
  const auto q = randn(n * n_head * D, 1400);
  const auto kv = randn(kv_rows * n_kv * row, 1401);
  AttentionConfig ac;
  ac.n_head = n_head;
  ac.n_head_kv = n_kv;
  ac.head_dim = D;
  ac.scale = 1.0f / std::sqrt(static_cast<float>(D));
  ac.kv_seqs = marked;
  auto qb = put(q), kvb = put(kv);
  auto ob = put(std::vector<float>(static_cast<size_t>(n * n_head * Dv), -7.0f));
  be_->attention_kv(*qb, *kvb, KvRowLayout{row, v_offset, Dv, true}, *ob, ac);
  const auto out = get(*ob, static_cast<size_t>(n * n_head * Dv));

  std::vector<double> ref(out.size(), -7.0);
  int64_t first_key = 0;
  for (size_t si = 0; si < seqs.size(); ++si) {
    if (!marked[si]) continue;
    const SeqInfo& s = b.seqs[si];
    for (int i = 0; i < s.q_len; ++i) {
      const int pos = s.ctx_len - s.q_len + i;
      for (int h = 0; h < n_head; ++h) {
        const int64_t t = s.q_start + i;
        const float* keys = kv.data() + first_key * n_kv * row + (h / (n_head / n_kv)) * row;
        std::vector<double> w;
        double mx = -1e300;
        for (int j = 0; j <= pos; ++j) {
          double dot = 0;
          for (int d = 0; d < D; ++d) dot += static_cast<double>(q[(t * n_head + h) * D + d]) * keys[j * n_kv * row + d];
          w.push_back(dot * ac.scale);
          mx = std::max(mx, w.back());
        }
        double l = 0;
        for (auto& x : w) l += (x = std::exp(x - mx));
        for (int d = 0; d < Dv; ++d) {
          double acc = 0;
          for (int j = 0; j <= pos; ++j) acc += w[static_cast<size_t>(j)] * keys[j * n_kv * row + v_offset + d];
          ref[static_cast<size_t>((t * n_head + h) * Dv + d)] = acc / l;
        }
      }
    }
    first_key += s.ctx_len;
  }
  EXPECT_LT(rel_l2(out, ref), 2e-6);
  const size_t decode_row = static_cast<size_t>(b.seqs[2].q_start) * n_head * Dv;
  for (size_t d = decode_row; d < out.size(); ++d) ASSERT_EQ(out[d], -7.0f) << d;
}

// gather_kv: the cached keys of the marked sequences, every position, in
// batch order, from scattered blocks, for each cache type (F16 and int8 as
// they were stored: rounded).
TEST_P(BackendOps, GatherKvReturnsTheCachedKeys) {
  if (!be_->supports_op(op_query(PGLB_OP_GATHER_KV))) GTEST_SKIP() << "no gather_kv";
  const int n_kv = 2, D = 32, row = n_kv * D;
  const std::vector<int> lens = {37, 5, 20};
  const std::vector<std::vector<int32_t>> tables = {{7, 2, 9}, {4}, {1, 8}};
  const std::vector<uint8_t> marked = {1, 0, 1};
  for (DType dt : {DType::F32, DType::F16, DType::I8}) {
    if (dt == DType::I8 && be_->name() != "cpu") continue;
    SCOPED_TRACE(dtype_name(dt));
    be_->allocate_kv_cache(cache_spec(2, n_kv, D, 10, dt));
    BatchInfo fill;
    for (size_t i = 0; i < lens.size(); ++i) {
      SeqInfo si;
      si.q_start = static_cast<int32_t>(fill.token_ids.size());
      si.q_len = si.ctx_len = lens[i];
      si.block_table = tables[i];
      for (int p = 0; p < lens[i]; ++p) {
        fill.token_ids.push_back(0);
        fill.positions.push_back(p);
        fill.slot_mapping.push_back(int64_t{tables[i][static_cast<size_t>(p / 16)]} * 16 + p % 16);
      }
      fill.seqs.push_back(si);
    }
    be_->set_batch(fill);
    const auto k = randn(fill.n_tokens() * row, 1500), v = randn(fill.n_tokens() * row, 1501);
    {
      auto kb = put(k), vb = put(v);
      be_->store_kv(1, *kb, *vb);
    }
    // The next step: one more token of each (not stored), the same tables.
    BatchInfo step;
    for (size_t i = 0; i < lens.size(); ++i) {
      SeqInfo si = fill.seqs[i];
      si.q_start = static_cast<int32_t>(i);
      si.q_len = 1;
      step.token_ids.push_back(0);
      step.positions.push_back(lens[i] - 1);
      step.slot_mapping.push_back(0);
      step.seqs.push_back(si);
    }
    be_->set_batch(step);
    const int64_t rows = lens[0] + lens[2];
    auto ob = zeros_like(rows * row);
    be_->gather_kv(1, marked, *ob);
    const auto out = get(*ob, static_cast<size_t>(rows * row));
    int64_t r = 0;
    for (size_t i = 0; i < lens.size(); ++i) {
      if (!marked[i]) continue;
      for (int p = 0; p < lens[i]; ++p, ++r)
        for (int g = 0; g < n_kv; ++g) {
          const float* want = k.data() + (fill.seqs[i].q_start + p) * row + g * D;
          float amax = 0;
          for (int d = 0; d < D; ++d) amax = std::max(amax, std::fabs(want[d]));
          for (int d = 0; d < D; ++d) {
            const float got = out[static_cast<size_t>(r * row + g * D + d)];
            if (dt == DType::F32) ASSERT_EQ(got, want[d]);
            if (dt == DType::F16) ASSERT_EQ(got, fp16_to_fp32(fp32_to_fp16(want[d])));
            if (dt == DType::I8) ASSERT_NEAR(got, want[d], amax / 127 * 0.51f);
          }
        }
    }
  }
}

// --dtype bfloat16 (the CPU backend's dtype option): an F16 matrix runs
// exactly as the BF16 matrix of its rounded values does, for a decode row
// and a prompt tile alike.
TEST(CpuDtypeOption, F16MatricesRunAsTheirBf16Rounding) {
  auto plain = create_backend("cpu", {{"threads", "2"}});
  auto as_bf16 = create_backend("cpu", {{"threads", "2"}, {"dtype", "bfloat16"}});
  EXPECT_NE(as_bf16->describe().find("F16 matrices as BF16"), std::string::npos) << as_bf16->describe();
  const int64_t rows = 70, cols = 256;
  const auto w = randn(static_cast<size_t>(rows * cols), 1600);
  std::vector<uint16_t> f16(w.size()), bf16(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    f16[i] = fp32_to_fp16(w[i]);
    bf16[i] = fp32_to_bf16(fp16_to_fp32(f16[i]));
  }
  auto w_f16 = as_bf16->upload(TensorData{"w", DType::F16, {cols, rows}, f16.data()});
  auto w_bf16 = plain->upload(TensorData{"w", DType::BF16, {cols, rows}, bf16.data()});
  auto w_plain = plain->upload(TensorData{"w", DType::F16, {cols, rows}, f16.data()});
  const auto run = [&](Backend& be, const Weight& wt, const std::vector<float>& x, int64_t n) {
    auto xb = be.alloc(DType::F32, x.size());
    auto yb = be.alloc(DType::F32, static_cast<size_t>(n * rows));
    be.copy_from_host(x.data(), *xb, 0, x.size() * sizeof(float));
    be.matmul(wt, *xb, n, *yb);
    std::vector<float> y(static_cast<size_t>(n * rows));
    be.copy_to_host(*yb, 0, y.size() * sizeof(float), y.data());
    be.synchronize();
    return y;
  };
  for (int64_t n : {1, 37}) {
    const auto x = randn(static_cast<size_t>(n * cols), 1601 + static_cast<uint32_t>(n));
    const auto got = run(*as_bf16, *w_f16, x, n), want = run(*plain, *w_bf16, x, n);
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float))) << n;
    EXPECT_NE(run(*plain, *w_plain, x, n), got) << "the F16 values themselves, not their rounding";
  }
  EXPECT_NE(test::error_of([] { create_backend("cpu", {{"dtype", "float16"}}); }).find("auto (weights as stored) or bfloat16"),
            std::string::npos);
}

// A cache without V (KVCacheSpec::v_is_k): the values are the keys, as an
// MLA latent is both; one KV head of DeepSeek's 576 dims and up to 128
// query heads on it.
TEST_P(BackendOps, PagedAttentionReadsValuesFromKeys) {
  if (!be_->supports(Feature::KvVIsK)) return;
  std::vector<AttnCase> cases = {
      {16, 1, 576, 16, 0, 0, false, {{20, 20}, {1, 100}, {3, 40}}},
      {128, 1, 576, 16, 0, 0, true, {{2, 2}, {1, 70}}},
      {8, 1, 288, 16, 0, 0, true, {{33, 90}, {1, 300}}},
  };
  for (auto& c : cases) c.v_is_k = true;
  AttnCase int8 = cases[2];
  int8.int8 = true;
  cases.push_back(int8);
  uint32_t seed = 900;
  for (const auto& c : cases) check_attention(*this, *be_, c, seed++);
  // Half the bytes of a cache with V.
  KVCacheSpec spec;
  spec.n_layers = 2;
  spec.n_kv_heads = 1;
  spec.head_dim = 576;
  const size_t with_v = spec.bytes_per_block();
  spec.v_is_k = true;
  EXPECT_EQ(spec.bytes_per_block() * 2, with_v);
}

TEST_P(BackendOps, PagedAttentionSkipsEvictedKeys) {
  if (!be_->supports(Feature::KvEviction)) GTEST_SKIP() << "no sliding KV eviction";
  std::vector<AttnCase> cases = {
      {8, 2, 64, 16, 0, 0, true, {{1, 300}, {20, 290}}},   // decode and a chunk after the gap
      {4, 1, 256, 16, 24, 0, false, {{1, 400}}},           // with a model window as well
      {2, 1, 64, 8, 0, 0, false, {{1, 1000}}},             // split key ranges
  };
  uint32_t seed = 400;
  for (auto& c : cases) {
    c.evict_sinks = 4;
    c.evict_to = 160;
    check_attention(*this, *be_, c, seed++);
  }
}

TEST_P(BackendOps, PagedAttentionInt8CacheMatchesReference) {
  if (be_->name() != "cpu") GTEST_SKIP() << "int8 KV caches: CPU backend only";
  std::vector<AttnCase> cases = {
      {32, 4, 64, 16, 0, 0, false, {{70, 70}}},                             // prefill tiles
      {8, 2, 64, 16, 0, 0, false, {{33, 90}, {1, 200}, {1, 17}, {1, 1}}},   // mixed batch, direct decode path
      {4, 1, 256, 16, 24, 30.0f, false, {{40, 40}, {1, 300}}},              // Gemma-like, window, softcap
      {2, 1, 64, 8, 0, 0, false, {{1, 1000}}},                              // split key ranges
      {6, 2, 40, 16, 0, 0, false, {{7, 60}, {1, 700}}},                     // odd head_dim
  };
  uint32_t seed = 300;
  for (auto& c : cases) {
    c.int8 = true;
    check_attention(*this, *be_, c, seed++);
  }
}

// A query row's result does not depend on how many rows of its sequence run
// with it: decoding one token and verifying several speculative tokens (or
// a prefill chunk) give the same bits on the CPU.
TEST_P(BackendOps, AttentionRowsDoNotDependOnTheirTile) {
  if (be_->name() != "cpu") return;  // a device may reduce in other orders
  struct Shape {
    int n_head, n_kv, D;
    bool f16;
    int window = 0;
  };
  uint32_t seed = 900;
  for (const Shape& sh : {Shape{8, 4, 8, true}, Shape{8, 2, 64, false}, Shape{4, 1, 256, true}, Shape{4, 4, 128, true},
                          Shape{12, 1, 64, false}, Shape{6, 2, 40, true}, Shape{8, 2, 64, true, 20},
                          Shape{4, 4, 32, false, 35}}) {
    SCOPED_TRACE(sh.D);
    const int ctx = 45, m = 6, B = 16, D = sh.D;
    be_->allocate_kv_cache(cache_spec(1, sh.n_kv, D, 8, sh.f16 ? DType::F16 : DType::F32));
    const std::vector<int32_t> table = {5, 2, 7};
    const BatchInfo fill = one_sequence(ctx, table, B);
    be_->set_batch(fill);
    {
      auto kb = put(randn(int64_t{ctx} * sh.n_kv * D, seed)), vb = put(randn(int64_t{ctx} * sh.n_kv * D, seed + 1));
      be_->store_kv(0, *kb, *vb);
    }
    const int64_t row = int64_t{sh.n_head} * D;
    const auto q = randn(m * row, seed + 2);
    seed += 3;
    AttentionConfig a;
    a.n_head = sh.n_head;
    a.n_head_kv = sh.n_kv;
    a.head_dim = D;
    a.scale = 0.3f;
    // A window makes a tile's first key (its first row's) differ from a lone
    // row's, within and across the kernel's key spans.
    a.sliding_window = sh.window;
    auto run = [&](int first, int n) {  // rows first .. first + n - 1 of the last m positions
      BatchInfo b;
      SeqInfo si;
      si.q_len = n;
      si.ctx_len = ctx - m + first + n;
      si.block_table = table;
      b.seqs.push_back(si);
      for (int t = 0; t < n; ++t) {
        const int pos = si.ctx_len - n + t;
        b.token_ids.push_back(0);
        b.positions.push_back(pos);
        b.slot_mapping.push_back(int64_t{table[pos / B]} * B + pos % B);
      }
      be_->set_batch(b);
      auto qb = put(std::vector<float>(q.begin() + first * row, q.begin() + (first + n) * row));
      auto ob = be_->alloc(DType::F32, static_cast<size_t>(n * row));
      be_->attention(0, *qb, *ob, a);
      return get(*ob, n * row);
    };
    const auto tile = run(0, m);
    for (int t = 0; t < m; ++t) {
      const auto one = run(t, 1);
      ASSERT_EQ(0, std::memcmp(one.data(), tile.data() + t * row, row * sizeof(float))) << "row " << t;
    }
  }
}

TEST_P(BackendOps, AttentionSinksJoinEverySoftmax) {
  // gpt-oss-like: GQA 8:1, head_dim 64, sliding and full, prefill, decode and split decode.
  const std::vector<AttnCase> cases = {
      {8, 1, 64, 16, 0, 0, false, {{20, 20}, {1, 90}}, true, true},
      {8, 1, 64, 16, 32, 0, true, {{40, 70}, {1, 1}}, true, true},
      {4, 2, 64, 16, 0, 0, false, {{1, 1000}}, true, true},
  };
  if (!be_->supports(Feature::AttentionSinks)) {
    EXPECT_THROW(check_attention(*this, *be_, cases[0], 300), Error);
    return;
  }
  uint32_t seed = 300;
  for (const auto& c : cases) check_attention(*this, *be_, c, seed++);
}

// A key behind the causal mask must not reach a result, whatever its bits
// (a never-written slot, or here a NaN value of the last token): only its
// own row may see it. Masking by multiplying with 0 fails this.
TEST_P(BackendOps, AttentionIgnoresMaskedValues) {
  const int n = 4, heads = 2, D = 8;
  be_->allocate_kv_cache(cache_spec(1, heads, D, 2));
  const BatchInfo b = one_sequence(n, {1}, 16);  // the backend may keep a pointer to it
  be_->set_batch(b);
  const auto k = randn(n * heads * D, 71), q = randn(n * heads * D, 72);
  auto v = randn(n * heads * D, 73);
  for (int e = 0; e < heads * D; ++e) v[(n - 1) * heads * D + e] = std::nanf("");
  auto kb = put(k), vb = put(v), qb = put(q);
  be_->store_kv(0, *kb, *vb);
  AttentionConfig a;
  a.n_head = heads;
  a.n_head_kv = heads;
  a.head_dim = D;
  a.scale = 0.35f;
  auto ob = be_->alloc(DType::F32, q.size());
  be_->attention(0, *qb, *ob, a);
  const auto got = get(*ob, q.size());
  for (int t = 0; t < n; ++t)
    for (int h = 0; h < heads; ++h) {
      const size_t o = (static_cast<size_t>(t) * heads + h) * D;
      if (t == n - 1) {
        EXPECT_TRUE(std::isnan(got[o])) << "the last token attends to its own value";
        continue;
      }
      std::vector<double> sc(t + 1);
      double mx = -1e300, l = 0;
      for (int j = 0; j <= t; ++j) {
        double d = 0;
        for (int e = 0; e < D; ++e) d += static_cast<double>(q[o + e]) * k[(j * heads + h) * D + e];
        mx = std::max(mx, sc[j] = d * a.scale);
      }
      for (double& x : sc) l += (x = std::exp(x - mx));
      for (int e = 0; e < D; ++e) {
        double want = 0;
        for (int j = 0; j <= t; ++j) want += sc[j] / l * v[(j * heads + h) * D + e];
        EXPECT_NEAR(got[o + e], want, 1e-5) << "token " << t << " head " << h << " dim " << e;
      }
    }
}

// ---------------------------------------------------------------- elementwise

TEST_P(BackendOps, RmsNormWithAndWithoutWeightInPlace) {
  const int rows = 37, dim = 640;
  const auto x = randn(rows * dim, 1, 30.0f);
  const auto wv = randn(dim, 2);
  auto w = upload_weight("w", DType::F32, {dim}, wv.data());
  for (bool weighted : {true, false})
    for (bool in_place : {false, true}) {
      auto xb = put(x);
      auto yb = in_place ? BufferPtr{} : zeros_like(x.size());
      Buffer& y = in_place ? *xb : *yb;
      be_->rms_norm(*xb, weighted ? w.get() : nullptr, rows, dim, 1e-6f, y);
      const auto got = get(y, x.size());
      std::vector<double> ref(x.size());
      for (int r = 0; r < rows; ++r) {
        double ss = 0;
        for (int i = 0; i < dim; ++i) ss += static_cast<double>(x[r * dim + i]) * x[r * dim + i];
        const double inv = 1.0 / std::sqrt(ss / dim + 1e-6);
        for (int i = 0; i < dim; ++i) ref[r * dim + i] = x[r * dim + i] * inv * (weighted ? wv[i] : 1.0);
      }
      EXPECT_LT(rel_l2(got, ref), 1e-6) << "weighted " << weighted << " in place " << in_place;
    }
}

// LayerNorm (BERT): mean and population variance per row, then weight and
// bias, each optional; rows with a large mean next to their spread.
TEST_P(BackendOps, LayerNormWithWeightAndBias) {
  if (!be_->supports_op(op_query(PGLB_OP_LAYER_NORM))) GTEST_SKIP() << "no layer_norm op";
  const int rows = 29, dim = 384;
  auto x = randn(rows * dim, 11, 3.0f);
  for (int r = 0; r < rows; ++r)
    for (int i = 0; i < dim; ++i) x[r * dim + i] += static_cast<float>(r) - 10.0f;
  const auto wv = randn(dim, 12), bv = randn(dim, 13);
  auto w = upload_weight("norm.weight", DType::F32, {dim}, wv.data());
  auto b = upload_weight("norm.bias", DType::F32, {dim}, bv.data());
  for (bool affine : {true, false})
    for (bool in_place : {false, true}) {
      auto xb = put(x);
      auto yb = in_place ? BufferPtr{} : zeros_like(x.size());
      Buffer& y = in_place ? *xb : *yb;
      be_->layer_norm(*xb, affine ? w.get() : nullptr, affine ? b.get() : nullptr, rows, dim, 1e-12f, y);
      const auto got = get(y, x.size());
      std::vector<double> ref(x.size());
      for (int r = 0; r < rows; ++r) {
        double mean = 0, var = 0;
        for (int i = 0; i < dim; ++i) mean += x[r * dim + i];
        mean /= dim;
        for (int i = 0; i < dim; ++i) var += (x[r * dim + i] - mean) * (x[r * dim + i] - mean);
        const double inv = 1.0 / std::sqrt(var / dim + 1e-12);
        for (int i = 0; i < dim; ++i)
          ref[r * dim + i] = (x[r * dim + i] - mean) * inv * (affine ? wv[i] : 1.0) + (affine ? bv[i] : 0.0);
      }
      EXPECT_LT(rel_l2(got, ref), 1e-6) << "affine " << affine << " in place " << in_place;
    }
}

// The plain activation op: transformers' erf GELU ("gelu", BERT), the tanh
// GELU, SiLU and the sigmoid, in place and not.
TEST_P(BackendOps, ActivationMatchesFormulas) {
  if (!be_->supports_op(op_query(PGLB_OP_ACTIVATION))) GTEST_SKIP() << "no activation op";
  const int n = 1003;
  const auto x = randn(n, 21, 4.0f);
  for (Activation act : {Activation::GeluErf, Activation::GeluTanh, Activation::Silu, Activation::Sigmoid})
    for (bool in_place : {false, true}) {
      auto xb = put(x);
      auto ob = in_place ? BufferPtr{} : zeros_like(x.size());
      Buffer& out = in_place ? *xb : *ob;
      be_->activation(*xb, n, act, out);
      const auto got = get(out, x.size());
      std::vector<double> ref(x.size());
      for (int i = 0; i < n; ++i) {
        const double v = x[i];
        switch (act) {
          case Activation::GeluErf: ref[i] = 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); break;
          case Activation::GeluTanh:
            ref[i] = 0.5 * v * (1 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
            break;
          case Activation::Silu: ref[i] = v / (1 + std::exp(-v)); break;
          default: ref[i] = 1 / (1 + std::exp(-v)); break;
        }
      }
      EXPECT_LT(rel_l2(got, ref), 1e-6) << static_cast<int>(act) << " in place " << in_place;
    }
}

// RoPE, both pair layouts, partial rotary dimension, frequency factors.
TEST_P(BackendOps, RopeBothPairingsAndFrequencyFactors) {
  const int n = 9, heads = 3, hd = 64, n_rot = 48;
  std::vector<float> factors(n_rot / 2);
  for (int i = 0; i < n_rot / 2; ++i) factors[i] = 1.0f + 0.37f * static_cast<float>(i % 5);
  auto fw = upload_weight("rope_freqs.weight", DType::F32, {n_rot / 2}, factors.data());
  BatchInfo b;
  for (int t = 0; t < n; ++t) {
    b.token_ids.push_back(0);
    b.positions.push_back(t * 37 + 5);
    b.slot_mapping.push_back(0);
  }
  for (bool neox : {false, true})
    for (bool with_factors : {false, true}) {
      be_->set_batch(b);
      const auto orig = randn(n * heads * hd, 3);
      auto xb = put(orig);
      RopeConfig rc;
      rc.n_rot = n_rot;
      rc.freq_base = 10000.0f;
      rc.freq_scale = 0.5f;
      rc.neox = neox;
      rc.freq_factors = with_factors ? fw.get() : nullptr;
      be_->rope(*xb, heads, hd, rc);
      const auto xr = get(*xb, orig.size());
      std::vector<double> rr(orig.begin(), orig.end());
      for (int t = 0; t < n; ++t)
        for (int h = 0; h < heads; ++h)
          for (int i = 0; i < n_rot / 2; ++i) {
            double th = b.positions[t] * 0.5 * std::pow(10000.0, -2.0 * i / n_rot);
            if (with_factors) th /= factors[i];
            const int a = neox ? i : 2 * i, c2 = neox ? i + n_rot / 2 : 2 * i + 1;
            const int64_t o = (t * heads + h) * hd;
            rr[o + a] = orig[o + a] * std::cos(th) - orig[o + c2] * std::sin(th);
            rr[o + c2] = orig[o + a] * std::sin(th) + orig[o + c2] * std::cos(th);
          }
      EXPECT_LT(rel_l2(xr, rr), 1e-6) << "neox " << neox << " factors " << with_factors;
    }
}

// store_kv with RoPE fused: the cache holds the rotated k, the same as rope
// then store; k itself is rotated in place. Attention with the same q over
// both layers must then agree exactly.
// YaRN as transformers computes it (_compute_yarn_parameters): inverse
// frequencies blended between interpolated and original by a linear ramp over
// the correction range, cos / sin times 0.1 ln(factor) + 1.
// truncate false (gpt-oss) keeps the ramp's ends fractional.
std::vector<double> yarn_reference_inv_freq(double base, int n_rot, double factor, double beta_fast, double beta_slow,
                                            int orig_ctx, bool truncate = true) {
  auto correction_dim = [&](double rotations) {
    return (n_rot * std::log(orig_ctx / (rotations * 2 * M_PI))) / (2 * std::log(base));
  };
  double low = correction_dim(beta_fast), high = correction_dim(beta_slow);
  if (truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(0.0, low);
  high = std::min(n_rot - 1.0, high);
  std::vector<double> inv(n_rot / 2);
  for (int i = 0; i < n_rot / 2; ++i) {
    const double pos_freq = std::pow(base, 2.0 * i / n_rot);
    const double extrapolation = 1.0 / pos_freq, interpolation = 1.0 / (factor * pos_freq);
    const double ramp = std::clamp((i - low) / (high - low == 0 ? 0.001 : high - low), 0.0, 1.0);
    const double extrapolation_factor = 1 - ramp;
    inv[i] = interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor;
  }
  return inv;
}

TEST_P(BackendOps, RopeYarnMatchesTransformersFormula) {
  const int n = 7, heads = 2, hd = 128, n_rot = 128;
  const double factor = 4.0, base = 1000000.0;
  BatchInfo b;
  for (int t = 0; t < n; ++t) {
    b.token_ids.push_back(0);
    b.positions.push_back(t * 5111 + 3);  // far past the original context
    b.slot_mapping.push_back(0);
  }
  be_->set_batch(b);
  const auto orig = randn(n * heads * hd, 4);
  for (bool truncate : {true, false}) {
  auto xb = put(orig);
  RopeConfig rc;
  rc.n_rot = n_rot;
  rc.freq_base = static_cast<float>(base);
  rc.freq_scale = static_cast<float>(1 / factor);
  rc.neox = true;
  rc.ext_factor = 1.0f;
  rc.n_ctx_orig = 32768;
  rc.yarn_truncate = truncate;
  rc.attn_factor = truncate ? 1.0f : 0.75f;  // a stated attention factor multiplies YaRN's own
  be_->rope(*xb, heads, hd, rc);
  const auto inv = yarn_reference_inv_freq(base, n_rot, factor, 32, 1, 32768, truncate);
  const double mscale = (0.1 * std::log(factor) + 1) * rc.attn_factor;
  std::vector<double> rr(orig.begin(), orig.end());
  for (int t = 0; t < n; ++t)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < n_rot / 2; ++i) {
        const double th = b.positions[t] * inv[i];
        const int64_t o = (t * heads + h) * hd;
        const double x0 = orig[o + i], x1 = orig[o + i + n_rot / 2];
        rr[o + i] = (x0 * std::cos(th) - x1 * std::sin(th)) * mscale;
        rr[o + i + n_rot / 2] = (x0 * std::sin(th) + x1 * std::cos(th)) * mscale;
      }
  EXPECT_LT(rel_l2(get(*xb, orig.size()), rr), 1e-6) << "truncate " << truncate;
  }
}

TEST_P(BackendOps, StoreKvWithFusedRopeEqualsRopeThenStore) {
  const int n = 5, kvh = 2, hd = 64;
  be_->allocate_kv_cache(cache_spec(2, kvh, hd, 2));
  const BatchInfo b = one_sequence(n, {1}, 16);  // the backend may keep a pointer to it
  be_->set_batch(b);
  RopeConfig rc;
  rc.n_rot = hd;
  rc.freq_base = 10000.0f;
  rc.neox = true;
  const auto k = randn(n * kvh * hd, 7), v = randn(n * kvh * hd, 8);
  auto k1 = put(k), k2 = put(k), vb = put(v);
  be_->store_kv(0, *k1, *vb, &rc);
  be_->rope(*k2, kvh, hd, rc);
  be_->store_kv(1, *k2, *vb);
  EXPECT_EQ(get(*k1, k.size()), get(*k2, k.size())) << "k is rotated in place too";
  const auto q = randn(n * kvh * hd, 9);
  auto qb = put(q);
  auto o1 = zeros_like(q.size()), o2 = zeros_like(q.size());
  AttentionConfig ac;
  ac.n_head = kvh;
  ac.n_head_kv = kvh;
  ac.head_dim = hd;
  ac.scale = 0.125f;
  be_->attention(0, *qb, *o1, ac);
  be_->attention(1, *qb, *o2, ac);
  EXPECT_EQ(get(*o1, q.size()), get(*o2, q.size()));
}

TEST_P(BackendOps, GluAddBiasAndGather) {
  const int n = 10000;
  const auto g = randn(n, 4, 3.0f), u = randn(n, 5);
  for (Activation act : {Activation::Silu, Activation::GeluTanh, Activation::SwigluOai, Activation::Sigmoid})
    for (bool in_place : {false, true}) {
      std::vector<float> up = u;
      if (act == Activation::SwigluOai)
        for (auto& x : up) x *= 4;  // past the clamp at 7 now and then
      auto gb = put(g), ub = put(up);
      auto ob = in_place ? BufferPtr{} : zeros_like(n);
      Buffer& o = in_place ? *gb : *ob;
      be_->glu(*gb, *ub, n, act, o);
      const auto got = get(o, n);
      std::vector<double> r(n);
      for (int i = 0; i < n; ++i) {
        const double a = g[i];
        if (act == Activation::SwigluOai) {  // g = 3 sigma: both clamps are hit
          const double c = std::min(a, 7.0), up = std::clamp(static_cast<double>(u[i]) * 4, -7.0, 7.0);
          r[i] = c / (1 + std::exp(-1.702 * c)) * (up + 1);
          continue;
        }
        const double f = act == Activation::Silu      ? a / (1 + std::exp(-a))
                         : act == Activation::Sigmoid ? 1 / (1 + std::exp(-a))
                                                      : 0.5 * a * (1 + std::tanh(0.7978845608028654 * (a + 0.044715 * a * a * a)));
        r[i] = f * u[i];
      }
      EXPECT_LT(rel_l2(got, r), 1e-6) << "act " << static_cast<int>(act) << " in place " << in_place;
    }

  // add: y += x
  {
    auto yb = put(g), xb = put(u);
    be_->add(*yb, *xb, n);
    const auto got = get(*yb, n);
    std::vector<double> r(n);
    for (int i = 0; i < n; ++i) r[i] = static_cast<double>(g[i]) + u[i];
    EXPECT_LT(rel_l2(got, r), 1e-7);
  }
  // add_bias over rows
  {
    const int rows = 7, cols = 384;
    const auto y0 = randn(rows * cols, 31), bias = randn(cols, 32);
    auto bw = upload_weight("b", DType::F32, {cols}, bias.data());
    auto yb = put(y0);
    be_->add_bias(*yb, *bw, rows);
    const auto got = get(*yb, y0.size());
    std::vector<double> r(y0.size());
    for (int i = 0; i < rows; ++i)
      for (int c = 0; c < cols; ++c) r[i * cols + c] = static_cast<double>(y0[i * cols + c]) + bias[c];
    EXPECT_LT(rel_l2(got, r), 1e-7);
  }
  // gather_rows, repeats and any order
  {
    const int rows = 11, dim = 320;
    const auto x = randn(rows * dim, 33);
    const std::vector<int32_t> pick = {10, 0, 3, 3, 7};
    auto xb = put(x);
    auto ob = zeros_like(pick.size() * dim);
    be_->gather_rows(*xb, dim, pick, *ob);
    const auto got = get(*ob, pick.size() * dim);
    for (size_t i = 0; i < pick.size(); ++i)
      for (int c = 0; c < dim; ++c) ASSERT_EQ(got[i * dim + c], x[pick[i] * dim + c]) << i;
  }
}

// ---------------------------------------------------------------- memory, copies, KV blocks

TEST_P(BackendOps, CopiesAtOffsetsAndMemoryInfo) {
  const auto x = randn(1000, 41);
  auto b = be_->alloc(DType::F32, 1000);
  EXPECT_EQ(b->size(), 1000u);
  EXPECT_EQ(b->bytes(), 4000u);
  be_->copy_from_host(x.data(), *b, 0, 4000);
  std::vector<float> part(100);
  be_->copy_to_host(*b, 400 * sizeof(float), 100 * sizeof(float), part.data());
  be_->synchronize();
  EXPECT_TRUE(std::equal(part.begin(), part.end(), x.begin() + 400));
  EXPECT_THROW(be_->copy_to_host(*b, 3999, 2, part.data()), Error);

  const MemoryInfo m = be_->memory_info();
  EXPECT_GT(m.total_bytes, 0u);
  EXPECT_LE(m.free_bytes, m.total_bytes);
}

// Reads every block of every layer back through attention is costly; instead
// each block is written with a distinct value and read back by attention of
// a one-token query that sees only that block (one key): out == v of the key.
std::vector<float> read_v_of_slot(BackendOps& t, Backend& be, int layer, int32_t block, int kvh, int hd,
                                  int block_size) {
  const BatchInfo b = one_sequence(1, {block}, block_size);
  be.set_batch(b);
  auto q = t.put(std::vector<float>(static_cast<size_t>(kvh * hd), 0.5f));
  auto o = t.zeros_like(static_cast<size_t>(kvh * hd));
  AttentionConfig ac;
  ac.n_head = kvh;
  ac.n_head_kv = kvh;
  ac.head_dim = hd;
  ac.scale = 1.0f;
  be.attention(layer, *q, *o, ac);
  return t.get(*o, static_cast<size_t>(kvh * hd));
}

void write_slot0(BackendOps& t, Backend& be, int layer, int32_t block, const std::vector<float>& kv, int block_size) {
  const BatchInfo b = one_sequence(1, {block}, block_size);
  be.set_batch(b);
  auto kb = t.put(kv), vb = t.put(kv);
  be.store_kv(layer, *kb, *vb);
  be.synchronize();
}

TEST_P(BackendOps, CopyBlocksAndSwapRoundTrip) {
  const int kvh = 2, hd = 64, bs = 16;
  be_->allocate_kv_cache(cache_spec(2, kvh, hd, 6));
  EXPECT_EQ(be_->kv_cache_spec().num_blocks, 6);
  const auto a = randn(kvh * hd, 51), c = randn(kvh * hd, 52);
  for (int l = 0; l < 2; ++l) {
    write_slot0(*this, *be_, l, 1, a, bs);
    write_slot0(*this, *be_, l, 2, c, bs);
  }
  be_->copy_blocks({{1, 3}, {2, 4}});
  for (int l = 0; l < 2; ++l) {
    EXPECT_EQ(read_v_of_slot(*this, *be_, l, 3, kvh, hd, bs), a) << "layer " << l;
    EXPECT_EQ(read_v_of_slot(*this, *be_, l, 4, kvh, hd, bs), c) << "layer " << l;
  }
  if (!be_->supports(Feature::SwapToHost)) {
    EXPECT_THROW(be_->allocate_swap_space(4), Error);
    return;
  }
  be_->allocate_swap_space(3);
  be_->swap_out({{1, 0}, {2, 2}});
  for (int l = 0; l < 2; ++l) write_slot0(*this, *be_, l, 1, c, bs);  // overwrite the device copy
  be_->swap_in({{0, 5}, {2, 1}});
  for (int l = 0; l < 2; ++l) {
    EXPECT_EQ(read_v_of_slot(*this, *be_, l, 5, kvh, hd, bs), a) << "layer " << l;
    EXPECT_EQ(read_v_of_slot(*this, *be_, l, 1, kvh, hd, bs), c) << "layer " << l;
  }
}

// ---------------------------------------------------------------- mixture of experts

// The plain definition: scores, the k best by (score desc, id asc), renormalised, scaled.
void reference_route(const std::vector<float>& logits, int64_t n, const MoeRouting& r, std::vector<int32_t>& ids,
                     std::vector<double>& w) {
  ids.assign(static_cast<size_t>(n * r.k), -1);
  w.assign(static_cast<size_t>(n * r.k), 0);
  for (int64_t t = 0; t < n; ++t) {
    std::vector<double> p(r.n_expert);
    const float* l = logits.data() + t * r.n_expert;
    for (int e = 0; e < r.n_expert; ++e)
      p[e] = r.scoring == RouterScoring::Sigmoid ? 1 / (1 + std::exp(-double(l[e]))) : std::exp(double(l[e]));
    if (r.scoring == RouterScoring::Softmax) {
      double s = 0;
      for (double v : p) s += v;
      for (double& v : p) v /= s;
    }
    std::vector<int> order(r.n_expert);
    for (int e = 0; e < r.n_expert; ++e) order[e] = e;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
    double sum = 0;
    for (int j = 0; j < r.k; ++j) sum += p[order[j]];
    for (int j = 0; j < r.k; ++j) {
      ids[t * r.k + j] = order[j];
      w[t * r.k + j] = p[order[j]] / (r.normalize ? sum : 1.0) * r.scale;
    }
  }
}

TEST_P(BackendOps, MoeRouteTopKMatchesReference) {
  if (!be_->supports(Feature::MixtureOfExperts)) {
    auto b = put(randn(8, 1));
    EXPECT_THROW(be_->moe_route(*b, 1, MoeRouting{8, 2}, *b, *b), Error);
    return;
  }
  const int64_t n = 37;
  for (const MoeRouting r : {MoeRouting{8, 2, RouterScoring::Softmax, true, 1.0f},
                             MoeRouting{64, 8, RouterScoring::Softmax, false, 1.0f},
                             MoeRouting{16, 4, RouterScoring::Sigmoid, true, 2.5f}}) {
    SCOPED_TRACE(r.n_expert);
    auto logits = randn(static_cast<size_t>(n * r.n_expert), 3 + r.n_expert, 2.0f);
    logits[5] = logits[6];  // a tie: the lower id must win
    auto lb = put(logits);
    auto ids_b = be_->alloc(DType::I32, static_cast<size_t>(n * r.k));
    auto wb = zeros_like(static_cast<size_t>(n * r.k));
    be_->moe_route(*lb, n, r, *ids_b, *wb);
    std::vector<int32_t> ids(static_cast<size_t>(n * r.k));
    be_->copy_to_host(*ids_b, 0, ids.size() * sizeof(int32_t), ids.data());
    be_->synchronize();
    std::vector<int32_t> ref_ids;
    std::vector<double> ref_w;
    reference_route(logits, n, r, ref_ids, ref_w);
    EXPECT_EQ(ids, ref_ids);
    EXPECT_LT(rel_l2(get(*wb, ref_w.size()), ref_w), 1e-6);
  }
}

// DeepSeek's group-limited routing, written out plainly: choice scores
// (score + bias), groups ranked by their two best (V3) or best (V2) choice
// scores, the k best choices among the topk_group best groups, weighted by
// their unbiased scores.
void reference_group_route(const std::vector<float>& logits, const std::vector<float>& bias, int64_t n,
                           const MoeRouting& r, std::vector<int32_t>& ids, std::vector<double>& w) {
  ids.assign(static_cast<size_t>(n * r.k), -1);
  w.assign(static_cast<size_t>(n * r.k), 0);
  const int per = r.n_expert / r.n_group;
  for (int64_t t = 0; t < n; ++t) {
    std::vector<double> p(r.n_expert), choice(r.n_expert);
    const float* l = logits.data() + t * r.n_expert;
    double total = 0;
    for (int e = 0; e < r.n_expert; ++e) {
      p[e] = r.scoring == RouterScoring::Sigmoid ? 1 / (1 + std::exp(-double(l[e]))) : std::exp(double(l[e]));
      total += p[e];
    }
    for (int e = 0; e < r.n_expert; ++e) {
      if (r.scoring == RouterScoring::Softmax) p[e] /= total;
      choice[e] = p[e] + (bias.empty() ? 0.0 : bias[e]);
    }
    std::vector<double> group(r.n_group);
    for (int g = 0; g < r.n_group; ++g) {
      std::vector<double> in(choice.begin() + g * per, choice.begin() + (g + 1) * per);
      std::sort(in.rbegin(), in.rend());
      group[g] = r.group_score == GroupScore::Max ? in[0] : in[0] + in[1];
    }
    std::vector<int> gorder(r.n_group);
    for (int g = 0; g < r.n_group; ++g) gorder[g] = g;
    std::stable_sort(gorder.begin(), gorder.end(), [&](int a, int b) { return group[a] > group[b]; });
    std::vector<int> order;
    for (int e = 0; e < r.n_expert; ++e)
      if (std::find(gorder.begin(), gorder.begin() + r.topk_group, e / per) != gorder.begin() + r.topk_group)
        order.push_back(e);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return choice[a] > choice[b]; });
    double sum = 0;
    for (int j = 0; j < r.k; ++j) sum += p[order[j]];
    for (int j = 0; j < r.k; ++j) {
      ids[t * r.k + j] = order[j];
      w[t * r.k + j] = p[order[j]] / (r.normalize ? sum : 1.0) * r.scale;
    }
  }
}

TEST_P(BackendOps, MoeRouteGroupLimitedMatchesReference) {
  if (!be_->supports(Feature::MixtureOfExperts)) return;  // refusal checked by the routing test
  const int64_t n = 29;
  const int n_expert = 32;
  // A bias of the scores' size, so that it changes which experts win.
  const std::vector<float> bias_values = randn(n_expert, 71, 0.3f);
  auto bias = upload_weight("exp_probs_b", DType::F32, {n_expert}, bias_values.data());
  struct Case {
    MoeRouting r;
    bool with_bias;
  };
  std::vector<Case> cases;
  MoeRouting v3{n_expert, 6, RouterScoring::Sigmoid, true, 2.5f};  // DeepSeek V3: 8 groups, 3 compete
  v3.n_group = 8, v3.topk_group = 3;
  cases.push_back({v3, true});
  MoeRouting v3_no_norm = v3;
  v3_no_norm.normalize = false, v3_no_norm.n_group = 4, v3_no_norm.topk_group = 2;
  cases.push_back({v3_no_norm, true});
  MoeRouting biased_only{n_expert, 4, RouterScoring::Sigmoid, true, 1.0f};  // a bias, no groups
  cases.push_back({biased_only, true});
  MoeRouting v2{n_expert, 6, RouterScoring::Softmax, false, 16.0f};  // DeepSeek V2: group_limited_greedy
  v2.n_group = 8, v2.topk_group = 3, v2.group_score = GroupScore::Max;
  cases.push_back({v2, false});
  for (size_t c = 0; c < cases.size(); ++c) {
    SCOPED_TRACE(c);
    MoeRouting r = cases[c].r;
    r.choice_bias = cases[c].with_bias ? bias.get() : nullptr;
    const auto logits = randn(static_cast<size_t>(n * r.n_expert), 5 + c, 2.0f);
    auto lb = put(logits);
    auto ids_b = be_->alloc(DType::I32, static_cast<size_t>(n * r.k));
    auto wb = zeros_like(static_cast<size_t>(n * r.k));
    be_->moe_route(*lb, n, r, *ids_b, *wb);
    std::vector<int32_t> ids(static_cast<size_t>(n * r.k));
    be_->copy_to_host(*ids_b, 0, ids.size() * sizeof(int32_t), ids.data());
    be_->synchronize();
    std::vector<int32_t> ref_ids;
    std::vector<double> ref_w;
    reference_group_route(logits, cases[c].with_bias ? bias_values : std::vector<float>{}, n, r, ref_ids, ref_w);
    EXPECT_EQ(ids, ref_ids);
    EXPECT_LT(rel_l2(get(*wb, ref_w.size()), ref_w), 1e-6);
  }
  MoeRouting bad{n_expert, 4, RouterScoring::Sigmoid, true, 1.0f};
  bad.n_group = 5, bad.topk_group = 2;  // 32 experts are no 5 equal groups
  auto lb = put(randn(static_cast<size_t>(n_expert), 3, 1.0f));
  auto ids_b = be_->alloc(DType::I32, 4);
  auto wb = zeros_like(4);
  EXPECT_THROW(be_->moe_route(*lb, 1, bad, *ids_b, *wb), Error);
}

TEST_P(BackendOps, MatmulExpertsMatchesPerSlotProducts) {
  if (!be_->supports(Feature::MixtureOfExperts)) return;  // refusal checked by the routing test
  const int n_expert = 6, k = 2;
  const int64_t rows = 40, cols = 256;
  for (DType t : {DType::F32, DType::Q8_0, DType::Q4_K}) {
    // One stacked tensor, as a GGUF file holds experts; the CPU borrows its bytes.
    const auto q = quantize_rows(t, randn(static_cast<size_t>(n_expert * rows * cols), 100 + n_expert, 0.5f),
                                 n_expert * rows, cols);
    const TensorData stack{"exps", t, {cols, rows, n_expert}, q.data()};
    std::vector<std::vector<float>> wref(n_expert);
    std::vector<std::unique_ptr<Weight>> owned;
    std::vector<const Weight*> experts;
    for (int e = 0; e < n_expert; ++e) {
      const TensorData slice = expert_slice(stack, e);
      owned.push_back(be_->upload(slice));
      experts.push_back(owned.back().get());
      const auto* bytes = static_cast<const uint8_t*>(slice.data);
      wref[e] = dequantize_rows(t, std::vector<uint8_t>(bytes, bytes + dtype_row_bytes(t, cols) * rows), rows, cols);
    }
    // Per-expert biases (gpt-oss), one stacked [rows, n_expert] tensor sliced as the loader slices it.
    const auto bias_values = randn(static_cast<size_t>(n_expert * rows), 77);
    const TensorData bias_stack{"exps.bias", DType::F32, {rows, n_expert}, bias_values.data()};
    std::vector<const Weight*> biases;
    for (int e = 0; e < n_expert; ++e) {
      owned.push_back(be_->upload(expert_slice(bias_stack, e)));
      biases.push_back(owned.back().get());
    }
    for (int64_t n : {1, 7, 33}) {
      for (bool per_slot : {false, true}) {
        const bool with_bias = n == 7;
        SCOPED_TRACE(testing::Message() << dtype_name(t) << " n " << n << " per_slot " << per_slot);
        // Expert 5 is never routed: only routed experts may be read.
        std::vector<int32_t> ids(static_cast<size_t>(n * k));
        for (int64_t s = 0; s < n * k; ++s) ids[s] = static_cast<int32_t>((s * 7 + s / 3) % (n_expert - 1));
        auto ids_b = be_->alloc(DType::I32, ids.size());
        be_->copy_from_host(ids.data(), *ids_b, 0, ids.size() * sizeof(int32_t));
        const int64_t x_rows = per_slot ? n * k : n;
        const auto x = randn(static_cast<size_t>(x_rows * cols), 50 + static_cast<uint32_t>(n));
        auto xb = put(x);
        auto yb = zeros_like(static_cast<size_t>(n * k * rows));
        be_->matmul_experts(experts, *xb, n, k, per_slot, *ids_b, *yb, with_bias ? biases : std::vector<const Weight*>{});
        const auto y = get(*yb, static_cast<size_t>(n * k * rows));
        std::vector<double> ref(y.size());
        for (int64_t s = 0; s < n * k; ++s) {
          const float* xr = x.data() + (per_slot ? s : s / k) * cols;
          for (int64_t r = 0; r < rows; ++r) {
            double acc = with_bias ? bias_values[ids[s] * rows + r] : 0.0;
            for (int64_t c = 0; c < cols; ++c) acc += double(xr[c]) * wref[ids[s]][r * cols + c];
            ref[s * rows + r] = acc;
          }
        }
        EXPECT_LT(rel_l2(y, ref), t == DType::F32 ? 1e-5 : 2e-2);
      }
    }
  }
}

// LoRA: rows of several slots and of slot 0 (nothing added) in one call,
// against double-precision products of the same (rounded) values; y keeps
// what it held. Backends without the op run the default (grouped products).
TEST_P(BackendOps, LoraMatmulAddsEachRowsAdapter) {
  if (!be_->supports(Feature::MixtureOfExperts)) return;
  const int n_slots = 4;
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    if (!be_->supports_weight(t)) continue;
    for (const auto [rank, in, out] : {std::tuple<int64_t, int64_t, int64_t>{16, 256, 96}, {8, 64, 320}}) {
      std::vector<std::vector<float>> aref(n_slots), bref(n_slots);
      std::vector<std::vector<uint8_t>> bytes;
      std::vector<std::unique_ptr<Weight>> owned;
      std::vector<const Weight*> a, b;
      bytes.reserve(2 * n_slots);
      for (int s = 0; s < n_slots; ++s) {
        const float scale = s == 0 ? 0.0f : 0.3f;  // slot 0 is the base model's: zeros, as the model uploads it
        auto av = randn(static_cast<size_t>(rank * in), 300 + s, scale), bv = randn(static_cast<size_t>(out * rank), 400 + s, scale);
        bytes.push_back(quantize_rows(t, av, rank, in));
        aref[s] = dequantize_rows(t, bytes.back(), rank, in);
        owned.push_back(be_->upload(TensorData{"a", t, {in, rank}, bytes.back().data()}));
        a.push_back(owned.back().get());
        bytes.push_back(quantize_rows(t, bv, out, rank));
        bref[s] = dequantize_rows(t, bytes.back(), out, rank);
        owned.push_back(be_->upload(TensorData{"b", t, {rank, out}, bytes.back().data()}));
        b.push_back(owned.back().get());
      }
      for (int64_t n : {1, 6, 19}) {
        SCOPED_TRACE(testing::Message() << dtype_name(t) << " rank " << rank << " n " << n);
        std::vector<int32_t> slots(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) slots[i] = static_cast<int32_t>((i * 5 + i / 4) % n_slots);  // slot 3 often, 0 too
        auto slots_b = be_->alloc(DType::I32, slots.size());
        be_->copy_from_host(slots.data(), *slots_b, 0, slots.size() * sizeof(int32_t));
        const auto x = randn(static_cast<size_t>(n * in), 60 + static_cast<uint32_t>(n));
        const auto y0 = randn(static_cast<size_t>(n * out), 70 + static_cast<uint32_t>(n));
        auto xb = put(x), yb = put(y0);
        auto tb = zeros_like(static_cast<size_t>(n * rank)), db = zeros_like(static_cast<size_t>(n * out));
        be_->lora_matmul(a, b, *xb, n, *slots_b, *yb, tb.get(), db.get());
        const auto y = get(*yb, static_cast<size_t>(n * out));
        std::vector<double> ref(y.size());
        for (int64_t i = 0; i < n; ++i) {
          const int s = slots[i];
          std::vector<double> tv(static_cast<size_t>(rank), 0.0);
          for (int64_t k = 0; k < rank; ++k)
            for (int64_t c = 0; c < in; ++c) tv[k] += double(aref[s][k * in + c]) * x[i * in + c];
          for (int64_t o = 0; o < out; ++o) {
            double acc = y0[i * out + o];
            for (int64_t k = 0; k < rank; ++k) acc += double(bref[s][o * rank + k]) * tv[k];
            ref[i * out + o] = acc;
          }
        }
        EXPECT_LT(rel_l2(y, ref), 1e-5);
      }
    }
  }
}

TEST_P(BackendOps, MoeCombineAndSigmoidRowScale) {
  if (!be_->supports(Feature::MixtureOfExperts)) return;
  const int64_t n = 5, dim = 24;
  const int k = 3;
  const auto y = randn(static_cast<size_t>(n * k * dim), 7), w = randn(static_cast<size_t>(n * k), 8);
  auto yb = put(y), wb = put(w), out = zeros_like(static_cast<size_t>(n * dim));
  be_->moe_combine(*yb, *wb, n, k, dim, *out);
  std::vector<double> ref(static_cast<size_t>(n * dim), 0.0);
  for (int64_t t = 0; t < n; ++t)
    for (int j = 0; j < k; ++j)
      for (int64_t c = 0; c < dim; ++c) ref[t * dim + c] += double(w[t * k + j]) * y[(t * k + j) * dim + c];
  EXPECT_LT(rel_l2(get(*out, ref.size()), ref), 1e-6);

  const auto s = randn(static_cast<size_t>(n), 9);
  auto sb = put(s);
  be_->scale_rows_sigmoid(*out, *sb, n, dim);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t c = 0; c < dim; ++c) ref[t * dim + c] *= 1 / (1 + std::exp(-double(s[t])));
  EXPECT_LT(rel_l2(get(*out, ref.size()), ref), 1e-6);
}

// ---------------------------------------------------------------- linear attention

// Gated DeltaNet's plain definition in double: every sequence's whole history.
struct GdnRef {
  GatedDeltaConfig cfg;
  int K = 4;
  std::vector<float> conv_w, conv_b, ssm_a, dt_bias;

  // silu(bias + causal conv) of rows x[t][dim], zeros before the first row.
  std::vector<double> conv(const std::vector<float>& x, int64_t dim) const {
    const int64_t n = static_cast<int64_t>(x.size()) / dim;
    std::vector<double> out(x.size());
    for (int64_t t = 0; t < n; ++t)
      for (int64_t c = 0; c < dim; ++c) {
        double acc = conv_b[c];
        for (int j = 0; j < K; ++j) {
          const int64_t i = t - K + 1 + j;
          if (i >= 0) acc += double(conv_w[c * K + j]) * x[i * dim + c];
        }
        out[t * dim + c] = acc / (1 + std::exp(-acc));
      }
    return out;
  }

  std::vector<double> delta_rule(const std::vector<float>& qkv, const std::vector<float>& a,
                                 const std::vector<float>& b) const {
    const int H = cfg.n_v_heads, dk = cfg.head_k_dim, dv = cfg.head_v_dim, r = H / cfg.n_k_heads;
    auto key_head = [&](int h) { return cfg.v_heads_tiled ? h % cfg.n_k_heads : h / r; };
    const int64_t stride = cfg.qkv_dim(), n = static_cast<int64_t>(qkv.size()) / stride;
    std::vector<double> out(static_cast<size_t>(n * H * dv));
    for (int h = 0; h < H; ++h) {
      std::vector<double> S(static_cast<size_t>(dk * dv), 0.0);
      for (int64_t t = 0; t < n; ++t) {
        const float* row = qkv.data() + t * stride;
        auto normed = [&](const float* x, double scale) {
          double ss = 0;
          for (int i = 0; i < dk; ++i) ss += double(x[i]) * x[i];
          std::vector<double> y(dk);
          for (int i = 0; i < dk; ++i) y[i] = x[i] / std::sqrt(ss + 1e-6) * scale;
          return y;
        };
        const auto q = normed(row + key_head(h) * dk, cfg.scale);
        const auto k = normed(row + (cfg.n_k_heads + key_head(h)) * dk, 1.0);
        const float* v = row + 2 * cfg.n_k_heads * dk + h * dv;
        const double x = double(a[t * H + h]) + dt_bias[h];
        const double g = double(ssm_a[h]) * (x > 20 ? x : std::log1p(std::exp(x)));
        const double beta = 1 / (1 + std::exp(-double(b[t * H + h])));
        for (double& s : S) s *= std::exp(g);
        for (int j = 0; j < dv; ++j) {
          double mem = 0;
          for (int i = 0; i < dk; ++i) mem += k[i] * S[i * dv + j];
          const double d = (v[j] - mem) * beta;
          for (int i = 0; i < dk; ++i) S[i * dv + j] += k[i] * d;
        }
        for (int j = 0; j < dv; ++j) {
          double o = 0;
          for (int i = 0; i < dk; ++i) o += q[i] * S[i * dv + j];
          out[(t * H + h) * dv + j] = o;
        }
      }
    }
    return out;
  }
};

// Three steps of a mixed batch: fresh prompts, a decode, a prompt continued in
// chunks, and a sequence forked (copy_states) from another: each step's
// output equals the definition run over the sequence's whole history. Value
// heads read their key head in transformers' grouped order and in the tiled
// order of llama.cpp's files.
TEST_P(BackendOps, GatedDeltaNetContinuesEachSequencesState) {
  if (!be_->supports(Feature::LinearAttention)) {
    EXPECT_FALSE(be_->supports_op(op_query(PGLB_OP_GATED_DELTA_RULE)));
    return;
  }
  for (const auto [nk, nv, dk, dv, tiled] :
       {std::array{2, 4, 16, 8, 0}, std::array{2, 4, 16, 8, 1}, std::array{1, 2, 128, 128, 0}}) {
    GdnRef ref;
    ref.cfg = {nk, nv, dk, dv, 1.0f / std::sqrt(float(dk)), tiled != 0};
    const int64_t dim = ref.cfg.qkv_dim();
    ref.conv_w = randn(static_cast<size_t>(dim * ref.K), 61, 0.5f);
    ref.conv_b = randn(static_cast<size_t>(dim), 62, 0.2f);
    ref.ssm_a = randn(static_cast<size_t>(nv), 63, 0.5f);
    for (float& v : ref.ssm_a) v = -std::exp(v);  // -exp(A_log)
    ref.dt_bias = randn(static_cast<size_t>(nv), 64, 0.5f);
    KVCacheSpec spec = cache_spec(1, 1, 8, 4);
    spec.layer_state = {-1, 0};  // layer 1 is the linear one
    spec.state = {1, 5, static_cast<int>(dim), ref.K, nv, dk, dv};
    be_->allocate_kv_cache(spec);
    auto wv = upload_weight("conv", DType::F32, {dim * ref.K}, ref.conv_w.data());
    auto bv = upload_weight("conv_b", DType::F32, {dim}, ref.conv_b.data());
    auto al = upload_weight("ssm_a", DType::F32, {nv}, ref.ssm_a.data());
    auto dt = upload_weight("dt_bias", DType::F32, {nv}, ref.dt_bias.data());

    // Per sequence (by state slot): its whole history of inputs.
    std::map<int, std::vector<float>> hx, hqkv, ha, hb;
    // Steps: (slot, q_len) per sequence; slot 3 forks from slot 1 before step
    // 3. The last step's long runs take the CPU's chunked form (64-token
    // chunks from 16 tokens on): several chunks and a partial one, exactly
    // one, and a short run beside them.
    const std::vector<std::vector<std::pair<int, int>>> steps = {
        {{0, 5}, {1, 3}}, {{0, 1}, {1, 4}, {2, 2}}, {{3, 2}, {1, 1}, {0, 1}, {4, 1}},
        {{0, 150}, {2, 64}, {1, 16}, {3, 3}}};
    uint32_t seed = 700;
    for (size_t si = 0; si < steps.size(); ++si) {
      if (si == 2) {
        be_->copy_states({{1, 3}});
        for (auto* h : {&hx, &hqkv, &ha, &hb}) (*h)[3] = (*h)[1];
      }
      BatchInfo batch;
      int32_t start = 0;
      for (const auto& [slot, len] : steps[si]) {
        SeqInfo q;
        q.q_start = start;
        q.q_len = len;
        q.ctx_len = static_cast<int32_t>(hx[slot].size() / dim) + len;
        q.state_slot = slot;
        q.block_table.assign(static_cast<size_t>((q.ctx_len + 15) / 16), 1);  // (no K/V is read)
        batch.seqs.push_back(q);
        start += len;
      }
      batch.token_ids.assign(static_cast<size_t>(start), 1);
      batch.positions.assign(static_cast<size_t>(start), 0);
      batch.slot_mapping.assign(static_cast<size_t>(start), 0);
      be_->set_batch(batch);
      const auto x = randn(static_cast<size_t>(start * dim), seed++);
      const auto qkv = randn(static_cast<size_t>(start * dim), seed++);
      const auto a = randn(static_cast<size_t>(start * nv), seed++);
      const auto b = randn(static_cast<size_t>(start * nv), seed++, 2.0f);
      auto xb = put(x), qb = put(qkv), ab = put(a), bb = put(b);
      auto conv_out = zeros_like(x.size()), out = zeros_like(static_cast<size_t>(start * nv * dv));
      be_->causal_conv1d(1, *xb, *wv, bv.get(), *conv_out);
      be_->gated_delta_rule(1, *qb, *ab, *bb, *al, *dt, ref.cfg, *out);
      const auto got_conv = get(*conv_out, x.size());
      const auto got = get(*out, static_cast<size_t>(start * nv * dv));
      for (const SeqInfo& q : batch.seqs) {
        const int slot = q.state_slot;
        auto append = [&](std::vector<float>& h, const std::vector<float>& v, int64_t w) {
          h.insert(h.end(), v.begin() + q.q_start * w, v.begin() + (q.q_start + q.q_len) * w);
        };
        append(hx[slot], x, dim);
        append(hqkv[slot], qkv, dim);
        append(ha[slot], a, nv);
        append(hb[slot], b, nv);
        const auto rc = ref.conv(hx[slot], dim);
        const auto rd = ref.delta_rule(hqkv[slot], ha[slot], hb[slot]);
        const int64_t first = q.ctx_len - q.q_len;
        const std::vector<double> want_c(rc.begin() + first * dim, rc.end());
        const std::vector<double> want_d(rd.begin() + first * nv * dv, rd.end());
        const std::vector<float> got_c(got_conv.begin() + q.q_start * dim,
                                       got_conv.begin() + (q.q_start + q.q_len) * dim);
        const std::vector<float> got_d(got.begin() + q.q_start * nv * dv,
                                       got.begin() + (q.q_start + q.q_len) * nv * dv);
        EXPECT_LT(rel_l2(got_c, want_c), 1e-6) << "conv, step " << si << " slot " << slot << " dk " << dk;
        EXPECT_LT(rel_l2(got_d, want_d), 1e-5) << "delta rule, step " << si << " slot " << slot << " dk " << dk
                                               << " tiled " << tiled;
      }
    }
  }
}

// ---------------------------------------------------------------- optional ops

TEST_P(BackendOps, SoftcapMatchesTanhFormula) {
  if (!be_->supports_op(op_query(PGLB_OP_SOFTCAP))) return;
  const auto x = randn(333, 21, 40.0f);
  auto xb = put(x);
  be_->softcap(*xb, 333, 30.0f);
  std::vector<double> ref(x.size());
  for (size_t i = 0; i < x.size(); ++i) ref[i] = 30.0 * std::tanh(double(x[i]) / 30.0);
  EXPECT_LT(rel_l2(get(*xb, ref.size()), ref), 1e-6);
}

// Every backend scales (the base class through host memory where the backend has no op of its own).
TEST_P(BackendOps, ScaleMultipliesEveryValue) {
  const auto x = randn(777, 23, 5.0f);
  auto xb = put(x);
  be_->scale(*xb, 700, -1.75f);  // the last 77 values stay as they are
  std::vector<double> ref(x.begin(), x.end());
  for (size_t i = 0; i < 700; ++i) ref[i] = -1.75 * double(x[i]);
  EXPECT_LT(rel_l2(get(*xb, ref.size()), ref), 1e-7);
}

// The reference is the host sampler drawing from the same row with the same
// generator: a device draw must pick its token.
TEST_P(BackendOps, SampleOpPicksTheHostSamplersToken) {
  if (!be_->supports_op(op_query(PGLB_OP_SAMPLE))) return;
  const int32_t vocab = 1000, rows = 6;
  auto logits = randn(static_cast<size_t>(vocab * rows), 22, 3.0f);
  logits[2 * vocab + 17] = std::nanf("");  // never chosen
  logits[3 * vocab + 5] = -INFINITY;
  std::fill_n(logits.begin() + 5 * vocab, vocab, -INFINITY);  // row 5: nothing finite
  auto lb = put(logits);
  std::vector<SampleDraw> draws;
  std::vector<int32_t> want;
  Sampler host;
  for (int trial = 0; trial < 40; ++trial) {
    SampleDraw d{};
    d.row = trial % (rows - 1);
    d.temperature = trial % 5 == 0 ? 0.0f : 0.3f + 0.1f * static_cast<float>(trial % 9);
    d.top_k = trial % 3 == 0 ? 0 : 5 + trial;
    d.top_p = trial % 4 == 0 ? 1.0f : 0.5f + 0.01f * static_cast<float>(trial);
    d.min_p = trial % 7 == 0 ? 0.05f : 0.0f;
    SamplerRng rng(1234, static_cast<uint64_t>(trial)), copy = rng;
    d.u = d.temperature < kGreedyTemperature ? 0.0 : copy.next_double();
    SamplingParams p;
    p.temperature = d.temperature;
    p.top_k = d.top_k;
    p.top_p = d.top_p;
    p.min_p = d.min_p;
    std::vector<float> row(logits.begin() + d.row * vocab, logits.begin() + (d.row + 1) * vocab);
    want.push_back(host.sample(row.data(), vocab, p, {}, {}, {}, rng).token);
    draws.push_back(d);
  }
  SampleDraw none{};
  none.row = 5;
  none.temperature = 1.0f;
  none.top_p = 1.0f;
  none.u = 0.5;
  draws.push_back(none);
  want.push_back(-1);
  auto ids = be_->alloc(DType::I32, draws.size());
  be_->sample(*lb, vocab, draws, *ids);
  std::vector<int32_t> got(draws.size());
  be_->copy_to_host(*ids, 0, got.size() * sizeof(int32_t), got.data());
  be_->synchronize();
  EXPECT_EQ(got, want);
}

TEST(ExpertSlice, ViewsOneExpertOfAStack) {
  std::vector<float> data(3 * 4 * 2);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i);
  const TensorData t{"blk.0.ffn_up_exps.weight", DType::F32, {3, 4, 2}, data.data()};
  const TensorData e1 = expert_slice(t, 1);
  EXPECT_EQ(e1.shape, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(e1.name, "blk.0.ffn_up_exps.weight[1]");
  EXPECT_EQ(static_cast<const float*>(e1.data)[0], 12.0f);
  EXPECT_THROW(expert_slice(t, 2), Error);
  // A stack of per-expert vectors ([cols, n_expert]: gpt-oss biases) slices into vectors.
  const TensorData b1 = expert_slice(e1, 3);
  EXPECT_EQ(b1.shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(static_cast<const float*>(b1.data)[0], 21.0f);
  EXPECT_THROW(expert_slice(b1, 0), Error);
}

const BackendCase kCases[] = {
    {"cpu_scalar", "cpu", "scalar"},
    {"cpu_avx2", "cpu", "avx2"},
    {"cpu_avx512", "cpu", "avx512"},
    {"cpu_avx512_vnni", "cpu", "avx512-vnni"},
#if defined(__aarch64__)
    {"cpu_neon", "cpu", "neon"},
    {"cpu_neon_dotprod", "cpu", "neon-dotprod"},
    {"cpu_neon_i8mm", "cpu", "neon-i8mm"},
#endif
    {"opencl", "opencl", nullptr},
    {"cscalar", "cscalar", nullptr},
};

INSTANTIATE_TEST_SUITE_P(Backends, BackendOps, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.label); });

}  // namespace
}  // namespace pagellm
