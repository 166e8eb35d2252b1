// Response JSON and SSE chunk shapes from hand-made engine outputs.
#include "server/openai_response.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace pagellm::server {
namespace {

using nlohmann::json;

// Token id t stands for "<t>", except 7 (half of "é") and 8 (the other half).
std::string piece(int32_t t) {
  if (t == 7) return "\xc3";
  if (t == 8) return "\xa9";
  return "<" + std::to_string(t) + ">";
}

CompletionDelta delta(int32_t index, std::string text, std::vector<int32_t> ids, FinishReason f = FinishReason::None) {
  CompletionDelta d;
  d.index = index;
  d.text = std::move(text);
  d.token_ids = std::move(ids);
  d.finish_reason = f;
  return d;
}

RequestOutput output(std::vector<CompletionDelta> deltas, bool finished, int32_t prompt_tokens = 5,
                     int32_t cached = 0) {
  RequestOutput o;
  o.completions = std::move(deltas);
  o.finished = finished;
  o.num_prompt_tokens = prompt_tokens;
  o.num_cached_tokens = cached;
  return o;
}

// The JSON payloads of an SSE text ("data: {...}\n\n" ...), [DONE] as the string "[DONE]".
std::vector<json> events(const std::string& sse) {
  std::vector<json> out;
  size_t pos = 0;
  while (pos < sse.size()) {
    EXPECT_EQ(sse.compare(pos, 6, "data: "), 0) << sse.substr(pos);
    const size_t end = sse.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos);
    const std::string payload = sse.substr(pos + 6, end - pos - 6);
    out.push_back(payload == "[DONE]" ? json("[DONE]") : json::parse(payload));
    pos = end + 2;
  }
  return out;
}

TEST(ServerResponse, CompletionCollectorShape) {
  ResponseCollector c({"cmpl-1", 1700000000, "m", false}, 2, 2, false, {"P0", ""});
  c.add(0, output({delta(0, "a", {10}), delta(1, "b", {11})}, false, 5, 2));
  c.add(1, output({delta(0, "c", {12}, FinishReason::Length), delta(1, "", {13}, FinishReason::Stop)}, true, 3));
  RequestOutput last =
      output({delta(0, "x", {14}, FinishReason::Stop), delta(1, "y", {15}, FinishReason::Stop)}, true, 5, 2);
  last.completions[0].stop_string = "STOP";
  last.completions[1].stop_token = 42;
  c.add(0, last);
  const json j = c.render(piece);
  EXPECT_EQ(j["id"], "cmpl-1");
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["created"], 1700000000);
  EXPECT_EQ(j["model"], "m");
  ASSERT_EQ(j["choices"].size(), 4u);
  const json& ch = j["choices"];
  EXPECT_EQ(
      ch[0],
      json(
          {{"index", 0}, {"text", "P0ax"}, {"logprobs", nullptr}, {"finish_reason", "stop"}, {"stop_reason", "STOP"}}));
  EXPECT_EQ(ch[1]["text"], "P0by");
  EXPECT_EQ(ch[1]["stop_reason"], 42);
  EXPECT_EQ(ch[2]["index"], 2);
  EXPECT_EQ(ch[2]["text"], "c");
  EXPECT_EQ(ch[2]["finish_reason"], "length");
  EXPECT_EQ(ch[2]["stop_reason"], nullptr);
  EXPECT_EQ(ch[3]["finish_reason"], "stop");
  // Prompt tokens count each prompt once; completion tokens count every token.
  EXPECT_EQ(j["usage"], json({{"prompt_tokens", 8},
                              {"completion_tokens", 6},
                              {"total_tokens", 14},
                              {"prompt_tokens_details", {{"cached_tokens", 2}}}}));
}

