// Reasoning parsers on realistic thinking-model outputs. Every case is also streamed in 1-byte and random-sized
// deltas (fixed seeds), which must give exactly what parse() gives.
#include "chat/reasoning_parser.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace pagellm::chat {
namespace {

ReasoningSplit stream_in(const ReasoningParser& parser, std::string_view text, bool prompt_ends_in_think,
                         const std::function<size_t()>& next_size) {
  std::unique_ptr<ReasoningStream> s = parser.stream(prompt_ends_in_think);
  ReasoningSplit merged;
  auto add = [&](const ReasoningSplit& r) {
    merged.reasoning += r.reasoning;
    merged.content += r.content;
  };
  for (size_t pos = 0; pos < text.size();) {
    const size_t n = std::min(next_size(), text.size() - pos);
    add(s->feed(text.substr(pos, n)));
    pos += n;
  }
  add(s->finish());
  return merged;
}

// parse() of `text`, after checking that streaming agrees with it.
ReasoningSplit split_checked(const std::string& parser_name, std::string_view text, bool prompt_ends_in_think) {
  std::unique_ptr<ReasoningParser> parser = make_reasoning_parser(parser_name);
  const ReasoningSplit whole = parser->parse(text, prompt_ends_in_think);
  auto expect_same = [&](const ReasoningSplit& streamed, const std::string& how) {
    EXPECT_EQ(streamed.reasoning, whole.reasoning) << parser_name << ", " << how << ", text: " << text;
    EXPECT_EQ(streamed.content, whole.content) << parser_name << ", " << how << ", text: " << text;
  };
  expect_same(stream_in(*parser, text, prompt_ends_in_think, [] { return size_t{1}; }), "1-byte deltas");
  for (uint32_t seed : {1u, 7u, 2024u}) {
    for (size_t max_size : {size_t{4}, size_t{30}}) {
      std::mt19937 rng(seed);
      std::uniform_int_distribution<size_t> size(1, max_size);
      expect_same(stream_in(*parser, text, prompt_ends_in_think, [&] { return size(rng); }),
                  "random deltas, seed " + std::to_string(seed) + ", up to " + std::to_string(max_size));
    }
  }
  return whole;
}

void expect_split(const std::string& parser_name, std::string_view text, bool prompt_ends_in_think,
                  const std::string& reasoning, const std::string& content) {
  const ReasoningSplit r = split_checked(parser_name, text, prompt_ends_in_think);
  EXPECT_EQ(r.reasoning, reasoning) << parser_name << " (prompt_ends_in_think " << prompt_ends_in_think
                                    << "): " << text;
  EXPECT_EQ(r.content, content) << parser_name << " (prompt_ends_in_think " << prompt_ends_in_think
                                << "): " << text;
}

TEST(ReasoningParser, NamesAndUnknownNameError) {
  EXPECT_EQ(reasoning_parser_names(), (std::vector<std::string>{"deepseek_r1", "qwen3"}));
  for (const std::string& name : reasoning_parser_names()) EXPECT_EQ(make_reasoning_parser(name)->name(), name);
  try {
    make_reasoning_parser("qwen2");
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'qwen2'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("deepseek_r1, qwen3"), std::string::npos) << msg;
  }
}

TEST(ReasoningParser, DeepSeekR1) {
  for (bool prompt_think : {false, true}) {  // R1 always thinks first: the flag changes nothing
    // The template opened <think>: only </think> is generated.
    expect_split("deepseek_r1", "Okay, 2 + 2 is 4.\n</think>\n\nThe answer is **4**.", prompt_think,
                 "Okay, 2 + 2 is 4.\n", "\n\nThe answer is **4**.");
    // The model opened it itself (older templates), after a newline.
    expect_split("deepseek_r1", "\n<think>\nHmm, let me think.\n</think>\n\nParis.", prompt_think,
                 "\nHmm, let me think.\n", "\n\nParis.");
    // Cut off before </think>: all reasoning.
    expect_split("deepseek_r1", "<think>\nStill thinking about 東京 and <thi", prompt_think,
                 "\nStill thinking about 東京 and <thi", "");
    expect_split("deepseek_r1", "Let me see... </thin", prompt_think, "Let me see... </thin", "");
    // Only the first </think> ends thinking; later tags are content.
    expect_split("deepseek_r1", "a</think>b</think><think>c", prompt_think, "a", "b</think><think>c");
    // A <think> that does not lead is kept as reasoning text.
    expect_split("deepseek_r1", "x <think> y</think>z", prompt_think, "x <think> y", "z");
    expect_split("deepseek_r1", "<think></think>", prompt_think, "", "");
    expect_split("deepseek_r1", "", prompt_think, "", "");
    expect_split("deepseek_r1", "  \n", prompt_think, "  \n", "");
    expect_split("deepseek_r1", "<thi", prompt_think, "<thi", "");
    expect_split("deepseek_r1", "<thinking>x</think>y", prompt_think, "<thinking>x", "y");
  }
}

