// The CPU backend's non-matmul ops against plain double-precision references,
// on random data, for both the portable and the AVX2 kernels: paged attention
// (tiles, causal and sliding-window masks, softcap, split key ranges, F16 and
// F32 caches), RMSNorm, RoPE, GLU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <algorithm>
#include <numeric>
#include <random>

#include "backend/backend.h"
#include "core/cpu_features.h"
#include "core/fp16.h"

namespace pagellm {
namespace {

// Runs the test body with PAGELLM_ISA set (the backend reads it at construction).
class OpsIsa : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (std::string(GetParam()) == "avx2" && cpu_features().best() == Isa::Scalar && !std::getenv("PAGELLM_ISA"))
      GTEST_SKIP() << "no AVX2";
    setenv("PAGELLM_ISA", GetParam(), 1);
  }
  void TearDown() override { unsetenv("PAGELLM_ISA"); }
};

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

double norm_err(const std::vector<float>& a, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - ref[i]) * (a[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

struct AttnCase {
  int n_head, n_kv, head_dim, block;
  int window;
  float softcap;
  bool f16;
  std::vector<std::pair<int, int>> seqs;  // (q_len, ctx_len)
};

// Writes random K/V for every position of each sequence into a paged cache
// (non-contiguous block tables), runs attention, and compares with a
// full-softmax reference computed from the same (rounded) K/V.
void check_attention(const AttnCase& c, uint32_t seed) {
  auto be = make_cpu_backend(2);
  const int D = c.head_dim, B = c.block;
  int total_blocks = 1;
  for (auto [ql, ctx] : c.seqs) total_blocks += (ctx + B - 1) / B;
  KVCacheSpec spec;
  spec.n_layers = 1;
  spec.n_kv_heads = c.n_kv;
  spec.head_dim = D;
  spec.block_size = B;
  spec.num_blocks = total_blocks + 3;
  spec.dtype = c.f16 ? DType::F16 : DType::F32;
  be->allocate_kv_cache(spec);
  std::vector<int32_t> free_blocks(spec.num_blocks - 1);
  std::iota(free_blocks.begin(), free_blocks.end(), 1);
  std::mt19937 rng(seed);
  std::shuffle(free_blocks.begin(), free_blocks.end(), rng);

  // Pass 1: fill each sequence's cache for all ctx positions (one batch).
  BatchInfo fill;
  std::vector<std::vector<int32_t>> tables;
  for (auto [ql, ctx] : c.seqs) {
    std::vector<int32_t> t;
    for (int b = 0; b < (ctx + B - 1) / B; ++b) {
      t.push_back(free_blocks.back());
      free_blocks.pop_back();
    }
    SeqInfo s;
    s.q_start = static_cast<int32_t>(fill.token_ids.size());
    s.q_len = ctx;
    s.ctx_len = ctx;
    s.block_table = t;
    for (int p = 0; p < ctx; ++p) {
      fill.token_ids.push_back(0);
      fill.positions.push_back(p);
      fill.slot_mapping.push_back(static_cast<int64_t>(t[p / B]) * B + p % B);
    }
    fill.seqs.push_back(s);
    tables.push_back(t);
  }
  const int64_t n_fill = fill.n_tokens();
  auto k = randn(n_fill * c.n_kv * D, seed + 1), v = randn(n_fill * c.n_kv * D, seed + 2);
  be->set_batch(fill);
  be->store_kv(0, k.data(), v.data());
  if (c.f16)
    for (auto* x : {&k, &v})
      for (auto& e : *x) e = fp16_to_fp32(fp32_to_fp16(e));

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
  std::vector<float> out(nq * c.n_head * D, -7.0f);
  AttentionConfig ac;
  ac.n_head = c.n_head;
  ac.n_head_kv = c.n_kv;
  ac.head_dim = D;
  ac.scale = 1.0f / std::sqrt(static_cast<float>(D));
  ac.sliding_window = c.window;
  ac.softcap = c.softcap;
  be->set_batch(qb);
  be->attention(0, q.data(), out.data(), ac);

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
        for (int j = 0; j <= p; ++j) {
          if (c.window > 0 && j <= p - c.window) continue;
          const float* kr = k.data() + ((fill_start[si] + j) * c.n_kv + g) * D;
          double s = 0;
          for (int d = 0; d < D; ++d) s += static_cast<double>(q[(row * c.n_head + h) * D + d]) * kr[d];
          s *= ac.scale;
          if (c.softcap > 0) s = c.softcap * std::tanh(s / c.softcap);
          w.push_back(s);
          js.push_back(j);
          mx = std::max(mx, s);
        }
        double l = 0;
        for (auto& x : w) l += (x = std::exp(x - mx));
        for (int d = 0; d < D; ++d) {
          double acc = 0;
          for (size_t t = 0; t < js.size(); ++t)
            acc += w[t] * v[((fill_start[si] + js[t]) * c.n_kv + g) * D + d];
          ref[(row * c.n_head + h) * D + d] = acc / l;
        }
      }
    }
  }
  EXPECT_LT(norm_err(out, ref), 2e-6) << "heads " << c.n_head << "/" << c.n_kv << " D " << D << " B " << B
                                       << " window " << c.window << " softcap " << c.softcap << " f16 " << c.f16;
}

TEST_P(OpsIsa, PagedAttentionMatchesReference) {
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
  };
  uint32_t seed = 100;
  for (const auto& c : cases) check_attention(c, seed++);
}

