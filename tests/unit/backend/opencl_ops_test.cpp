// The OpenCL backend's own cases, beyond the op suite every backend passes
// (backend_ops_test.cpp, which also runs on OpenCL through its plugin): the
// type each weight is held as, float rows of any length (the kernels' scalar
// path), store_kv with fused k-rope followed by attention over the shapes the
// kernels tile differently (split keys, head_dim 8 to 256, tiles of 8
// tokens), masked NaN values, copies and swap seen through attention,
// options and profiling. Skipped where no OpenCL device exists.
//
// The helpers in `backend_test` know nothing of OpenCL: a suite
// parameterized over backends can take them as they are.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/opencl/opencl_backend.h"
#include "backend_test_util.h"
#include "core/error.h"
#include "core/fp16.h"
#include "core/quant_blocks.h"
#include "core/thread_pool.h"
#include "model/dummy.h"
#include "model/model.h"

namespace pagellm {
namespace {

using namespace backend_test;

class OpenClOps : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    try {
      backend_ = make_opencl_backend(0, {}).release();
    } catch (const Error& e) {
      const std::string m = e.what();
      // Only a missing platform or device skips; a kernel that fails to build must fail.
      if (m.find("no OpenCL platform") != std::string::npos || m.find("does not exist") != std::string::npos)
        skip_reason_ = new std::string(m);
      else
        throw;
    }
  }
  static void TearDownTestSuite() {
    delete backend_;
    backend_ = nullptr;
  }
  void SetUp() override {
    if (!backend_) GTEST_SKIP() << (skip_reason_ ? *skip_reason_ : "no OpenCL backend");
  }
  Backend& be() { return *backend_; }

  static Backend* backend_;
  static std::string* skip_reason_;
};
Backend* OpenClOps::backend_ = nullptr;
std::string* OpenClOps::skip_reason_ = nullptr;

TEST_F(OpenClOps, DescribesItself) {
  EXPECT_EQ(be().name(), "opencl");
  EXPECT_TRUE(be().supports(Feature::SwapToHost));
  EXPECT_TRUE(be().supports(Feature::AsyncOps));
  const MemoryInfo before = be().memory_info();
  EXPECT_GT(before.total_bytes, 0u);
  {
    auto b = be().alloc(DType::F32, 1 << 20);
    EXPECT_EQ(be().memory_info().free_bytes, before.free_bytes - (4u << 20));
  }
  EXPECT_EQ(be().memory_info().free_bytes, before.free_bytes);
  std::printf("%s\n", be().describe().c_str());
}

// The 2026 layer kinds have no OpenCL kernels yet: a model with them is
// refused at load, naming what is missing, before anything is uploaded.
TEST_F(OpenClOps, RefusesLinearAttentionMlaAndExpertsByName) {
  ThreadPool pool(2);
  for (auto [shape, what] : {std::pair{"tiny-qwen35", "linear-attention (Gated DeltaNet) layers"},
                             std::pair{"tiny-deepseek3", "Mixture-of-Experts"},
                             std::pair{"tiny-qwen35moe", "Mixture-of-Experts"}}) {
    const ModelConfig cfg = dummy_config(shape, dummy_vocab_size(shape, nullptr));
    auto src = make_dummy_source(cfg, DummySpec{shape, DType::F32, 1}, pool);
    try {
      Model::from_source(cfg, *src, be());
      ADD_FAILURE() << shape << " loaded on OpenCL";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << shape << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find("--device cpu"), std::string::npos) << e.what();
    }
  }
}

TEST_F(OpenClOps, RefusesUnknownOptions) {
  EXPECT_THROW(make_opencl_backend(0, {{"exact_matmul", "1"}}), Error);
  EXPECT_THROW(make_opencl_backend(0, {{"platform", "99"}}), Error);
  EXPECT_THROW(make_opencl_backend(99, {}), Error);
}