TEST(ServerResponse, ChatCollectorShapeWithLogprobs) {
  ResponseCollector c({"chatcmpl-1", 1, "m", true}, 1, 1, true);
  CompletionDelta d = delta(0, "\xc3\xa9!", {7, 8, 9}, FinishReason::Stop);
  d.logprobs = {{7, -0.5f, {{7, -0.5f}, {1, -1.5f}}}, {8, -0.25f, {{8, -0.25f}, {2, -2.0f}}}, {9, -1.0f, {}}};
  c.add(0, output({d}, true));
  const json j = c.render(piece);
  EXPECT_EQ(j["object"], "chat.completion");
  const json& choice = j["choices"][0];
  EXPECT_EQ(choice["message"], json({{"role", "assistant"}, {"content", "\xc3\xa9!"}, {"refusal", nullptr}}));
  EXPECT_EQ(choice["finish_reason"], "stop");
  const json& content = choice["logprobs"]["content"];
  ASSERT_EQ(content.size(), 3u);
  // A token holding half a character: its text is U+FFFD, its bytes are exact.
  EXPECT_EQ(content[0]["token"], "\xef\xbf\xbd");
  EXPECT_EQ(content[0]["bytes"], json({0xc3}));
  EXPECT_FLOAT_EQ(content[0]["logprob"].get<float>(), -0.5f);
  EXPECT_EQ(content[0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(content[0]["top_logprobs"][1], json({{"token", "<1>"}, {"logprob", -1.5}, {"bytes", {60, 49, 62}}}));
  EXPECT_EQ(content[2]["top_logprobs"], json::array());
  EXPECT_EQ(choice["logprobs"]["refusal"], nullptr);
}

TEST(ServerResponse, CompletionLogprobs) {
  const std::vector<TokenLogprob> lps = {{3, -0.1f, {{3, -0.1f}, {4, -2.0f}}}, {5, -3.0f, {{6, -1.0f}}}};
  const json j = completion_logprobs_json(api::render_logprobs(lps, piece), 10);
  EXPECT_EQ(j["tokens"], json({"<3>", "<5>"}));
  EXPECT_EQ(j["text_offset"], json({10, 13}));
  EXPECT_EQ(j["token_logprobs"].size(), 2u);
  EXPECT_EQ(j["top_logprobs"][0].size(), 2u);
  // The chosen token is always in its top_logprobs dict.
  EXPECT_EQ(j["top_logprobs"][1].size(), 2u);
  EXPECT_FLOAT_EQ(j["top_logprobs"][1]["<5>"].get<float>(), -3.0f);
  EXPECT_FLOAT_EQ(j["top_logprobs"][1]["<6>"].get<float>(), -1.0f);
}

TEST(ServerResponse, ChatStream) {
  StreamRenderer s({"chatcmpl-2", 5, "m", true}, 1, 2, false, true, {}, piece);
  auto begin = events(s.begin());
  ASSERT_EQ(begin.size(), 2u);  // the role, for each choice
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(begin[i]["object"], "chat.completion.chunk");
    EXPECT_EQ(begin[i]["id"], "chatcmpl-2");
    EXPECT_EQ(begin[i]["usage"], nullptr);
    EXPECT_EQ(begin[i]["choices"][0]["index"], i);
    EXPECT_EQ(begin[i]["choices"][0]["delta"], json({{"role", "assistant"}, {"content", ""}}));
    EXPECT_EQ(begin[i]["choices"][0]["finish_reason"], nullptr);
  }
  // A step whose text is held back (a possible stop string) sends nothing.
  EXPECT_EQ(s.add(0, output({delta(0, "", {10}), delta(1, "", {11})}, false)), "");
  auto mid = events(s.add(0, output({delta(0, "Hel", {12})}, false)));
  ASSERT_EQ(mid.size(), 1u);
  EXPECT_EQ(mid[0]["choices"][0]["delta"], json({{"content", "Hel"}}));
  auto fin = events(
      s.add(0, output({delta(0, "lo", {13}, FinishReason::Length), delta(1, "", {}, FinishReason::Stop)}, true)));
  ASSERT_EQ(fin.size(), 2u);
  EXPECT_EQ(fin[0]["choices"][0]["delta"], json({{"content", "lo"}}));
  EXPECT_EQ(fin[0]["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(fin[1]["choices"][0]["index"], 1);
  EXPECT_EQ(fin[1]["choices"][0]["delta"], json::object());
  EXPECT_EQ(fin[1]["choices"][0]["finish_reason"], "stop");
  auto end = events(s.end());
  ASSERT_EQ(end.size(), 2u);
  EXPECT_EQ(end[0]["choices"], json::array());
  EXPECT_EQ(end[0]["usage"]["completion_tokens"], 4);
  EXPECT_EQ(end[0]["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(end[1], "[DONE]");
}

TEST(ServerResponse, CompletionStreamWithEchoAndLogprobs) {
  StreamRenderer s({"cmpl-3", 5, "m", false}, 2, 1, true, false, {"Hi", ""}, piece);
  auto begin = events(s.begin());
  ASSERT_EQ(begin.size(), 1u);  // only prompt 0 has echo text
  EXPECT_EQ(begin[0]["choices"][0]["text"], "Hi");
  EXPECT_FALSE(begin[0].contains("usage"));  // no include_usage: no usage key
  CompletionDelta d = delta(0, "<3>", {3});
  d.logprobs = {{3, -0.1f, {}}};
  auto e = events(s.add(0, output({d}, false)));
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0]["object"], "text_completion");
  EXPECT_EQ(e[0]["choices"][0]["text"], "<3>");
  EXPECT_EQ(e[0]["choices"][0]["logprobs"]["text_offset"], json({2}));  // after the echoed "Hi"
  d = delta(0, "<4>", {4}, FinishReason::Stop);
  d.logprobs = {{4, -0.2f, {}}};
  d.stop_string = "\n";
  e = events(s.add(1, output({d}, true)));
  EXPECT_EQ(e[0]["choices"][0]["index"], 1);
  EXPECT_EQ(e[0]["choices"][0]["logprobs"]["text_offset"], json({0}));
  EXPECT_EQ(e[0]["choices"][0]["stop_reason"], "\n");
  EXPECT_EQ(events(s.end()), std::vector<json>{"[DONE]"});
  EXPECT_EQ(events(s.error(json{{"error", {{"message", "x"}}}}))[0]["error"]["message"], "x");
}

// Prompt [1, 2, 3]: tokens 2 and 3 scored (token 3 was not the most likely).
std::vector<TokenLogprob> prompt_scores() {
  return {{2, -0.5f, {{2, -0.5f}, {9, -1.5f}}, 1}, {3, -2.0f, {{4, -0.25f}, {5, -1.75f}}, 3}};
}

TEST(ServerResponse, PromptLogprobsInVllmShape) {
  const json j = prompt_logprobs_json(prompt_scores(), 1, piece);
  ASSERT_EQ(j.size(), 3u);
  EXPECT_EQ(j[0], nullptr);
  EXPECT_EQ(j[1], json({{"2", {{"logprob", -0.5}, {"rank", 1}, {"decoded_token", "<2>"}}}}));
  // The token itself with its rank, and the top 1 (of the 2 computed).
  EXPECT_EQ(j[2], json({{"3", {{"logprob", -2.0}, {"rank", 3}, {"decoded_token", "<3>"}}},
                        {"4", {{"logprob", -0.25}, {"rank", 1}, {"decoded_token", "<4>"}}}}));
  EXPECT_EQ(prompt_logprobs_json({}, 2, piece), json::array({nullptr}));  // a one-token prompt
}

TEST(ServerResponse, EchoLogprobsCoverPromptThenCompletion) {
  const json j = echo_logprobs_json(1, prompt_scores(), {{6, -0.1f, {{6, -0.1f}}}}, 1, piece);
  EXPECT_EQ(j["tokens"], json({"<1>", "<2>", "<3>", "<6>"}));
  EXPECT_EQ(j["token_logprobs"], json({nullptr, -0.5, -2.0, -0.1f}));
  EXPECT_EQ(j["top_logprobs"][0], nullptr);
  EXPECT_EQ(j["top_logprobs"][1], json({{"<2>", -0.5}}));
  EXPECT_EQ(j["top_logprobs"][2], json({{"<4>", -0.25}, {"<3>", -2.0}}));  // top 1 plus the token itself
  EXPECT_EQ(j["text_offset"], json({0, 3, 6, 9}));

  // Through the collector: prompt_only (max_tokens 0) shows the prompt alone;
  // prompt_logprobs go on each choice.
  PromptLogprobsView view;
  view.prompt_logprobs = 2;
  view.echo_top = 1;
  view.first_tokens = {1};
  ResponseCollector c({"cmpl-9", 1, "m", false}, 1, 1, true, {"P"}, {}, view);
  RequestOutput o = output({delta(0, "", {}, FinishReason::Length)}, true, 3);
  o.prompt_logprobs = prompt_scores();
  c.add(0, o);
  const json r = c.render(piece);
  const json& choice = r["choices"][0];
  EXPECT_EQ(choice["text"], "P");
  EXPECT_EQ(choice["logprobs"]["tokens"], json({"<1>", "<2>", "<3>"}));
  EXPECT_EQ(choice["prompt_logprobs"].size(), 3u);
  EXPECT_EQ(choice["prompt_logprobs"][2].size(), 3u);  // token 3, and the top 2: 4, 5
  EXPECT_EQ(r["usage"]["completion_tokens"], 0);

  // Chat: vLLM puts them at the top of the reply.
  PromptLogprobsView chat_view;
  chat_view.prompt_logprobs = 0;
  chat_view.first_tokens = {1};
  ResponseCollector chat({"chatcmpl-1", 1, "m", true}, 1, 1, false, {}, {}, chat_view);
  chat.add(0, o);
  const json cr = chat.render(piece);
  EXPECT_EQ(cr["prompt_logprobs"].size(), 3u);
  EXPECT_EQ(cr["prompt_logprobs"][1].size(), 1u);
  EXPECT_FALSE(cr["choices"][0].contains("prompt_logprobs"));
}

TEST(ServerResponse, StreamedPromptLogprobs) {
  PromptLogprobsView view;
  view.prompt_logprobs = 1;
  view.echo_top = 1;
  view.first_tokens = {1};
  StreamRenderer s({"cmpl-4", 5, "m", false}, 1, 1, true, false, {"P"}, piece, {}, view);
  EXPECT_EQ(s.begin(), "");  // the echo waits for its logprobs
  CompletionDelta d = delta(0, "<6>", {6});
  d.logprobs = {{6, -0.1f, {{6, -0.1f}}}};
  RequestOutput o = output({d}, false, 3);
  o.prompt_logprobs = prompt_scores();
  auto e = events(s.add(0, o));
  ASSERT_EQ(e.size(), 1u);
  const json& first = e[0]["choices"][0];
  EXPECT_EQ(first["text"], "P<6>");
  EXPECT_EQ(first["logprobs"]["tokens"], json({"<1>", "<2>", "<3>", "<6>"}));
  EXPECT_EQ(first["logprobs"]["token_logprobs"][0], nullptr);
  EXPECT_EQ(first["prompt_logprobs"].size(), 3u);
  d = delta(0, "<7>", {10}, FinishReason::Length);
  d.logprobs = {{10, -0.3f, {{10, -0.3f}}}};
  e = events(s.add(0, output({d}, true, 3)));
  const json& next = e[0]["choices"][0];
  EXPECT_FALSE(next.contains("prompt_logprobs"));
  EXPECT_EQ(next["logprobs"]["text_offset"], json({12}));  // after "<1><2><3><6>"

  // Chat: on the reply's first chunk after the prompt, at the top.
  PromptLogprobsView chat_view;
  chat_view.prompt_logprobs = 0;
  chat_view.first_tokens = {1};
  StreamRenderer c({"chatcmpl-2", 5, "m", true}, 1, 1, false, false, {}, piece, {}, chat_view);
  c.begin();
  RequestOutput co = output({delta(0, "Hi", {11})}, false, 3);
  co.prompt_logprobs = prompt_scores();
  e = events(c.add(0, co));
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0]["prompt_logprobs"].size(), 3u);
  EXPECT_FALSE(events(c.add(0, output({delta(0, "!", {12})}, false, 3)))[0].contains("prompt_logprobs"));
}

TEST(ServerResponse, SseNeverThrowsOnBadUtf8) {
  EXPECT_EQ(sse_event(json{{"t", "a\xff"}}), "data: {\"t\":\"a\xef\xbf\xbd\"}\n\n");
  EXPECT_EQ(finish_reason_json(FinishReason::Abort), "abort");
  EXPECT_EQ(finish_reason_json(FinishReason::None), nullptr);
  EXPECT_EQ(stop_reason_json(api::StopReason{}), nullptr);
  EXPECT_EQ(stop_reason_json(api::stop_reason("END", 3)), "END");
  EXPECT_EQ(stop_reason_json(api::stop_reason("", 3)), 3);
}

}  // namespace
}  // namespace pagellm::server
