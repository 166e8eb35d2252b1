// ChatTemplate API, error reporting, hostile templates and concurrency.
// Rendering semantics themselves are checked against jinja2 in fixture_test.cpp.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "chat/chat_template.h"
#include "chat/jinja/lexer.h"
#include "chat/jinja/value.h"
#include "test_paths.h"

namespace pagellm {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string render(const std::string& src, const json& ctx = json::object(), const ChatRenderOptions& o = {}) {
  return ChatTemplate(src).render(ctx, o);
}

// Runs `fn`, expects a RenderError of `py_type`, returns its message.
template <class Fn>
std::string expect_render_error(Fn&& fn, const std::string& py_type) {
  try {
    fn();
  } catch (const jinja::RenderError& e) {
    EXPECT_EQ(e.py_type(), py_type) << e.what();
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception: " << e.what();
    return {};
  }
  ADD_FAILURE() << "no exception, expected " << py_type;
  return {};
}

TEST(ChatTemplate, RendersMessages) {
  const ChatTemplate t("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
                       "{% if add_generation_prompt %}<assistant>{% endif %}");
  const json messages = json::array({{{"role", "user"}, {"content", "hi"}}});
  EXPECT_EQ(apply_chat_template(t, messages, true, "<s>", "</s>"), "<user>hi<assistant>");
  EXPECT_EQ(apply_chat_template(t, messages, false, "<s>", "</s>"), "<user>hi");
}

TEST(ChatTemplate, ApplyChatTemplateContextLikeTransformers) {
  // transformers passes tools=None and documents=None when the caller gives none.
  const ChatTemplate t("[{{ bos_token }}|{{ eos_token }}|{{ tools is none }}|{{ documents is none }}|{{ x }}]");
  EXPECT_EQ(apply_chat_template(t, json::array(), true, "<s>", "</s>"), "[<s>|</s>|True|True|]");
  const json extra = {{"tools", json::array({1})}, {"x", "y"}, {"bos_token", "B"}};
  EXPECT_EQ(apply_chat_template(t, json::array(), true, "<s>", "</s>", extra), "[B|</s>|False|True|y]");
  EXPECT_THROW(apply_chat_template(t, json::object(), true, "", ""), Error);
}

TEST(ChatTemplate, OrderedJsonKeepsKeyOrder) {
  // Python dicts keep insertion order; nlohmann::json sorts keys, ordered_json does not.
  const ChatTemplate t("{{ d|tojson }}");
  const auto ordered = ordered_json::parse(R"({"d": {"zeta": 1, "alpha": 2}})");
  EXPECT_EQ(t.render(ordered), R"({"zeta": 1, "alpha": 2})");
  EXPECT_EQ(t.render(json::parse(R"({"d": {"zeta": 1, "alpha": 2}})")), R"({"alpha": 2, "zeta": 1})");
}

TEST(ChatTemplate, OrderedMessagesKeepOrderThroughApply) {
  const ChatTemplate t("{{ messages[0].tool_calls[0].function.arguments|tojson }}");
  const auto messages = ordered_json::parse(
      R"([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {"z": 1, "a": 2}}}]}])");
  EXPECT_EQ(apply_chat_template(t, messages, false, "", ""), R"({"z": 1, "a": 2})");
}

TEST(ChatTemplate, ContextMustBeAnObject) {
  const ChatTemplate t("x");
  EXPECT_THROW(t.render(json::array()), Error);
  EXPECT_EQ(t.render(json::object()), "x");
}

TEST(ChatTemplate, ContentPartsPassThrough) {
  const ChatTemplate t("{% for p in messages[0].content %}{{ p.type }}:{{ p.text }};{% endfor %}");
  const json messages = json::parse(R"([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image"}]}])");
  EXPECT_EQ(apply_chat_template(t, messages, false, "", ""), "text:a;image:;");
}

TEST(ChatTemplate, CopiesShareTheParsedTemplate) {
  const ChatTemplate a("{{ 1 + 1 }}");
  const ChatTemplate b = a;
  EXPECT_EQ(b.render(json::object()), "2");
  EXPECT_EQ(b.source(), "{{ 1 + 1 }}");
}

