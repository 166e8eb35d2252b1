// A row's logits do not depend on how many rows of its sequence run in the
// same forward pass: decoding one token at a time and verifying several
// speculative tokens at once (a prefill chunk) give the same bits. Greedy
// output with and without speculation rests on this.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "backend/registry.h"
#include "core/thread_pool.h"
#include "model/dummy.h"
#include "format/gguf.h"
#include "model_test_util.h"
#include "test_paths.h"

namespace pagellm {
namespace {

// Logits of every position after the prompt, fed `chunk` tokens at a time.
std::vector<float> continuation_logits(Model& model, const std::vector<int32_t>& prompt,
                                       const std::vector<int32_t>& tokens, int chunk, DType kv) {
  test::PagedRunner runner(model, 64, 16, kv);
  runner.feed(prompt, 64, false);
  return runner.feed(tokens, chunk, true);
}

void expect_rows_invariant(Model& model, DType kv, int vocab_lo) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> tok(vocab_lo, model.config().n_vocab - 1);
  std::vector<int32_t> prompt(29), tokens(40);
  for (auto& t : prompt) t = tok(rng);
  for (auto& t : tokens) t = tok(rng);
  const std::vector<float> one = continuation_logits(model, prompt, tokens, 1, kv);
  const size_t V = static_cast<size_t>(model.config().n_vocab);
  for (int chunk : {2, 3, 5, 8}) {
    const std::vector<float> many = continuation_logits(model, prompt, tokens, chunk, kv);
    ASSERT_EQ(many.size(), one.size());
    for (size_t r = 0; r < tokens.size(); ++r)
      ASSERT_EQ(0, std::memcmp(one.data() + r * V, many.data() + r * V, V * sizeof(float)))
          << "chunk " << chunk << ", position " << prompt.size() + r;
  }
}

class RowInvariance : public ::testing::TestWithParam<const char*> {};

TEST_P(RowInvariance, DecodeAndMultiTokenRowsGiveTheSameBits) {
  const std::string shape = GetParam();
  auto backend = create_backend("cpu", {{"threads", "2"}});
  ThreadPool pool(2);
  const ModelConfig cfg = dummy_config(shape, 512);
  for (DType w : {DType::F32, DType::F16, DType::Q8_0, DType::Q4_K}) {
    SCOPED_TRACE(dtype_name(w));
    auto src = make_dummy_source(cfg, DummySpec{shape, w, 1}, pool);
    auto model = Model::from_source(cfg, *src, *backend);
    for (DType kv : {DType::F16, DType::F32, DType::I8}) expect_rows_invariant(*model, kv, 3);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, RowInvariance,
                         ::testing::Values("tiny-llama", "tiny-qwen3", "tiny-gemma3", "tiny-qwen3moe", "tiny-gptoss",
                                           "tiny-gemma4", "tiny-gemma4moe", "tiny-gemma4g"));

TEST(RowInvariance, Stories260K) {
  const std::string path = test::shared_data("models/stories260K.gguf");
  REQUIRE_FILE(path);
  auto backend = create_backend("cpu", {{"threads", "2"}});
  auto model = Model::load(path, *backend);
  expect_rows_invariant(*model, DType::F16, 3);
}

// The real default model and its weight types (Q4_K, Q6_K, Q8_0...). The
// name keeps it out of the ASan run with the other Gemma 3 270M tests.
TEST(TrainedModelVsItself, Gemma3_270M_RowInvariance) {
  const std::string path = test::default_model_path();
  if (path.empty()) GTEST_SKIP() << "default model not installed (run tools/setup.sh)";
  auto backend = create_backend("cpu", {{"threads", "2"}});
  auto model = Model::load(path, *backend);
  expect_rows_invariant(*model, DType::F16, 1000);
}

}  // namespace
}  // namespace pagellm
