// ChatOutputStream: the reasoning split, then the tool handling of each
// tool_choice; streamed in pieces it gives what the whole text gives.
#include "chat/chat_output.h"

#include <gtest/gtest.h>

namespace pagellm::chat {
namespace {

ChatDelta run(const ChatOutputOptions& o, const std::string& text, size_t piece) {
  ChatOutputStream s(o);
  ChatDelta all;
  for (size_t i = 0; i < text.size(); i += piece) all.append(s.feed(std::string_view(text).substr(i, piece)));
  all.append(s.finish());
  EXPECT_EQ(s.num_calls(), all.calls.size());
  return all;
}

void expect_same_in_pieces(const ChatOutputOptions& o, const std::string& text) {
  const ChatDelta whole = run(o, text, text.size() + 1);
  for (size_t piece : {1, 3, 7}) {
    const ChatDelta p = run(o, text, piece);
    EXPECT_EQ(p.reasoning, whole.reasoning) << piece;
    EXPECT_EQ(p.content, whole.content) << piece;
    ASSERT_EQ(p.calls.size(), whole.calls.size()) << piece;
    for (size_t i = 0; i < p.calls.size(); ++i) {
      EXPECT_EQ(p.calls[i].name, whole.calls[i].name);
      EXPECT_EQ(p.calls[i].arguments, whole.calls[i].arguments);
    }
  }
}

TEST(ChatOutput, PlainTextPassesThrough) {
  const ChatDelta d = run({}, "Hello <tool_call>{}</tool_call> world", 4);
  EXPECT_EQ(d.content, "Hello <tool_call>{}</tool_call> world");
  EXPECT_TRUE(d.calls.empty());
}

TEST(ChatOutput, ReasoningThenHermesCalls) {
  auto reasoning = make_reasoning_parser("deepseek_r1");
  auto hermes = make_tool_parser("hermes");
  ChatOutputOptions o;
  o.reasoning = reasoning.get();
  o.prompt_ends_in_think = true;
  o.tools = ToolMode::Auto;
  o.tool_parser = hermes.get();
  const std::string text =
      "The user wants weather.\n</think>\n\nChecking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
      "{\"city\": \"Paris\"}}\n</tool_call>";
  const ChatDelta d = run(o, text, 5);
  EXPECT_EQ(d.reasoning, "The user wants weather.\n");
  EXPECT_NE(d.content.find("Checking."), std::string::npos);
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_EQ(d.calls[0].name, "get_weather");
  EXPECT_EQ(d.calls[0].arguments, R"({"city":"Paris"})");
  expect_same_in_pieces(o, text);
}

TEST(ChatOutput, NamedAndRequiredChoices) {
  ChatOutputOptions named;
  named.tools = ToolMode::Named;
  named.named_function = "get_time";
  const ChatDelta n = run(named, R"({"zone": "UTC"})", 2);
  EXPECT_TRUE(n.content.empty());
  ASSERT_EQ(n.calls.size(), 1u);
  EXPECT_EQ(n.calls[0].name, "get_time");
  EXPECT_EQ(n.calls[0].arguments, R"({"zone": "UTC"})");

  ChatOutputOptions required;
  required.tools = ToolMode::Required;
  const std::string list = R"([{"name": "a", "parameters": {"x": 1}}, {"name": "b", "parameters": {}}])";
  const ChatDelta r = run(required, list, 3);
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "a");
  EXPECT_EQ(r.calls[0].arguments, R"({"x":1})");
  EXPECT_EQ(r.calls[1].arguments, "{}");
  expect_same_in_pieces(required, list);
  // Cut off by max_tokens: the text stays content.
  const ChatDelta cut = run(required, R"([{"name": "a", "param)", 3);
  EXPECT_TRUE(cut.calls.empty());
  EXPECT_EQ(cut.content, R"([{"name": "a", "param)");
}

TEST(ChatOutput, PromptEndsInThink) {
  EXPECT_TRUE(prompt_ends_in_think("<|Assistant|><think>\n"));
  EXPECT_TRUE(prompt_ends_in_think("<think>"));
  EXPECT_FALSE(prompt_ends_in_think("<think>\n</think>\n\n"));
  EXPECT_FALSE(prompt_ends_in_think(""));
}

}  // namespace
}  // namespace pagellm::chat