TEST_P(OpsIsa, RmsNormRopeGlu) {
  auto be = make_cpu_backend(2);
  // RMSNorm over rows with and without a weight.
  const int rows = 37, dim = 640;
  auto x = randn(rows * dim, 1, 30.0f);
  auto wv = randn(dim, 2);
  TensorData td{"w", DType::F32, {dim}, wv.data()};
  auto w = be->upload(td);
  std::vector<float> y(x.size());
  be->rms_norm(x.data(), w.get(), rows, dim, 1e-6f, y.data());
  std::vector<double> ref(x.size());
  for (int r = 0; r < rows; ++r) {
    double ss = 0;
    for (int i = 0; i < dim; ++i) ss += static_cast<double>(x[r * dim + i]) * x[r * dim + i];
    const double inv = 1.0 / std::sqrt(ss / dim + 1e-6);
    for (int i = 0; i < dim; ++i) ref[r * dim + i] = x[r * dim + i] * inv * wv[i];
  }
  EXPECT_LT(norm_err(y, ref), 1e-6);

  // RoPE, both pair layouts, with a partial rotary dimension.
  for (bool neox : {false, true}) {
    const int n = 9, heads = 3, hd = 64, n_rot = 48;
    BatchInfo b;
    for (int t = 0; t < n; ++t) {
      b.token_ids.push_back(0);
      b.positions.push_back(t * 37 + 5);
      b.slot_mapping.push_back(0);
    }
    be->set_batch(b);
    auto xr = randn(n * heads * hd, 3);
    auto orig = xr;
    RopeConfig rc;
    rc.n_rot = n_rot;
    rc.freq_base = 10000.0f;
    rc.freq_scale = 0.5f;
    rc.neox = neox;
    be->rope(xr.data(), heads, hd, rc);
    std::vector<double> rr(orig.begin(), orig.end());
    for (int t = 0; t < n; ++t)
      for (int h = 0; h < heads; ++h)
        for (int i = 0; i < n_rot / 2; ++i) {
          const double th = b.positions[t] * 0.5 * std::pow(10000.0, -2.0 * i / n_rot);
          const int a = neox ? i : 2 * i, c2 = neox ? i + n_rot / 2 : 2 * i + 1;
          const int64_t o = (t * heads + h) * hd;
          rr[o + a] = orig[o + a] * std::cos(th) - orig[o + c2] * std::sin(th);
          rr[o + c2] = orig[o + a] * std::sin(th) + orig[o + c2] * std::cos(th);
        }
    EXPECT_LT(norm_err(xr, rr), 1e-6) << "neox " << neox;
  }

  // store_kv with RoPE fused: the cache holds the rotated k, the same as rope
  // then store. Attention over one visible key returns that key's value, so
  // compare the two caches through q . k with a one-hot q.
  {
    const int n = 5, kvh = 2, hd = 64;
    KVCacheSpec spec;
    spec.n_layers = 2;
    spec.n_kv_heads = kvh;
    spec.head_dim = hd;
    spec.block_size = 16;
    spec.num_blocks = 2;
    spec.dtype = DType::F32;
    be->allocate_kv_cache(spec);
    BatchInfo b;
    SeqInfo s;
    s.q_start = 0;
    s.q_len = n;
    s.ctx_len = n;
    s.block_table = {1};
    b.seqs.push_back(s);
    for (int t = 0; t < n; ++t) {
      b.token_ids.push_back(0);
      b.positions.push_back(t);
      b.slot_mapping.push_back(16 + t);
    }
    be->set_batch(b);
    RopeConfig rc;
    rc.n_rot = hd;
    rc.freq_base = 10000.0f;
    rc.neox = true;
    auto k1 = randn(n * kvh * hd, 7), v = randn(n * kvh * hd, 8);
    auto k2 = k1;
    be->store_kv(0, k1.data(), v.data(), &rc);
    be->rope(k2.data(), kvh, hd, rc);
    be->store_kv(1, k2.data(), v.data());
    EXPECT_EQ(k1, k2) << "k is rotated in place too";
    // Attention with the same q on both layers must agree exactly.
    auto q = randn(n * kvh * hd, 9);
    std::vector<float> o1(q.size()), o2(q.size());
    AttentionConfig ac;
    ac.n_head = kvh;
    ac.n_head_kv = kvh;
    ac.head_dim = hd;
    ac.scale = 0.125f;
    be->attention(0, q.data(), o1.data(), ac);
    be->attention(1, q.data(), o2.data(), ac);
    EXPECT_EQ(o1, o2);
  }

  // GLU: SiLU and GELU (tanh form).
  const int n = 10000;
  auto g = randn(n, 4, 3.0f), u = randn(n, 5);
  std::vector<float> o(n);
  for (Activation act : {Activation::Silu, Activation::GeluTanh}) {
    be->glu(g.data(), u.data(), n, act, o.data());
    std::vector<double> r(n);
    for (int i = 0; i < n; ++i) {
      const double a = g[i];
      const double f = act == Activation::Silu ? a / (1 + std::exp(-a))
                                               : 0.5 * a * (1 + std::tanh(0.7978845608028654 * (a + 0.044715 * a * a * a)));
      r[i] = f * u[i];
    }
    EXPECT_LT(norm_err(o, r), 1e-6);
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, OpsIsa, ::testing::Values("scalar", "avx2"));

}  // namespace
}  // namespace pagellm