TEST_F(OpenClOps, ProfilesKernels) {
  auto w = random_weight(be(), DType::Q8_0, 64, 256, 3, nullptr);
  auto x = upload(be(), randn(256, 4));
  auto y = be().alloc(DType::F32, 64);
  be().set_profiling(true);
  be().matmul(*w, *x, 1, *y);
  be().synchronize();
  const std::string report = be().profile_report();
  be().set_profiling(false);
  EXPECT_NE(report.find("matmul"), std::string::npos) << report;
  EXPECT_EQ(report.find("no profile"), std::string::npos) << report;
  std::printf("%s\n", report.c_str());
}

struct MatmulCase {
  DType type;
  DType held;
};

class OpenClMatmul : public OpenClOps, public ::testing::WithParamInterface<MatmulCase> {};

TEST_P(OpenClMatmul, MatchesReference) {
  const auto [type, held] = GetParam();
  const int64_t rows = 78, cols = 512;  // rows: not a whole number of tiles or row groups
  std::vector<float> wf;
  auto w = random_weight(be(), type, rows, cols, 7, &wf);
  EXPECT_EQ(w->type, type);
  EXPECT_EQ(w->held_type, held);
  EXPECT_EQ(w->held_bytes, dtype_row_bytes(held, cols) * rows);
  // A converted type is held as the reference Q8_0 of the file's values.
  if (held != type) {
    std::vector<uint8_t> q8(dtype_row_bytes(DType::Q8_0, cols) * rows);
    quantize_row_ref(DType::Q8_0, wf.data(), q8.data(), rows * cols);
    dequantize_row_ref(DType::Q8_0, q8.data(), wf.data(), rows * cols);
  }
  for (int64_t n : {1, 3, 17, 64}) {
    const auto x = randn(static_cast<size_t>(n * cols), 100 + static_cast<uint32_t>(n));
    auto xb = upload(be(), x);
    auto yb = be().alloc(DType::F32, n * rows);
    be().matmul(*w, *xb, n, *yb);
    const auto y = download(be(), *yb, n * rows);
    std::vector<double> ref(n * rows);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t r = 0; r < rows; ++r) {
        double s = 0;
        for (int64_t c = 0; c < cols; ++c) s += static_cast<double>(x[t * cols + c]) * wf[r * cols + c];
        ref[t * rows + r] = s;
      }
    const double err = rel_l2(y, ref);
    EXPECT_LT(err, 1e-5) << dtype_name(type) << " n=" << n;
    std::printf("matmul %-5s n=%-3lld rel err %.2e\n", dtype_name(type).c_str(), static_cast<long long>(n), err);
  }
}

INSTANTIATE_TEST_SUITE_P(Types, OpenClMatmul,
                         ::testing::Values(MatmulCase{DType::F32, DType::F32}, MatmulCase{DType::F16, DType::F16},
                                           MatmulCase{DType::Q8_0, DType::Q8_0}, MatmulCase{DType::Q4_0, DType::Q4_0},
                                           MatmulCase{DType::Q4_K, DType::Q4_K}, MatmulCase{DType::Q5_0, DType::Q5_0},
                                           MatmulCase{DType::Q6_K, DType::Q6_K}, MatmulCase{DType::Q5_K, DType::Q8_0},
                                           MatmulCase{DType::Q4_1, DType::Q8_0}),
                         [](const auto& info) { return dtype_name(info.param.type); });

// Float rows need only a multiple of 8 values: the tiled kernel's last
// 32-column step is partly empty.
TEST_F(OpenClOps, MatmulShortFloatRows) {
  for (DType type : {DType::F32, DType::F16}) {
    const int64_t rows = 70, cols = 264;
    std::vector<float> wf;
    auto w = random_weight(be(), type, rows, cols, 9, &wf);
    for (int64_t n : {1, 17}) {
      const auto x = randn(n * cols, 10);
      auto xb = upload(be(), x);
      auto yb = be().alloc(DType::F32, n * rows);
      be().matmul(*w, *xb, n, *yb);
      std::vector<double> ref(n * rows);
      for (int64_t t = 0; t < n; ++t)
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c) ref[t * rows + r] += static_cast<double>(x[t * cols + c]) * wf[r * cols + c];
      EXPECT_LT(rel_l2(download(be(), *yb, n * rows), ref), 1e-5) << dtype_name(type) << " n=" << n;
    }
  }
}

