// Tiny dummy models stored in each of the newer GGUF weight types compute the
// function of their own weights: the same model with every tensor
// dequantized to F32 (through the reference) gives the same logits, within
// float rounding on the exact path and within the 8-bit activation noise on
// the fast one.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/quant_blocks.h"
#include "core/thread_pool.h"
#include "model/dummy.h"
#include "model/model.h"
#include "model/model_test_util.h"

namespace pagellm {
namespace {

// Another source's tensors as F32 (dequantized on first lookup).
class DequantizedSource final : public TensorSource {
 public:
  explicit DequantizedSource(const TensorSource& src) : src_(src) {}

  const TensorData* find(const std::string& name) const override {
    if (auto it = cache_.find(name); it != cache_.end()) return &it->second.t;
    const TensorData* t = src_.find(name);
    if (t == nullptr) return nullptr;
    Entry& e = cache_[name];
    const int64_t rows = t->rows(), cols = t->cols();
    const size_t row_bytes = dtype_row_bytes(t->type, cols);
    e.values.resize(static_cast<size_t>(rows * cols));  // [rows, cols]
    for (int64_t r = 0; r < rows; ++r)
      dequantize_row_ref(t->type, static_cast<const uint8_t*>(t->data) + static_cast<size_t>(r) * row_bytes,
                         e.values.data() + r * cols, cols);
    e.t = TensorData{t->name, DType::F32, t->shape, e.values.data()};
    return &e.t;
  }
  size_t count() const override { return src_.count(); }

 private:
  struct Entry {
    TensorData t;
    std::vector<float> values;
  };
  const TensorSource& src_;
  mutable std::map<std::string, Entry> cache_;  // nodes never move
};

std::vector<float> run_tokens(const ModelConfig& cfg, const TensorSource& src, bool exact) {
  CpuBackendOptions o;
  o.threads = 2;
  o.exact_matmul = exact;
  auto backend = make_cpu_backend(o);
  auto model = Model::from_source(cfg, src, *backend);
  std::vector<int32_t> tokens;
  for (int i = 0; i < 20; ++i) tokens.push_back(1 + (i * 37) % 500);
  test::PagedRunner runner(*model, 16, 16, DType::F32);
  return runner.feed(tokens, 7, true);  // chunked prefill: paging too
}

class QuantModel : public ::testing::TestWithParam<DType> {};

TEST_P(QuantModel, MatchesItsDequantizedF32Weights) {
  const DType type = GetParam();
  ThreadPool pool(2);
  for (const char* shape : {"tiny-llama", "tiny-qwen3", "tiny-gemma3"}) {
    const int n_vocab = dummy_vocab_size(shape, nullptr);
    const ModelConfig cfg = dummy_config(shape, n_vocab);
    auto src = make_dummy_source(cfg, DummySpec{shape, type, 9}, pool);
    const TensorData* wq = src->find("blk.0.attn_q.weight");
    ASSERT_NE(wq, nullptr);
    ASSERT_EQ(wq->type, type) << shape;
    const DequantizedSource f32(*src);
    const auto want = run_tokens(cfg, f32, true);
    const double exact_gap = test::max_rel_gap(run_tokens(cfg, *src, true), want, n_vocab);
    const double fast_gap = test::max_rel_gap(run_tokens(cfg, *src, false), want, n_vocab);
    // Exact: the same float products (measured: identical). Fast: 8-bit
    // activations; measured 4e-3..4.5e-2 for every type here, Q4_K / Q8_0
    // (the baselines) included, the largest on tiny-gemma3.
    EXPECT_LE(exact_gap, 1e-4) << shape;
    EXPECT_LE(fast_gap, 8e-2) << shape;
    std::printf("[ quant model ] %s %s: exact %.2e fast %.2e\n", dtype_name(type).c_str(), shape, exact_gap,
                fast_gap);
  }
}

// Rows that are not whole 256-blocks fall back as llama.cpp's quantizer does.
TEST(QuantModel, DummyTypeFallbacks) {
  for (DType t : {DType::Q2_K, DType::Q3_K, DType::IQ4_XS}) {
    EXPECT_EQ(dummy_tensor_type(t, 2048), t);
    EXPECT_EQ(dummy_tensor_type(t, 896), DType::IQ4_NL) << dtype_name(t);
  }
  EXPECT_EQ(dummy_tensor_type(DType::IQ4_NL, 896), DType::IQ4_NL);
  EXPECT_EQ(dummy_tensor_type(DType::MXFP4, 896), DType::MXFP4);
  EXPECT_EQ(dummy_tensor_type(DType::Q4_K, 896), DType::Q5_0);
}

// Q4_K and Q8_0 are there as baselines for the newer types' figures.
INSTANTIATE_TEST_SUITE_P(Types, QuantModel,
                         ::testing::Values(DType::Q4_K, DType::Q8_0, DType::Q2_K, DType::Q3_K, DType::IQ4_NL, DType::IQ4_XS,
                                           DType::MXFP4),
                         [](const auto& info) { return dtype_name(info.param); });

}  // namespace
}  // namespace pagellm