TEST(ReasoningParser, Qwen3ThinkingOpenedByOutput) {
  for (bool prompt_think : {false, true}) {
    expect_split("qwen3", "<think>\nThe user wants a haiku.\n</think>\n\nAutumn moonlight...", prompt_think,
                 "\nThe user wants a haiku.\n", "\n\nAutumn moonlight...");
    // Cut off inside the thinking: reasoning (vLLM's current Qwen3 parser).
    expect_split("qwen3", "<think>\nStep 1: factor the \"polynomial\"", prompt_think,
                 "\nStep 1: factor the \"polynomial\"", "");
  }
}

TEST(ReasoningParser, Qwen3ThinkingOpenedByPrompt) {
  expect_split("qwen3", "Let me count: 1, 2, 3.\n</think>\n\nThree.", true, "Let me count: 1, 2, 3.\n",
               "\n\nThree.");
  // Cut off before </think>: all reasoning so far.
  expect_split("qwen3", "Considering café, 🙂 and </th", true, "Considering café, 🙂 and </th", "");
  expect_split("qwen3", "", true, "", "");
  expect_split("qwen3", "\n</think>\n\nHi!", true, "\n", "\n\nHi!");
}

TEST(ReasoningParser, Qwen3WithoutThinkingIsContent) {
  // No <think> from the prompt or the output (enable_thinking=False, instruct models): all content, </think>
  // included.
  expect_split("qwen3", "Hello! How can I help you today?", false, "", "Hello! How can I help you today?");
  expect_split("qwen3", "stray text</think>more", false, "", "stray text</think>more");
  expect_split("qwen3", "Use the <think> tag like this.", false, "", "Use the <think> tag like this.");
  expect_split("qwen3", "<thin", false, "", "<thin");
  expect_split("qwen3", "<thinking>", false, "", "<thinking>");
  expect_split("qwen3", "\n\n", false, "", "\n\n");
  expect_split("qwen3", "", false, "", "");
}

TEST(ReasoningParser, StreamingHoldsOnlyPartialTags) {
  std::unique_ptr<ReasoningStream> s = make_reasoning_parser("qwen3")->stream(true);
  ReasoningSplit r = s->feed("I think </th");
  EXPECT_EQ(r.reasoning, "I think ");
  r = s->feed("ink>\n\nDone");
  EXPECT_EQ(r.reasoning, "");
  EXPECT_EQ(r.content, "\n\nDone");
  r = s->finish();
  EXPECT_EQ(r.reasoning + r.content, "");

  s = make_reasoning_parser("qwen3")->stream(false);
  r = s->feed("  <th");
  EXPECT_EQ(r.reasoning + r.content, "");  // may still open thinking
  r = s->feed("ere");
  EXPECT_EQ(r.content, "  <there");
}

// Streaming stays linear: long outputs in 1-byte deltas (thinking, whitespace before a possible <think>, content).
TEST(ReasoningParser, LongOutputsStreamInLinearTime) {
  const std::string long_text(1 << 19, 'x');
  const std::string long_space(1 << 19, '\n');
  struct Case {
    std::string parser;
    std::string text;
    bool prompt_ends_in_think;
  };
  const std::vector<Case> cases = {
      {"deepseek_r1", "<think>" + long_text + "</think>" + long_text, false},
      {"qwen3", long_space + "<think>" + long_text, false},
      {"qwen3", long_text + "</thi", true},
      {"qwen3", long_text, false},
  };
  for (const Case& c : cases) {
    const auto t0 = std::chrono::steady_clock::now();
    const ReasoningSplit r =
        stream_in(*make_reasoning_parser(c.parser), c.text, c.prompt_ends_in_think, [] { return size_t{1}; });
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(seconds, 10.0) << c.parser;
    EXPECT_GE(r.reasoning.size() + r.content.size(), long_text.size()) << c.parser;
  }
}

}  // namespace
}  // namespace pagellm::chat