// Float rows of any length (stories260K's ffn_down has 172 columns): the
// scalar kernel, for decode and prefill sizes alike.
TEST_F(OpenClOps, MatmulFloatRowsOfAnyLength) {
  for (DType type : {DType::F32, DType::F16})
    for (int64_t cols : {172, 20}) {
      const int64_t rows = 70;
      std::vector<float> wf;
      auto w = random_weight(be(), type, rows, cols, 12, &wf);
      EXPECT_EQ(w->held_bytes, dtype_row_bytes(type, cols) * rows);
      for (int64_t n : {1, 5, 40}) {
        const auto x = randn(n * cols, 13 + static_cast<uint32_t>(n));
        auto xb = upload(be(), x);
        auto yb = be().alloc(DType::F32, n * rows);
        be().matmul(*w, *xb, n, *yb);
        std::vector<double> ref(n * rows);
        for (int64_t t = 0; t < n; ++t)
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < cols; ++c)
              ref[t * rows + r] += static_cast<double>(x[t * cols + c]) * wf[r * cols + c];
        EXPECT_LT(rel_l2(download(be(), *yb, n * rows), ref), 1e-5)
            << dtype_name(type) << " cols=" << cols << " n=" << n;
      }
    }
}

// A converted weight equals the reference conversion exactly: Q8_0 of the
// dequantized file values.
TEST_F(OpenClOps, ConvertedWeightIsTheReferenceQ8) {
  const int64_t rows = 3, cols = 256;
  std::vector<float> wf;
  auto w = random_weight(be(), DType::Q5_K, rows, cols, 11, &wf);
  std::vector<uint8_t> q8(dtype_row_bytes(DType::Q8_0, cols) * rows);
  std::vector<float> want(rows * cols);
  quantize_row_ref(DType::Q8_0, wf.data(), q8.data(), rows * cols);
  dequantize_row_ref(DType::Q8_0, q8.data(), want.data(), rows * cols);
  // One-hot inputs read the weight's columns back.
  std::vector<float> x(cols * cols, 0.0f);
  for (int64_t c = 0; c < cols; ++c) x[c * cols + c] = 1.0f;
  auto xb = upload(be(), x);
  auto yb = be().alloc(DType::F32, cols * rows);
  be().matmul(*w, *xb, cols, *yb);
  const auto y = download(be(), *yb, cols * rows);
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t r = 0; r < rows; ++r) ASSERT_EQ(y[c * rows + r], want[r * cols + c]) << r << "," << c;
}

TEST_F(OpenClOps, EmbedFloatRowsOfAnyLength) {
  for (DType type : {DType::F32, DType::F16}) {
    const int64_t vocab = 30, cols = 20;
    std::vector<float> table;
    auto w = random_weight(be(), type, vocab, cols, 6, &table);
    BatchInfo b;
    b.token_ids = {29, 0, 7, 7, 13};
    b.positions = {0, 1, 2, 3, 4};
    b.slot_mapping = {0, 1, 2, 3, 4};
    be().set_batch(b);
    auto out = be().alloc(DType::F32, b.token_ids.size() * cols);
    be().embed(*w, 0.5f, *out);
    std::vector<double> ref;
    for (int32_t id : b.token_ids)
      for (int64_t c = 0; c < cols; ++c) ref.push_back(static_cast<double>(table[id * cols + c]) * 0.5);
    EXPECT_LT(rel_l2(download(be(), *out, b.token_ids.size() * cols), ref), 1e-7) << dtype_name(type);
  }
}

// ---- paged attention

// The cache as the reference sees it: K (rotated) and V per sequence and
// position, rounded as the cache stores them.
struct RefCache {
  std::vector<std::vector<double>> k, v;  // [seq][pos * n_kv * D]
};

double round_cache(double x, bool f16) { return f16 ? fp16_to_fp32(fp32_to_fp16(static_cast<float>(x))) : static_cast<float>(x); }