// ---- errors -------------------------------------------------------------------

TEST(ChatTemplateErrors, SyntaxErrorNamesLineAndColumn) {
  try {
    ChatTemplate t("line one\n  {{ 1 + }}");
    FAIL() << "parsed";
  } catch (const jinja::SyntaxError& e) {
    EXPECT_EQ(e.line(), 2);
    EXPECT_EQ(e.col(), 10);  // the "}}" that ends the expression early
    EXPECT_NE(std::string(e.what()).find("line 2, column 10"), std::string::npos) << e.what();
  }
  try {
    ChatTemplate t("a\nb\n{% for x in y %}\n{{ x }}");
    FAIL() << "parsed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("endfor"), std::string::npos) << e.what();
  }
}

TEST(ChatTemplateErrors, RaiseExceptionIsTemplateErrorWithExactMessage) {
  const ChatTemplate t("{% if messages|length > 1 %}{{ raise_exception('Only one message, got ' ~ messages|length) }}{% endif %}ok");
  try {
    apply_chat_template(t, json::array({1, 2}), true, "", "");
    FAIL() << "rendered";
  } catch (const TemplateError& e) {
    EXPECT_STREQ(e.what(), "Only one message, got 2");
  }
  EXPECT_EQ(apply_chat_template(t, json::array({1}), true, "", ""), "ok");
  // A TemplateError is a pagellm::Error (HTTP 400 at the server); other render errors are not TemplateErrors.
  EXPECT_THROW(render("{{ raise_exception('x') }}"), Error);
  try {
    render("{{ x.y }}");
    FAIL();
  } catch (const TemplateError&) {
    FAIL() << "undefined variable reported as TemplateError";
  } catch (const Error&) {
  }
}

