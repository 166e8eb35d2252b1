#include "spec/spec_config.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "spec/adaptive.h"
#include "spec/ngram.h"
#include "spec/step_cost.h"

namespace pagellm {
namespace {

TEST(SpeculativeConfig, ParsesTheVllmForms) {
  EXPECT_FALSE(parse_speculative_config("").enabled());
  SpeculativeConfig c = parse_speculative_config(
      R"({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 5, "prompt_lookup_min": 3})");
  EXPECT_EQ(c.method, SpecMethod::Ngram);
  EXPECT_EQ(c.num_speculative_tokens, 4);
  EXPECT_EQ(c.prompt_lookup_min, 3);
  EXPECT_EQ(c.prompt_lookup_max, 5);
  EXPECT_TRUE(c.adaptive);
  // One bound sets both.
  c = parse_speculative_config(R"({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3})");
  EXPECT_EQ(c.prompt_lookup_min, 3);
  EXPECT_EQ(c.prompt_lookup_max, 3);
  // "model" alone means a draft model.
  c = parse_speculative_config(R"({"model": "/m/draft.gguf", "num_speculative_tokens": 3, "adaptive": false})");
  EXPECT_EQ(c.method, SpecMethod::DraftModel);
  EXPECT_EQ(c.model, "/m/draft.gguf");
  EXPECT_FALSE(c.adaptive);
  c = parse_speculative_config(
      R"({"method": "draft_model", "model": "d", "num_speculative_tokens": 1, "disable_by_batch_size": 8})");
  EXPECT_EQ(c.disable_by_batch_size, 8);
  EXPECT_NE(c.describe().find("draft"), std::string::npos);
}

TEST(SpeculativeConfig, RefusesWhatItCannotRun) {
  auto refused = [](const std::string& json, const std::string& words) {
    try {
      parse_speculative_config(json);
      ADD_FAILURE() << "accepted " << json;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  refused("{", "not valid JSON");
  refused("[1]", "JSON object");
  refused(R"({"num_speculative_tokens": 4})", "method");
  refused(R"({"method": "eagle", "num_speculative_tokens": 4})", "unknown method \"eagle\"");
  refused(R"({"method": "ngram"})", "num_speculative_tokens");
  refused(R"({"method": "ngram", "num_speculative_tokens": 0})", "num_speculative_tokens");
  refused(R"({"method": "ngram", "num_speculative_tokens": 17})", "[1, 16]");
  refused(R"({"method": "ngram", "num_speculative_tokens": "4"})", "integer");
  refused(R"({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 5, "prompt_lookup_max": 2})",
          "must not exceed");
  refused(R"({"method": "ngram", "num_speculative_tokens": 4, "model": "x"})", "takes no \"model\"");
  refused(R"({"method": "draft_model", "num_speculative_tokens": 4})", "needs \"model\"");
  refused(R"({"model": "d", "num_speculative_tokens": 4, "prompt_lookup_max": 2})", "is for method \"ngram\"");
  refused(R"({"method": "ngram", "num_speculative_tokens": 4, "speculative_token_tree": 1})",
          "unknown key \"speculative_token_tree\"");
}

std::vector<TokenId> ngram(std::vector<TokenId> tokens, int32_t min_n, int32_t max_n, int32_t k) {
  std::vector<TokenId> out;
  const int32_t n = ngram_propose(tokens, min_n, max_n, k, out);
  EXPECT_EQ(n, static_cast<int32_t>(out.size()));
  return out;
}

TEST(NgramPropose, TheLongestSuffixAtItsLatestOccurrence) {
  // Suffix "2 3" occurs at 1 and at 6; the latest (6) is followed by 9 9.
  EXPECT_EQ(ngram({1, 2, 3, 4, 5, 1, 2, 3, 9, 9, 2, 3}, 1, 3, 4), (std::vector<TokenId>{9, 9, 2, 3}));
  // The 3-gram "1 2 3" wins over the shorter, later "2 3".
  EXPECT_EQ(ngram({1, 2, 3, 4, 5, 7, 2, 3, 8, 1, 2, 3}, 1, 3, 2), (std::vector<TokenId>{4, 5}));
  // k caps the proposal; the end of the context caps it too.
  EXPECT_EQ(ngram({5, 6, 7, 8, 5, 6}, 2, 2, 1), (std::vector<TokenId>{7}));
  EXPECT_EQ(ngram({5, 6, 5, 6}, 2, 2, 4), (std::vector<TokenId>{5, 6}));
  // A periodic run continues itself.
  EXPECT_EQ(ngram({4, 4, 4}, 1, 2, 3), (std::vector<TokenId>{4}));
  // Nothing to match: no proposal; n below min_n does not count.
  EXPECT_TRUE(ngram({1, 2, 3, 4}, 1, 3, 4).empty());
  EXPECT_TRUE(ngram({1, 2, 9, 1, 2}, 3, 4, 4).empty());
  EXPECT_EQ(ngram({1, 2, 9, 1, 2}, 2, 4, 4), (std::vector<TokenId>{9, 1, 2}));
  EXPECT_TRUE(ngram({}, 1, 3, 4).empty());
  EXPECT_TRUE(ngram({1}, 1, 3, 4).empty());
  EXPECT_TRUE(ngram({1, 1, 1}, 1, 3, 0).empty());
}

TEST(AdaptiveSpeculation, PausesLongerWhileDraftsKeepFailing) {
  AdaptiveSpeculation a;
  EXPECT_TRUE(a.should_propose());
  a.record(4, 4);
  a.record(4, 3);
  EXPECT_FALSE(a.paused());
  // Rejections: a pause of kFirstPause steps, then twice as long.
  int paused_steps = 0;
  for (int round = 0; round < 3; ++round) {
    while (!a.paused()) a.record(4, 0);
    int n = 0;
    while (!a.should_propose()) ++n;
    EXPECT_EQ(n, AdaptiveSpeculation::kFirstPause << round);
    paused_steps += n;
  }
  EXPECT_EQ(paused_steps, 4 + 8 + 16);
  // One good verification resets the pause length.
  a.record(4, 4);
  while (!a.paused()) a.record(4, 0);
  int n = 0;
  while (!a.should_propose()) ++n;
  EXPECT_EQ(n, AdaptiveSpeculation::kFirstPause);
  a.record(0, 0);  // nothing proposed: no news
  EXPECT_FALSE(a.paused());
}

TEST(AdaptiveSpeculation, PerDraftAcceptanceCountsTheFirstRejection) {
  AdaptiveSpeculation a;
  EXPECT_NEAR(a.per_draft_acceptance(), 0.6, 1e-9);  // the prior
  // Drafts accepted 4 times out of 5 at each position: runs of 4 accepted, then a rejection.
  for (int i = 0; i < 200; ++i) a.record(8, 4);
  EXPECT_NEAR(a.per_draft_acceptance(), 0.8, 1e-6);
  for (int i = 0; i < 200; ++i) a.record(3, 3);  // all accepted: no failure counted
  EXPECT_GT(a.per_draft_acceptance(), 0.99);
}

TEST(StepCostModel, RecoversALinearCostFromMixedSteps) {
  StepCostModel m;
  const double fixed = 0.012, per_token = 0.0004, per_row = 0.003;
  EXPECT_FALSE(m.ready());
  for (int step = 0; step < 60; ++step) {
    // Decodes of 1..6 sequences, some with drafts, and now and then a prefill chunk.
    const int64_t rows = 1 + step % 6, tokens = rows + (step % 4) * 2 + (step % 9 == 0 ? 200 : 0);
    m.observe(tokens, rows, fixed + per_token * tokens + per_row * rows);
  }
  ASSERT_TRUE(m.ready());
  EXPECT_NEAR(m.fixed(), fixed, 1e-4);
  EXPECT_NEAR(m.per_draft(), per_token + per_row, 1e-5);
  EXPECT_NEAR(m.predict(10, 5), fixed + per_token * 10 + per_row * 5, 1e-4);
  m.observe(0, 0, 1.0);  // an empty step teaches nothing
  EXPECT_NEAR(m.fixed(), fixed, 1e-4);
}

}  // namespace
}  // namespace pagellm
