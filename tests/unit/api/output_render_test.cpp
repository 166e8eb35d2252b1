// The shared renderer of engine outputs: finish and stop reasons, logprobs
// with pieces and ranks, from hand-made outputs.
#include "api/output_render.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace pagellm::api {
namespace {

// Token id t stands for "<t>", except 7: half of "é".
std::string piece(int32_t t) { return t == 7 ? std::string("\xc3") : "<" + std::to_string(t) + ">"; }

TEST(OutputRender, FinishReasonNames) {
  EXPECT_EQ(finish_reason_name(FinishReason::None), nullptr);
  EXPECT_STREQ(finish_reason_name(FinishReason::Stop), "stop");
  EXPECT_STREQ(finish_reason_name(FinishReason::Length), "length");
  EXPECT_STREQ(finish_reason_name(FinishReason::Abort), "abort");
}

TEST(OutputRender, StopReasonPrefersTheStopString) {
  EXPECT_EQ(stop_reason("END", 5), StopReason(std::string("END")));
  EXPECT_EQ(stop_reason("", 5), StopReason(5));
  EXPECT_EQ(stop_reason("", 0), StopReason(0));  // token 0 is a token
  EXPECT_TRUE(std::holds_alternative<std::monostate>(stop_reason("", -1)));
}

TEST(OutputRender, LogprobsCarryPiecesAndRanks) {
  // Chosen 3 is second among the top; chosen 7 (a partial character) is not among them.
  const std::vector<TokenLogprob> lps = {{3, -0.7f, {{4, -0.5f}, {3, -0.7f}, {9, -3.0f}}}, {7, -4.0f, {{1, -0.1f}}}};
  const std::vector<PositionLogprobs> r = render_logprobs(lps, piece);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].chosen.token, 3);
  EXPECT_EQ(r[0].chosen.piece, "<3>");
  EXPECT_FLOAT_EQ(r[0].chosen.logprob, -0.7f);
  EXPECT_EQ(r[0].chosen.rank, 2);
  ASSERT_EQ(r[0].top.size(), 3u);
  EXPECT_EQ(r[0].top[0].token, 4);
  EXPECT_EQ(r[0].top[0].rank, 1);
  EXPECT_EQ(r[0].top[0].piece, "<4>");
  EXPECT_EQ(r[0].top[1].token, 3);  // the chosen token keeps its place among the top
  EXPECT_EQ(r[0].top[2].rank, 3);
  EXPECT_FLOAT_EQ(r[0].top[2].logprob, -3.0f);
  EXPECT_EQ(r[1].chosen.piece, "\xc3");  // raw bytes: each surface makes its own text
  EXPECT_EQ(r[1].chosen.rank, std::nullopt);
  EXPECT_EQ(r[1].top[0].rank, 1);
  EXPECT_TRUE(render_logprobs({}, piece).empty());
}

TEST(OutputRender, CompletionWhileRunningAndFinished) {
  CompletionDelta d;
  d.index = 1;
  d.text = "ab";
  d.token_ids = {3, 7};
  d.num_output_tokens = 5;
  d.stop_string = "x";  // ignored until the sample finishes
  CompletionData c = render_completion(d, piece);
  EXPECT_EQ(c.index, 1);
  EXPECT_EQ(c.text, "ab");
  EXPECT_EQ(c.token_ids, (std::vector<int32_t>{3, 7}));
  EXPECT_EQ(c.num_output_tokens, 5);
  EXPECT_EQ(c.finish_reason, nullptr);
  EXPECT_TRUE(std::holds_alternative<std::monostate>(c.stop_reason));
  EXPECT_FALSE(c.logprobs.has_value());  // none asked for: none, not an empty list
  EXPECT_EQ(c.logprob_sum, 0.0);

  d.finish_reason = FinishReason::Stop;
  d.stop_string.clear();
  d.stop_token = 2;
  d.logprobs = {{3, -0.5f, {}}, {7, -0.25f, {}}};
  c = render_completion(d, piece);
  EXPECT_STREQ(c.finish_reason, "stop");
  EXPECT_EQ(c.stop_reason, StopReason(2));
  ASSERT_TRUE(c.logprobs.has_value());
  EXPECT_EQ(c.logprobs->size(), 2u);
  EXPECT_DOUBLE_EQ(c.logprob_sum, -0.75);
}

TEST(OutputRender, WholeOutput) {
  RequestOutput out;
  out.request_id = "r1";
  out.finished = true;
  out.error = "boom";
  out.num_prompt_tokens = 4;
  out.num_cached_tokens = 2;
  out.queue_seconds = 0.5;
  out.ttft_seconds = 1.5;
  out.e2e_seconds = 2.5;
  out.completions.resize(2);
  out.completions[1].index = 1;
  out.completions[1].finish_reason = FinishReason::Length;
  const OutputData o = render_output(out, piece);
  EXPECT_EQ(o.request_id, "r1");
  EXPECT_TRUE(o.finished);
  EXPECT_EQ(o.error, "boom");
  EXPECT_EQ(o.num_prompt_tokens, 4);
  EXPECT_EQ(o.num_cached_tokens, 2);
  EXPECT_EQ(o.queue_seconds, 0.5);
  EXPECT_EQ(o.ttft_seconds, 1.5);
  EXPECT_EQ(o.e2e_seconds, 2.5);
  ASSERT_EQ(o.completions.size(), 2u);
  EXPECT_EQ(o.completions[0].finish_reason, nullptr);
  EXPECT_STREQ(o.completions[1].finish_reason, "length");
  EXPECT_TRUE(std::holds_alternative<std::monostate>(o.completions[1].stop_reason));
}

}  // namespace
}  // namespace pagellm::api