// Two steps: the context before each sequence's queries (store_kv only),
// then the queries (store_kv with fused k-rope, attention), all sequences
// in one batch with random, non-contiguous block tables.
class AttentionRun {
 public:
  AttentionRun(Backend& be, const AttnCase& c, uint32_t seed) : be_(be), c_(c) {
    const int D = c.head_dim, row = c.n_kv * D;
    int total_blocks = 1;
    for (auto [q, ctx] : c.seqs) total_blocks += (ctx + c.block - 1) / c.block;
    spec_.n_layers = 2;
    spec_.n_kv_heads = c.n_kv;
    spec_.head_dim = D;
    spec_.block_size = c.block;
    spec_.num_blocks = total_blocks + 4;  // spare blocks for the copy tests
    spec_.dtype = c.f16 ? DType::F16 : DType::F32;
    be.allocate_kv_cache(spec_);
    std::vector<int32_t> ids(spec_.num_blocks - 1);
    std::iota(ids.begin(), ids.end(), 1);
    std::mt19937 rng(seed);
    std::shuffle(ids.begin(), ids.end(), rng);
    size_t next = 0;
    for (auto [q, ctx] : c.seqs) {
      tables_.emplace_back();
      for (int b = 0; b < (ctx + c.block - 1) / c.block; ++b) tables_.back().push_back(ids[next++]);
    }
    for (size_t i = next; i < ids.size(); ++i) spare_.push_back(ids[i]);
    rope_.n_rot = D > 16 ? D - 16 : D;
    rope_.freq_base = 10000.0f;
    rope_.neox = c.neox;
    ref_.k.resize(c.seqs.size());
    ref_.v.resize(c.seqs.size());

    for (int step = 0; step < 2; ++step) {
      BatchInfo b = step_batch(step);
      if (b.n_tokens() == 0) continue;
      const int64_t n = b.n_tokens();
      const auto k = randn(n * row, seed + 10 * step + 1), v = randn(n * row, seed + 10 * step + 2);
      auto vb = upload(be, v);
      be.set_batch(b);
      // The reference: rotate in double, then round as the cache does.
      std::vector<double> kr = to_double(k);
      for (int64_t t = 0; t < n; ++t)
        for (int g = 0; g < c.n_kv; ++g)
          rope_ref(kr.data() + (t * c.n_kv + g) * D, b.positions[t], rope_.n_rot, c.neox, rope_.freq_base, 1.0, nullptr);
      for (int layer = 0; layer < 2; ++layer) {
        auto kb = upload(be, k);  // each layer its own k: store_kv rotates it in place
        be.store_kv(layer, *kb, *vb, &rope_);
        if (step == 1 && layer == 1) {
          EXPECT_LT(rel_l2(download(be, *kb, n * row), kr), 1e-5) << "k rotated in place";
        }
      }
      for (size_t s = 0; s < c.seqs.size(); ++s) {
        const auto& si = seq_of_step_[s];
        for (int i = 0; i < si.second; ++i)
          for (int e = 0; e < row; ++e) {
            ref_.k[s].push_back(round_cache(kr[(si.first + i) * row + e], c.f16));
            ref_.v[s].push_back(round_cache(v[(si.first + i) * row + e], c.f16));
          }
      }
      if (step == 1) batch_ = b;
    }
    q_ = randn(batch_.n_tokens() * c.n_head * D, seed + 99);
    qb_ = upload(be, q_);
  }

  AttentionConfig config() const {
    AttentionConfig a;
    a.n_head = c_.n_head;
    a.n_head_kv = c_.n_kv;
    a.head_dim = c_.head_dim;
    a.scale = c_.softcap > 0 ? 2.0f / std::sqrt(static_cast<float>(c_.head_dim)) : 1.0f / std::sqrt(static_cast<float>(c_.head_dim));
    a.sliding_window = c_.window;
    a.softcap = c_.softcap;
    return a;
  }

  std::vector<float> run(int layer) {
    be_.set_batch(batch_);
    auto out = be_.alloc(DType::F32, q_.size());
    be_.attention(layer, *qb_, *out, config());
    return download(be_, *out, q_.size());
  }

