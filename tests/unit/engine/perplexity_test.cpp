#include "runner/perplexity.h"

#include <gtest/gtest.h>

#include <random>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/engine_test_util.h"

namespace pagellm {
namespace {

EngineConfig tiny() {
  EngineConfig c = test::tiny_engine_config(128);
  c.scheduler.max_num_seqs = 2;
  return c;
}

std::vector<int32_t> random_tokens(size_t n, int32_t vocab) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> d(1, vocab - 1);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = d(rng);
  return t;
}

TEST(Perplexity, PiecesPerPassDoNotChangeTheResult) {
  Engine e(tiny());
  const auto tokens = random_tokens(300, e.model_config().n_vocab);
  PerplexityOptions o;
  o.ctx = 64;
  o.bos_id = 1;
  std::vector<PerplexityResult> results;
  for (int32_t batch : {1, 13, 128}) {
    o.batch = batch;
    results.push_back(compute_perplexity(e.model(), e.kv_config(), tokens, o));
  }
  // 4 chunks of 64, each scoring positions 32..62 (31 targets).
  EXPECT_EQ(results[0].tokens_scored, 4 * 31);
  EXPECT_EQ(results[0].running_ppl.size(), 4u);
  EXPECT_GT(results[0].ppl(), 1.0);
  for (const auto& r : results) {
    EXPECT_EQ(r.tokens_scored, results[0].tokens_scored);
    EXPECT_NEAR(r.ppl(), results[0].ppl(), 1e-4 * results[0].ppl());
  }
}

TEST(Perplexity, StridedWindowsScoreEveryTokenOnce) {
  Engine e(tiny());
  const auto tokens = random_tokens(200, e.model_config().n_vocab);
  PerplexityOptions o;
  o.ctx = 64;
  for (int32_t stride : {16, 50}) {
    o.stride = stride;
    const PerplexityResult r = compute_perplexity(e.model(), e.kv_config(), tokens, o);
    EXPECT_EQ(r.tokens_scored, 199) << stride;
    EXPECT_GT(r.ppl(), 1.0);
  }
  // Windows that do not overlap cannot score their own first token (no
  // context for it): windows at 0, 64, 128 and the last at 136 lose two.
  o.stride = 64;
  EXPECT_EQ(compute_perplexity(e.model(), e.kv_config(), tokens, o).tokens_scored, 197);
  // More context per scored token cannot be told apart by a random model, but
  // the full-window case equals one window over the first ctx tokens.
  o.stride = 64;
  const auto first = std::vector<int32_t>(tokens.begin(), tokens.begin() + 64);
  const PerplexityResult one = compute_perplexity(e.model(), e.kv_config(), first, o);
  EXPECT_EQ(one.tokens_scored, 63);
}

TEST(Perplexity, BadInputsAreErrors) {
  Engine e(tiny());
  const auto tokens = random_tokens(40, e.model_config().n_vocab);
  PerplexityOptions o;
  o.ctx = 64;
  EXPECT_THROW(compute_perplexity(e.model(), e.kv_config(), tokens, o), Error);  // shorter than one chunk
  o.stride = 65;
  EXPECT_THROW(compute_perplexity(e.model(), e.kv_config(), tokens, o), Error);
  o.stride = 0;
  o.ctx = 16;
  std::vector<int32_t> bad = tokens;
  bad[3] = 1 << 30;
  EXPECT_THROW(compute_perplexity(e.model(), e.kv_config(), bad, o), Error);
  EXPECT_NO_THROW(compute_perplexity(e.model(), e.kv_config(), tokens, o));
}

}  // namespace
}  // namespace pagellm
