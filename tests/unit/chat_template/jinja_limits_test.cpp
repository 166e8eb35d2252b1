// Hostile templates and hostile request data: each case once crashed, hung or
// ran superlinearly. Now each is refused with an error naming the limit (or
// renders correctly), and the sanitizer build reports nothing.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "tokenizer/chat_template.h"
#include "tokenizer/jinja/lexer.h"
#include "tokenizer/jinja/value.h"

namespace pagellm {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

constexpr int kChain = 200000;

std::string render(const std::string& src, const json& ctx = json::object(), const ChatRenderOptions& o = {}) {
  return ChatTemplate(src).render(ctx, o);
}

std::string repeat(const std::string& s, int n) {
  std::string out;
  out.reserve(s.size() * static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

// Parsing `src` fails with a SyntaxError whose message contains `needle`.
void expect_syntax_error(const std::string& src, const std::string& needle) {
  try {
    ChatTemplate t(src);
    ADD_FAILURE() << "parsed: " << src.substr(0, 80);
  } catch (const jinja::SyntaxError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// Rendering fails with a RenderError of `py_type` whose message contains `needle`.
template <class Fn>
void expect_render_error(Fn&& fn, const std::string& py_type, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no exception, expected " << py_type;
  } catch (const jinja::RenderError& e) {
    EXPECT_EQ(e.py_type(), py_type) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception: " << e.what();
  }
}

json nested_arrays(int depth) {
  json deep = json::array();
  for (int i = 0; i < depth; ++i) {
    json outer = json::array();
    outer.push_back(std::move(deep));
    deep = std::move(outer);
  }
  return deep;
}

// {key: v}, moving v: nlohmann copies recursively, so the test must not copy deep values either.
json object_with(const std::string& key, json v) {
  json o = json::object();
  o[key] = std::move(v);
  return o;
}
json array_with(json v) {
  json a = json::array();
  a.push_back(std::move(v));
  return a;
}

// ---- long chains: refused when parsing, before evaluation or destruction recurse ----

TEST(JinjaLimits, LongChainsAreSyntaxErrors) {
  const std::string limit = "exceeds the limit of 256 levels";
  expect_syntax_error("{{ x" + repeat("|lower", kChain) + " }}", limit);
  expect_syntax_error("{{ a" + repeat(".b", kChain) + " }}", limit);
  expect_syntax_error("{{ a" + repeat("[0]", kChain) + " }}", limit);
  expect_syntax_error("{{ a" + repeat(".0", kChain) + " }}", limit);
  expect_syntax_error("{{ f" + repeat("()", kChain) + " }}", limit);
  expect_syntax_error("{{ 1" + repeat("+1", kChain) + " }}", limit);
  expect_syntax_error("{{ 1" + repeat("*1", kChain) + " }}", limit);
  expect_syntax_error("{{ 2" + repeat("**1", kChain) + " }}", limit);
  expect_syntax_error("{{ 1" + repeat(" and 1", kChain) + " }}", limit);
  expect_syntax_error("{{ 1" + repeat(" or 1", kChain) + " }}", limit);
  expect_syntax_error("{{ 1" + repeat(" if 1", kChain) + " }}", limit);
  expect_syntax_error("{% set x | lower" + repeat("|lower", kChain) + " %}{% endset %}", limit);
  expect_syntax_error("{% filter lower" + repeat("|lower", kChain) + " %}{% endfilter %}", limit);
}

TEST(JinjaLimits, DeepNestingIsASyntaxError) {
  const std::string limit = "template nesting exceeds the limit of 256 levels";
  expect_syntax_error("{{ " + repeat("not ", kChain) + "1 }}", limit);
  expect_syntax_error("{{ " + repeat("- ", kChain) + "1 }}", limit);
  expect_syntax_error("{{ " + repeat("-", kChain) + "1 }}", limit);
  expect_syntax_error("{{ " + repeat("(", kChain) + "1" + repeat(")", kChain) + " }}", limit);
  expect_syntax_error("{{ " + repeat("[", kChain) + "1" + repeat("]", kChain) + " }}", limit);
  expect_syntax_error("{{ " + repeat("{1: ", kChain) + "1" + repeat("}", kChain) + " }}", limit);
  expect_syntax_error("{{ " + repeat("f(", kChain) + "1" + repeat(")", kChain) + " }}", limit);
  expect_syntax_error("{{ a" + repeat("[a", kChain) + repeat("]", kChain) + " }}", limit);
  expect_syntax_error("{{ 1" + repeat(" if 1 else 2", kChain) + " }}", limit);
  expect_syntax_error(repeat("{% if 1 %}", kChain) + repeat("{% endif %}", kChain), limit);
  // A long flat sequence is not nesting.
  EXPECT_EQ(render("{{ [" + repeat("1,", 20000) + "1]|length }}"), "20001");
  EXPECT_EQ(render("{{ 1" + repeat(" < 2", 20000) + " }}"), "False");
  EXPECT_EQ(render("{{ 'a'" + repeat(" ~ 'a'", 20000) + " }}"), std::string(20001, 'a'));
}

TEST(JinjaLimits, ChainsAndNestingRealTemplatesUseStillParse) {
  EXPECT_EQ(render("{{ x" + repeat("|lower", 200) + " }}", {{"x", "AbC"}}), "abc");
  EXPECT_EQ(render("{{ 0" + repeat(" + 1", 200) + " }}"), "200");
  EXPECT_EQ(render("{{ " + repeat("(", 200) + "7" + repeat(")", 200) + " }}"), "7");
  EXPECT_EQ(render("{{ a" + repeat("[0]", 200) + " }}", object_with("a", nested_arrays(200))), "[]");
}

TEST(JinjaLimits, ParseLimitsAreConfigurable) {
  ChatTemplateLimits l;
  l.max_expr_depth = 10;
  EXPECT_NO_THROW(ChatTemplate("{{ a.b.c.d.e.f.g.h.i }}", l));
  try {
    ChatTemplate t("{{ a.b.c.d.e.f.g.h.i.j.k }}", l);
    FAIL() << "parsed";
  } catch (const jinja::SyntaxError& e) {
    EXPECT_NE(std::string(e.what()).find("limit of 10 levels"), std::string::npos) << e.what();
  }
  l = {};
  l.max_nesting = 5;
  EXPECT_THROW(ChatTemplate("{{ ((((((1)))))) }}", l), jinja::SyntaxError);
  EXPECT_EQ(ChatTemplate("{{ ((((1)))) }}", l).render(json::object()), "1");
  EXPECT_EQ(ChatTemplate("{{ 1 }}", l).limits().max_nesting, 5);
}

// ---- request data: linear time, bounded depth --------------------------------------

TEST(JinjaLimits, HundredThousandKwargsRenderInLinearTime) {
  // Was quadratic: every context variable was appended to the root frame
  // after a linear search for the same name (33-50 s for 100k keys).
  json kwargs = json::object();
  // std::string("k").append(...), not "k" + ...: GCC 12 warns (-Wrestrict) falsely.
  for (int i = 0; i < 100000; ++i) kwargs[std::string("k").append(std::to_string(i))] = i;
  const ChatTemplate t("{{ k0 }},{{ k99999 }},{{ k50000 }},{{ messages|length }},{{ missing is defined }}");
  EXPECT_EQ(apply_chat_template(t, json::array({1, 2}), true, "", "", kwargs), "0,99999,50000,2,False");
  // Through a namespace as well: namespace(**kwargs) set each key after a linear search too.
  const ChatTemplate ns("{% set n = namespace(**kw) %}{{ n.k0 }},{{ n.k99999 }}");
  EXPECT_EQ(ns.render(json{{"kw", kwargs}}), "0,99999");
}

TEST(JinjaLimits, OrderedKwargsKeepOrderAndOverride) {
  ordered_json kwargs = ordered_json::object();
  kwargs["bos_token"] = "B";
  kwargs["z"] = 1;
  kwargs["a"] = 2;
  const ChatTemplate t("{{ bos_token }}{{ z }}{{ a }}{{ tools is none }}");
  EXPECT_EQ(apply_chat_template(t, ordered_json::array(), true, "<s>", "", kwargs), "B12True");
}

TEST(JinjaLimits, DeepRequestJsonIsRefusedNotCopied) {
  // 100,000 levels: copying or converting this recursively overflows the stack.
  const ChatTemplate t("{{ messages|length }}{{ x|length }}");
  auto expect_refused = [](auto&& fn) {
    try {
      fn();
      ADD_FAILURE() << "rendered";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("limit of 500 levels"), std::string::npos) << e.what();
    }
  };
  const json messages = array_with(nested_arrays(100000));
  const json kwargs = object_with("x", nested_arrays(100000));
  const json message_list = array_with(object_with("content", nested_arrays(100000)));
  expect_refused([&] { apply_chat_template(t, messages, true, "", ""); });
  expect_refused([&] { apply_chat_template(t, json::array(), true, "", "", kwargs); });
  expect_refused([&] { t.render(kwargs); });
  expect_refused([&] { apply_chat_template(t, message_list, true, "", ""); });
  const json deep = nested_arrays(100000);
  // The depth check callers run before copying request JSON.
  EXPECT_TRUE(json_deeper_than(deep, 64));
  EXPECT_FALSE(json_deeper_than(nested_arrays(63), 64));  // 64 levels: the innermost empty array is one
  EXPECT_TRUE(json_deeper_than(nested_arrays(64), 64));
  EXPECT_FALSE(json_deeper_than(json::parse(R"({"a": [1, {"b": [2]}], "c": 3})"), 4));
  EXPECT_TRUE(json_deeper_than(json::parse(R"({"a": [1, {"b": [2]}], "c": 3})"), 3));
  EXPECT_FALSE(json_deeper_than(json(5), 0));
  // Shallow enough renders.
  EXPECT_EQ(apply_chat_template(t, json::array(), true, "", "", object_with("x", nested_arrays(400))), "01");
}

}  // namespace
}  // namespace pagellm