TEST(ChatTemplateErrors, RenderErrorNamesTemplateLine) {
  const std::string msg = expect_render_error([] { render("a\n\n{{ messages[0].content + 1 }}", {{"messages", json::array({{{"content", "x"}}})}}); },
                                              "TypeError");
  EXPECT_NE(msg.find("line 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("can only concatenate str"), std::string::npos) << msg;
}

// ---- hostile templates ----------------------------------------------------------

TEST(ChatTemplateLimits, HugeNestedLoopStopsQuickly) {
  const auto t0 = Clock::now();
  const std::string msg = expect_render_error(
      [] { render("{% for i in range(100000) %}{% for j in range(100000) %}{{ j }}{% endfor %}{% endfor %}"); },
      "ResourceLimitError");
  EXPECT_LT(seconds_since(t0), 10.0);  // generous: sanitizer builds are ~10x slower
  EXPECT_NE(msg.find("loop iterations exceed the limit of 1000000"), std::string::npos) << msg;
}

TEST(ChatTemplateLimits, RangeIsCappedLikeTheSandbox) {
  expect_render_error([] { render("{% for i in range(1000000000) %}{% endfor %}"); }, "OverflowError");
}

TEST(ChatTemplateLimits, DeepRecursionStopsQuickly) {
  const auto t0 = Clock::now();
  expect_render_error([] { render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"); }, "RecursionError");
  expect_render_error([] { render("{% for x in [[1]] recursive %}{{ loop([x]) }}{% endfor %}"); }, "RecursionError");
  EXPECT_LT(seconds_since(t0), 10.0);  // generous: sanitizer builds are ~10x slower
}

TEST(ChatTemplateLimits, OutputAndStringSizeAreBounded) {
  ChatRenderOptions o;
  o.limits.max_string_bytes = 1 << 20;
  expect_render_error([&] { render("{% set s = 'x' * 1000 %}{% for i in range(5000) %}{{ s }}{% endfor %}", json::object(), o); },
                      "ResourceLimitError");
  // Refused before allocating, with the default limits too.
  expect_render_error([] { render("{{ 'x' * 1000000000000 }}"); }, "ResourceLimitError");
  expect_render_error([&] { render("{% set s = 'xy' * 200000 %}{{ (s ~ s ~ s ~ s)|length }}", json::object(), o); },
                      "ResourceLimitError");
}

TEST(ChatTemplateLimits, HugeWidthsAndGrowthAreRefusedBeforeAllocating) {
  for (const char* src : {"{{ 'a'|indent(10000000000) }}", "{{ [1]|tojson(indent=100000000000) }}",
                          "{{ 'a'|center(100000000000) }}", "{{ '%100000000000s' % 'a' }}", "{{ '{:>99999999999}'.format('a') }}",
                          "{{ ('a' * 1000000).replace('a', 'bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb') }}",
                          "{{ [1]|batch(100000000000, 0)|list }}", "{{ [1]|slice(100000000000)|list }}"}) {
    SCOPED_TRACE(src);
    expect_render_error([&] { render(src); }, "ResourceLimitError");
  }
  // One big string referenced a million times: printing it must stop at the limit.
  ChatRenderOptions o;
  o.limits.max_string_bytes = 1 << 20;
  expect_render_error([&] { render("{% set s = 'x' * 100000 %}{{ [s] * 100000 }}", json::object(), o); }, "ResourceLimitError");
  expect_render_error([&] { render("{% set s = 'x' * 100000 %}{{ ([s] * 100000)|tojson }}", json::object(), o); },
                      "ResourceLimitError");
  o.limits.max_items = 1000;
  expect_render_error([&] { render("{% for c in 'x' * 5000 %}{% endfor %}", json::object(), o); }, "ResourceLimitError");
}

TEST(ChatTemplateLimits, ListGrowthIsBounded) {
  expect_render_error(
      [] { render("{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}{% endfor %}"); },
      "ResourceLimitError");
  expect_render_error([] { render("{{ ([0] * 100000000)|length }}"); }, "ResourceLimitError");
}

TEST(ChatTemplateLimits, DeeplyNestedValuesAreRefused) {
  expect_render_error(
      [] { render("{% set ns = namespace(v=[]) %}{% for i in range(5000) %}{% set ns.v = [ns.v] %}{% endfor %}{{ ns.v }}"); },
      "RecursionError");
  json deep = json::array();
  for (int i = 0; i < 5000; ++i) {
    json outer = json::array();
    outer.push_back(std::move(deep));
    deep = std::move(outer);
  }
  // Moved, not copied: a copy recurses once per level in this file's code,
  // which the sanitizer builds compile unoptimised.
  json ctx = json::object();
  ctx["d"] = std::move(deep);
  EXPECT_THROW(render("{{ d|length }}", ctx), Error);
}

TEST(ChatTemplateLimits, DeeplyNestedSourceIsASyntaxError) {
  const std::string parens = "{{ " + std::string(10000, '(') + "1" + std::string(10000, ')') + " }}";
  EXPECT_THROW(ChatTemplate{parens}, jinja::SyntaxError);
  std::string ifs;
  for (int i = 0; i < 5000; ++i) ifs += "{% if true %}";
  for (int i = 0; i < 5000; ++i) ifs += "{% endif %}";
  EXPECT_THROW(ChatTemplate{ifs}, jinja::SyntaxError);
  std::string nots = "{{ " ;
  for (int i = 0; i < 10000; ++i) nots += "not ";
  EXPECT_THROW(ChatTemplate{nots + "1 }}"}, jinja::SyntaxError);
  // Nesting real templates use parses fine.
  EXPECT_EQ(render("{{ " + std::string(30, '(') + "1" + std::string(30, ')') + " }}"), "1");
}

TEST(ChatTemplateLimits, CustomStepLimit) {
  ChatRenderOptions o;
  o.limits.max_steps = 1000;
  expect_render_error([&] { render("{% for i in range(10000) %}{% endfor %}", json::object(), o); }, "ResourceLimitError");
  EXPECT_EQ(render("{% for i in range(10) %}{{ i }}{% endfor %}", json::object(), o), "0123456789");
}

TEST(ChatTemplateLimits, NamespaceCyclesAreHarmless) {
  // A namespace holding itself and macros holding their frames are freed after
  // the render (checked by the sanitizer build's leak checker).
  EXPECT_EQ(render("{% set ns = namespace() %}{% set ns.self = ns %}{% macro m() %}{{ ns.self.self is defined }}"
                   "{% endmacro %}{% set ns.m = m %}{{ ns.m() }}"),
            "True");
}

// ---- globals ------------------------------------------------------------------

TEST(ChatTemplate, StrftimeNowUsesTheConfiguredClock) {
  ChatRenderOptions o;
  std::tm tm{};
  tm.tm_year = 125;
  tm.tm_mon = 0;
  tm.tm_mday = 2;
  tm.tm_wday = 4;
  o.now = tm;
  EXPECT_EQ(render("{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%A') }}|{{ strftime_now('') }}", json::object(), o),
            "02 Jan 2025|Thursday|");
  // Without a fixed clock it formats the local time.
  EXPECT_EQ(render("{{ strftime_now('%Y')|length }}"), "4");
}

// ---- Gemma 3 built-in template ---------------------------------------------------

TEST(ChatTemplate, BuiltinGemma3) {
  ASSERT_NE(builtin_chat_template("gemma3"), nullptr);
  EXPECT_EQ(builtin_chat_template("llama"), nullptr);
  EXPECT_EQ(builtin_chat_template(""), nullptr);
  const ChatTemplate t(builtin_chat_template("gemma3"));
  const json messages = json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "  Hi!  "},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": " What is this? "}]}])");
  EXPECT_EQ(apply_chat_template(t, messages, true, "<bos>", "<eos>"),
            "<bos><start_of_turn>user\nBe brief.\n\nHi!<end_of_turn>\n"
            "<start_of_turn>model\nHello.<end_of_turn>\n"
            "<start_of_turn>user\n<start_of_image>What is this?<end_of_turn>\n"
            "<start_of_turn>model\n");
  try {
    apply_chat_template(t, json::parse(R"([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])"), true,
                        "<bos>", "<eos>");
    FAIL();
  } catch (const TemplateError& e) {
    EXPECT_STREQ(e.what(), "Conversation roles must alternate user/assistant/user/assistant/...");
  }
}

// ---- concurrency and speed ----------------------------------------------------------

TEST(ChatTemplate, ConcurrentRendersOfOneTemplate) {
  const ChatTemplate t(builtin_chat_template("gemma3"));
  auto conversation = [](int i) {
    json m = json::array();
    for (int k = 0; k <= i % 5; ++k) {
      m.push_back({{"role", "user"}, {"content", "question " + std::to_string(i) + "." + std::to_string(k)}});
      m.push_back({{"role", "assistant"}, {"content", "answer " + std::to_string(k)}});
    }
    m.push_back({{"role", "user"}, {"content", "last"}});
    return m;
  };
  std::vector<std::string> expected;
  for (int i = 0; i < 16; ++i) expected.push_back(apply_chat_template(t, conversation(i), true, "<bos>", "<eos>"));
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int th = 0; th < 4; ++th) {
    threads.emplace_back([&, th] {
      for (int r = 0; r < 200; ++r) {
        const int i = (th * 7 + r) % 16;
        if (apply_chat_template(t, conversation(i), true, "<bos>", "<eos>") != expected[i]) ++mismatches;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(ChatTemplate, RenderSpeedOfARealToolTemplate) {
  const std::string path = test::shared_data("chat-templates/CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja");
  REQUIRE_FILE(path);
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  const ChatTemplate t(ss.str());
  const ordered_json tools = ordered_json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "description": "Weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])");
  ordered_json messages = ordered_json::array();
  for (int i = 0; i < 10; ++i) {
    messages.push_back({{"role", "user"}, {"content", "question " + std::to_string(i)}});
    messages.push_back({{"role", "assistant"}, {"content", "answer " + std::to_string(i)}});
  }
  const ordered_json extra = {{"tools", tools}};
  const int n = 200;
  const auto t0 = Clock::now();
  size_t bytes = 0;
  for (int i = 0; i < n; ++i) bytes += apply_chat_template(t, messages, true, "<BOS_TOKEN>", "", extra).size();
  const double us = seconds_since(t0) / n * 1e6;
  std::printf("[ perf ] command-r7b tool template, 20 messages: %.0f us/render, %zu bytes\n", us, bytes / n);
  EXPECT_LT(us, 50000.0);
}

}  // namespace
}  // namespace pagellm
