// Hostile templates and hostile request data: each case once crashed, hung or
// ran superlinearly. Now each is refused with an error naming the limit (or
// renders correctly), and the sanitizer build reports nothing.
#include <gtest/gtest.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "chat/chat_template.h"
#include "chat/jinja/lexer.h"
#include "chat/jinja/value.h"

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

// ---- values that hold themselves ------------------------------------------------------

TEST(JinjaLimits, SelfHoldingValuesPrintLikePython) {
  // Outputs from Python's jinja2 (ImmutableSandboxedEnvironment).
  EXPECT_EQ(render("{% set ns = namespace(a=1) %}{% set ns.a = ns %}{{ ns }}"), "<Namespace {'a': <Namespace {...}>}>");
  EXPECT_EQ(render("{% set ns = namespace() %}{% set l = [ns] %}{% set ns.l = l %}{{ l }}|{{ l|string }}|{{ l == l }}|"
                   "{{ ns in l }}|{{ l < l }}|{{ l|length }}"),
            "[<Namespace {'l': [...]}>]|[<Namespace {'l': [...]}>]|True|True|False|1");
  EXPECT_EQ(render("{% set ns = namespace() %}{% set d = {'k': ns} %}{% set ns.d = d %}{{ d }}|{{ (ns,) }}"),
            "{'k': <Namespace {'d': {...}}>}|(<Namespace {'d': {'k': <Namespace {...}>}}>,)");
  EXPECT_EQ(render("{% set ns = namespace() %}{% set ns.t = (ns, ns) %}{{ ns }}"),
            "<Namespace {'t': (<Namespace {...}>, <Namespace {...}>)}>");
  expect_render_error([] { render("{% set ns = namespace() %}{% set ns.l = [ns] %}{{ ns.l|tojson }}"); }, "TypeError",
                      "not JSON serializable");
  // The sandbox forbids the methods that would let a list or dict hold itself directly.
  expect_render_error([] { render("{% set l = [] %}{{ l.append(l) }}"); }, "SecurityError", "unsafe");
  expect_render_error([] { render("{% set d = {} %}{{ d.update({'d': d}) }}"); }, "SecurityError", "unsafe");
  // Printing the same value twice side by side is not a cycle.
  EXPECT_EQ(render("{% set l = [1] %}{{ [l, l] }}"), "[[1], [1]]");
}

TEST(JinjaLimits, LongChainsOfNamespacesPrintToALimit) {
  // Namespaces add no value depth, so only printing's own bound stops this.
  const std::string build =
      "{% set ns = namespace(p=none) %}{% for i in range(100000) %}{% set n = namespace(p=ns.p) %}"
      "{% set ns.p = n %}{% endfor %}";
  expect_render_error([&] { render(build + "{{ ns }}"); }, "RecursionError",
                      "print deeper than the limit of 1000 levels");
  expect_render_error([&] { render(build + "{{ ns|string|length }}"); }, "RecursionError", "limit of 1000 levels");
  const std::string lists =
      "{% set ns = namespace(p=none) %}{% for i in range(100000) %}{% set ns.p = [namespace(p=ns.p)] %}{% endfor %}";
  expect_render_error([&] { render(lists + "{{ ns.p }}"); }, "RecursionError", "limit of 1000 levels");
  EXPECT_EQ(render(lists + "{{ ns.p == ns.p }}{{ ns.p|length }}"), "True1");
}

// ---- evaluation depth, calls, loops, output -----------------------------------------------

