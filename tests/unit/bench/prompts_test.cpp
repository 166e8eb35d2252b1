#include "bench/prompts.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "test_paths.h"
#include "tokenizer/tokenizer.h"

namespace pagellm::bench {
namespace {

TEST(BenchPrompts, TokenIdsSeededAndInRange) {
  const auto a = random_token_ids(500, 32000, 7);
  EXPECT_EQ(a, random_token_ids(500, 32000, 7));
  EXPECT_NE(a, random_token_ids(500, 32000, 8));
  for (int32_t id : a) {
    EXPECT_GE(id, first_random_token(32000));
    EXPECT_LT(id, 32000);
  }
  for (int32_t id : random_token_ids(200, 512, 1)) {
    EXPECT_GE(id, 256);
    EXPECT_LT(id, 512);
  }
  EXPECT_TRUE(random_token_ids(0, 100, 1).empty());
}

TEST(BenchPrompts, RngUnitInterval) {
  PromptRng rng(3);
  for (int i = 0; i < 10000; ++i) {
    const double u = rng.unit();
    ASSERT_GT(u, 0.0);
    ASSERT_LE(u, 1.0);
  }
}

TEST(BenchPrompts, TextWithoutTokenizerIsOneWordPerToken) {
  const std::string t = random_text(50, 1);
  EXPECT_EQ(std::count(t.begin(), t.end(), ' '), 49);
  EXPECT_EQ(t, random_text(50, 1));
  EXPECT_NE(t, random_text(50, 2));
}

TEST(BenchPrompts, TextWithTokenizerHasTheLength) {
  const std::string path = test::shared_data("tokenizer/ggml-vocab-llama-spm.gguf");
  REQUIRE_FILE(path);
  const auto tok = Tokenizer::load(path);
  for (int32_t n : {1, 17, 128}) {
    const std::string text = random_text(n, 5, tok.get());
    const auto ids = tok->encode(text, false, false);
    EXPECT_NEAR(static_cast<double>(ids.size()), n, 1) << text;
  }
}

}  // namespace
}  // namespace pagellm::bench