  std::vector<double> reference() const {
    const AttentionConfig a = config();
    const int D = c_.head_dim, G = c_.n_head / c_.n_kv, row = c_.n_kv * D;
    std::vector<double> out(q_.size());
    for (size_t s = 0; s < c_.seqs.size(); ++s) {
      const auto [q_len, ctx] = c_.seqs[s];
      const int q_start = batch_.seqs[s].q_start;
      for (int i = 0; i < q_len; ++i) {
        const int p = ctx - q_len + i;
        for (int h = 0; h < c_.n_head; ++h) {
          const int g = h / G;
          const float* qv = q_.data() + (static_cast<size_t>(q_start + i) * c_.n_head + h) * D;
          std::vector<double> sc;
          std::vector<int> js;
          for (int j = 0; j <= p; ++j) {
            if (a.sliding_window > 0 && j <= p - a.sliding_window) continue;
            double d = 0;
            for (int e = 0; e < D; ++e) d += qv[e] * ref_.k[s][static_cast<size_t>(j) * row + g * D + e];
            d *= a.scale;
            if (a.softcap > 0) d = a.softcap * std::tanh(d / a.softcap);
            sc.push_back(d);
            js.push_back(j);
          }
          const double mx = *std::max_element(sc.begin(), sc.end());
          double l = 0;
          for (double& x : sc) l += (x = std::exp(x - mx));
          double* o = out.data() + (static_cast<size_t>(q_start + i) * c_.n_head + h) * D;
          for (size_t k = 0; k < js.size(); ++k)
            for (int e = 0; e < D; ++e) o[e] += sc[k] / l * ref_.v[s][static_cast<size_t>(js[k]) * row + g * D + e];
        }
      }
    }
    return out;
  }

  BatchInfo& batch() { return batch_; }
  std::vector<std::vector<int32_t>>& tables() { return tables_; }
  const std::vector<int32_t>& spare() const { return spare_; }

 private:
  // Step 0: positions [0, ctx - q_len); step 1: [ctx - q_len, ctx).
  BatchInfo step_batch(int step) {
    BatchInfo b;
    seq_of_step_.clear();
    for (size_t s = 0; s < c_.seqs.size(); ++s) {
      const auto [q_len, ctx] = c_.seqs[s];
      const int p0 = step == 0 ? 0 : ctx - q_len, p1 = step == 0 ? ctx - q_len : ctx;
      seq_of_step_.emplace_back(static_cast<int>(b.n_tokens()), p1 - p0);
      if (p1 == p0) continue;
      SeqInfo si;
      si.q_start = static_cast<int32_t>(b.n_tokens());
      si.q_len = p1 - p0;
      si.ctx_len = p1;
      si.block_table = tables_[s];
      for (int p = p0; p < p1; ++p) {
        b.token_ids.push_back(0);
        b.positions.push_back(p);
        b.slot_mapping.push_back(static_cast<int64_t>(tables_[s][p / c_.block]) * c_.block + p % c_.block);
      }
      b.seqs.push_back(si);
    }
    return b;
  }

  Backend& be_;
  AttnCase c_;
  KVCacheSpec spec_;
  RopeConfig rope_;
  std::vector<std::vector<int32_t>> tables_;
  std::vector<int32_t> spare_;
  std::vector<std::pair<int, int>> seq_of_step_;  // (first row, tokens) of each sequence in the step
  RefCache ref_;
  BatchInfo batch_;
  std::vector<float> q_;
  BufferPtr qb_;
};

class OpenClAttention : public OpenClOps, public ::testing::WithParamInterface<AttnCase> {};