TEST(JinjaLimits, RecursionIsBounded) {
  expect_render_error([] { render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"); }, "RecursionError",
                      "template calls nest deeper than the limit of 64 (macro 'f')");
  expect_render_error([] { render("{% for x in [[1]] recursive %}{{ loop([x]) }}{% endfor %}"); }, "RecursionError",
                      "limit of 64 (recursive loop)");
  // A call block whose body calls the macro again.
  expect_render_error(
      [] {
        render(
            "{% macro f(n) %}{% call f(n) %}{{ caller is defined }}{% endcall %}{% endmacro %}"
            "{{ f(0) }}");
      },
      "RecursionError", "limit of 64 (macro 'f')");
  // With calls unbounded, the evaluation depth still is, whatever the body
  // (a macro call uses the most stack a level; the sanitizer build checks it fits).
  ChatRenderOptions o;
  o.limits.max_call_depth = 1 << 30;
  for (const char* body :
       {"{{ f(n) }}", "{{ [[[[f(n)]]]] }}", "{% if 1 %}{% if 1 %}{{ f(n)|string }}{% endif %}{% endif %}",
        "{% call f(n) %}{{ caller is defined }}{% endcall %}", "{% set x %}{{ f(n) }}{% endset %}"}) {
    SCOPED_TRACE(body);
    expect_render_error(
        [&] { render(std::string("{% macro f(n) %}") + body + "{% endmacro %}{{ f(0) }}", json::object(), o); },
        "RecursionError", "template evaluation nests deeper than the limit of 512 levels");
  }
  // Recursion real templates use is fine.
  EXPECT_EQ(render("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}").size(),
            111u);
}

TEST(JinjaLimits, LoopIterationsAreBounded) {
  expect_render_error([] { render("{% for i in range(1000) %}{% for j in range(1001) %}{% endfor %}{% endfor %}"); },
                      "ResourceLimitError", "template loop iterations exceed the limit of 1000000");
  ChatRenderOptions o;
  o.limits.max_loop_iterations = 10;
  EXPECT_EQ(render("{% for i in range(10) %}{{ i }}{% endfor %}", json::object(), o), "0123456789");
  expect_render_error([&] { render("{% for i in range(11) %}{% endfor %}", json::object(), o); }, "ResourceLimitError",
                      "limit of 10");
  // `for ... if` tests count too.
  expect_render_error([&] { render("{% for i in range(11) if false %}{% endfor %}", json::object(), o); },
                      "ResourceLimitError", "limit of 10");
}

TEST(JinjaLimits, WorkIsBoundedEvenInCheapLookingOperations) {
  // Each iteration scans a 1 MB string. At one step each, 100k iterations
  // of a few such scans took minutes; now each costs its bytes/64.
  ChatRenderOptions o;
  o.limits.max_steps = 200000;  // the default 5M takes ~1 s here, much longer under sanitizers
  const std::string big = "{% set s = 'x' * 1000000 %}{% for i in range(100000) %}";
  for (const char* body : {"{{ s|length }}", "{{ 'y' in s }}", "{{ s[i] }}", "{{ s == s ~ '' }}", "{{ 'a'.find(s) }}",
                           "{{ s.startswith('y') }}", "{{ s|wordcount }}", "{{ s is lower }}", "{{ s[1:2] }}"}) {
    SCOPED_TRACE(body);
    expect_render_error([&] { render(big + body + "{% endfor %}", json::object(), o); }, "ResourceLimitError",
                        "template exceeded its work limit of 200000 steps");
  }
  o.limits.max_steps = 1000;
  expect_render_error([&] { render("{% for i in range(1000) %}{{ i }}{% endfor %}", json::object(), o); },
                      "ResourceLimitError", "work limit of 1000 steps");
}

TEST(JinjaLimits, OutputIsBounded) {
  ChatRenderOptions o;
  o.limits.max_output_bytes = 1000;
  EXPECT_EQ(render("{{ 'x' * 1000 }}", json::object(), o).size(), 1000u);
  expect_render_error([&] { render("{{ 'x' * 1000 }}{{ 'y' }}", json::object(), o); }, "ResourceLimitError",
                      "template output of 1001 bytes exceeds the limit of 1000 bytes");
  // Strings the template builds but does not print are bounded by max_string_bytes only.
  EXPECT_EQ(render("{% set s %}{{ 'x' * 5000 }}{% endset %}{{ s|length }}", json::object(), o), "5000");
  // Default: 32 MiB.
  expect_render_error([] { render("{% for i in range(40) %}{{ 'x' * 1000000 }}{% endfor %}"); }, "ResourceLimitError",
                      "exceeds the limit of 33554432 bytes");
}

TEST(JinjaLimits, OneOperationCannotBuildAHugeString) {
  const std::string limit = "exceeds the limit of 33554432 bytes";
  for (const char* src : {
           "{{ 'a' * 10**9 }}",
           "{{ ['a'] * 10**9 }}",
           "{% set ns = namespace(s='a') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
           "{% set ns = namespace(s='a') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
           "{% set s = 'x' * 1000000 %}{{ ([s] * 40)|join }}",
           "{% set s = 'x' * 1000000 %}{{ ''.join([s] * 40) }}",
           "{{ ('a' * 1000000).replace('a', 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa') }}",
           "{{ ('a' * 1000000)|replace('a', 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa') }}",
           "{{ 'a'|center(10**12) }}",
           "{{ 'a'.center(4611686018427387904, '\U0001F600') }}",  // 2**62 x 4 bytes wraps around to 0
           "{{ 'a'.ljust(10**12) }}",
           "{{ 'a'.zfill(10**12) }}",
           "{{ ('x\\n' * 1000000)|indent(100) }}",
           "{{ ('x\\n' * 1000000)|indent(100, blank=true) }}",
           "{{ '%*s' % (10**12, 'a') }}",
           "{{ '{:>1000000000000}'.format('a') }}",
       }) {
    SCOPED_TRACE(src);
    expect_render_error([&] { render(src); }, "ResourceLimitError", "exceeds the limit of");
  }
  expect_render_error([] { render("{{ 'a' * 10**9 }}"); }, "ResourceLimitError", limit);
  expect_render_error([] { render("{{ range(100000)|list * 11 }}"); }, "ResourceLimitError",
                      "template list of 1100000 items exceeds the limit of 1000000 items");
  expect_render_error(
      [] {
        render(
            "{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}"
            "{% endfor %}");
      },
      "ResourceLimitError", "limit of 1000000 items");
  // Repeating nothing a huge number of times is instant, not a loop of 10**18 steps.
  EXPECT_EQ(render("{{ '' * 10**18 }}|{{ [] * 10**18 }}|{{ () * 10**18 }}"), "|[]|()");
}

// ---- integer arithmetic: errors, never undefined behaviour ---------------------------------

TEST(JinjaLimits, RangeWithExtremeBounds) {
  const std::string min = "(-9223372036854775807 - 1)", max = "9223372036854775807";
  EXPECT_EQ(render("{{ range(" + max + " - 1, " + max + ", 2)|list }}"), "[9223372036854775806]");
  EXPECT_EQ(render("{{ range(0, " + max + ", 4611686018427387904)|list }}"), "[0, 4611686018427387904]");
  EXPECT_EQ(render("{{ range(" + min + ", " + max + ", " + max + ")|list }}"),
            "[-9223372036854775808, -1, 9223372036854775806]");
  EXPECT_EQ(render("{{ range(" + max + ", " + min + ", " + min + ")|list }}"), "[9223372036854775807, -1]");
  EXPECT_EQ(render("{{ range(" + min + ", " + min + " + 3)|list }}"),
            "[-9223372036854775808, -9223372036854775807, -9223372036854775806]");
  EXPECT_EQ(render("{{ range(" + max + ", " + max + " - 2, -1)|list }}"), "[9223372036854775807, 9223372036854775806]");
  EXPECT_EQ(render("{{ range(" + max + ", " + min + ")|list }}"), "[]");
  for (const std::string& args : {min + ", " + max, max + ", " + min + ", -1", min + ", " + max + ", 2", "-" + max}) {
    SCOPED_TRACE(args);
    if (args == "-" + max) {
      EXPECT_EQ(render("{{ range(" + args + ")|list }}"), "[]");
      continue;
    }
    expect_render_error([&] { render("{{ range(" + args + ") }}"); }, "OverflowError", "MAX_RANGE");
  }
  // Slices of ranges and sequences with extreme steps.
  EXPECT_EQ(render("{{ range(10)[::" + max + "] }}"), "range(0, 10, 9223372036854775807)");
  EXPECT_EQ(render("{{ range(10)[::" + min + "]|list }}"), "[9]");
  EXPECT_EQ(render("{{ 'abc'[::" + max + "] }}|{{ 'abc'[::" + min + "] }}|{{ [1, 2, 3][" + min + ":" + max + "] }}"),
            "a|c|[1, 2, 3]");
  EXPECT_EQ(render("{{ 'abc'[2::" + max + "] }}|{{ [1, 2, 3][1::" + max + "] }}|{{ range(3)[2::" + max + "]|list }}"),
            "c|[2]|[2]");
  expect_render_error([&] { render("{{ range(0, 1, " + max + ")[::2] }}"); }, "OverflowError",
                      "integer overflow in range slice");
}

TEST(JinjaLimits, IntegerOverflowIsAnError) {
  const std::string min = "(-9223372036854775807 - 1)", max = "9223372036854775807";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"-" + min, "unary -"},
      {"- - " + min, "unary -"},
      {min + "|abs", "abs"},
      {max + " + 1", "+"},
      {min + " - 1", "-"},
      {max + " * 2", "*"},
      {min + " * -1", "*"},
      {min + " // -1", "//"},
      {"2 ** 63", "**"},
      {"3 ** 40", "**"},
      {"(-2) ** 64", "**"},
      {"[1, 2]|sum(start=" + max + ")", "+"},
      {max + "|round(-19)", "round"},
      {"'%x' % 1e300", "%x of a float"},
  };
  for (const auto& [expr, op] : cases) {
    SCOPED_TRACE(expr);
    expect_render_error([&] { render("{{ " + expr + " }}"); }, "OverflowError", "integer overflow in " + op);
  }
  EXPECT_EQ(render("{{ " + min + " }}|{{ " + min + " % -1 }}|{{ " + min + " // 1 }}|{{ -" + max +
                   " - 1 }}|{{ 2 ** 62 }}|"
                   "{{ (-2) ** 63 }}"),
            "-9223372036854775808|0|-9223372036854775808|-9223372036854775808|4611686018427387904|"
            "-9223372036854775808");
  // Conversions at the edges.
  EXPECT_EQ(
      render(
          "{{ '-9223372036854775808'|int }}|{{ '9223372036854775807'|int }}|{{ '0x7fffffffffffffff'|int(base=16) }}"),
      "-9223372036854775808|9223372036854775807|9223372036854775807");
  expect_render_error([] { render("{{ '9223372036854775808'|int }}"); }, "OverflowError", "too large");
  expect_render_error([] { render("{{ 1e19|int }}"); }, "OverflowError", "cannot convert");
  EXPECT_EQ(render("{{ '{:x}'.format(" + min + ") }}|{{ '{:b}'.format(" + min + ") }}|{{ '%x' % " + min +
                   " }}|{{ '%d' % " + min + " }}"),
            "-8000000000000000|-1000000000000000000000000000000000000000000000000000000000000000|-8000000000000000|"
            "-9223372036854775808");
  EXPECT_EQ(render("{{ '%d' % 1e20 }}|{{ '%d' % -1e19 }}|{{ '%i' % 2.5 }}"),
            "100000000000000000000|-10000000000000000000|2");
  expect_render_error([] { render("{{ '%d' % (1e308 * 10) }}"); }, "OverflowError", "infinity");
  expect_render_error([] { render("{{ '%c' % 99999999999 }}"); }, "OverflowError", "range(0x110000)");
  expect_render_error([] { render("{{ '%c' % -1 }}"); }, "OverflowError", "range(0x110000)");
  EXPECT_EQ(render("{{ 4000000000000000000|round(-19) }}|{{ " + max + "|round(-18) }}|{{ " + min +
                   "|round(-18) }}|{{ " + max + "|round(-300) }}"),
            "0|9000000000000000000|-9000000000000000000|0");
  EXPECT_EQ(render("{{ 'abcdefgh'|truncate(" + max + ", leeway=" + max + ") }}"), "abcdefgh");
  EXPECT_EQ(render("{{ 1.5|round(" + min + ") }}|{{ 150.0|round(-2) }}|{{ '5'|int(base=" + max + ") }}"), "0.0|200.0|5");
  EXPECT_EQ(render("{{ '%.300f' % 1e300 }}").size(), 301u + 1 + 300);
  EXPECT_EQ(render("{{ '{:.400f}'.format(1e300) }}").size(), 301u + 1 + 400);
}

}  // namespace
}  // namespace pagellm