TEST_P(OpenClAttention, MatchesReference) {
  const AttnCase& c = GetParam();
  AttentionRun run(be(), c, 1234);
  const auto ref = run.reference();
  for (int layer = 0; layer < 2; ++layer) {
    const double err = rel_l2(run.run(layer), ref);
    EXPECT_LT(err, c.f16 ? 1e-3 : 1e-5) << "layer " << layer;
    if (layer == 0) {
      std::printf("attention h=%d kv=%d D=%d block=%d window=%d softcap=%g %s: rel err %.2e\n", c.n_head, c.n_kv,
                  c.head_dim, c.block, c.window, c.softcap, c.f16 ? "f16" : "f32", err);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, OpenClAttention,
    ::testing::Values(
        // Gemma 3 270M shapes: head_dim 256, 4 query heads on 1 KV head.
        AttnCase{4, 1, 256, 16, 0, 0.0f, true, {{1, 40}, {5, 37}, {16, 16}}},
        AttnCase{4, 1, 256, 16, 24, 0.0f, false, {{7, 60}, {1, 100}}},
        AttnCase{8, 2, 64, 16, 0, 2.0f, false, {{3, 50}, {1, 1}, {20, 20}}, false},
        // More query heads per KV head than rows of a work-group.
        AttnCase{12, 1, 64, 32, 0, 0.0f, true, {{2, 33}, {9, 9}}},
        AttnCase{6, 2, 128, 8, 10, 20.0f, true, {{4, 30}, {1, 13}}},
        // No GQA (tiles of 8 tokens); head_dim 80; blocks larger than a key chunk.
        AttnCase{8, 8, 80, 64, 0, 0.0f, false, {{13, 70}, {1, 130}}, false},
        // Long decodes: keys split across work-groups, then merged.
        AttnCase{4, 1, 64, 16, 0, 0.0f, false, {{1, 1500}}},
        AttnCase{4, 1, 64, 16, 700, 0.0f, true, {{1, 1500}, {2, 900}}},
        // stories260K: head_dim 8 (lanes 8..15 own no output), 8 heads on 4 KV heads.
        AttnCase{8, 4, 8, 16, 0, 0.0f, true, {{1, 40}, {5, 37}, {16, 16}, {1, 1}}},
        AttnCase{8, 4, 8, 16, 0, 0.0f, false, {{3, 50}, {9, 9}, {1, 600}}},
        AttnCase{8, 4, 8, 32, 6, 0.0f, true, {{4, 30}, {1, 13}}},
        AttnCase{8, 4, 8, 16, 0, 0.0f, false, {{1, 1500}}},  // split keys
        // head_dim a multiple of 8, not of 16.
        AttnCase{6, 2, 40, 16, 0, 0.0f, false, {{7, 60}, {1, 700}}}));

// copy_blocks and a swap round trip, seen through attention: a sequence
// whose table names the copies attends exactly as over the originals.
TEST_F(OpenClOps, CopyBlocksAndSwap) {
  AttnCase c{4, 2, 64, 16, 0, 0.0f, true, {{3, 40}}};
  AttentionRun run(be(), c, 77);
  const auto base = run.run(1);
  std::vector<int32_t>& table = run.tables()[0];
  ASSERT_GE(run.spare().size(), 3u);
  // Copy-on-write of the table's three blocks into the spare ones.
  BlockPairs copies;
  std::vector<int32_t> copied;
  for (size_t i = 0; i < table.size(); ++i) {
    copies.emplace_back(table[i], run.spare()[i]);
    copied.push_back(run.spare()[i]);
  }
  be().copy_blocks(copies);
  const auto original = table;
  run.batch().seqs[0].block_table = copied;
  EXPECT_EQ(run.run(1), base);

  // Swap the copies out, overwrite them on the device, swap them back in.
  be().allocate_swap_space(8);
  BlockPairs out, in, clobber;
  for (size_t i = 0; i < copied.size(); ++i) {
    out.emplace_back(copied[i], static_cast<int32_t>(7 - i));
    in.emplace_back(static_cast<int32_t>(7 - i), copied[i]);
    clobber.emplace_back(original[(i + 1) % original.size()], copied[i]);
  }
  be().swap_out(out);
  be().copy_blocks(clobber);
  EXPECT_NE(run.run(1), base);
  be().swap_in(in);
  EXPECT_EQ(run.run(1), base);
}

// ---- elementwise

}  // namespace
}  // namespace pagellm
