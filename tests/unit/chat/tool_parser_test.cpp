// Tool-call parsers on realistic model outputs. Every case is also streamed in 1-byte and random-sized deltas
// (fixed seeds), which must give exactly what parse() gives.
#include "chat/tool_parser.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"

namespace pagellm::chat {
namespace {

using Calls = std::vector<std::pair<std::string, std::string>>;  // (name, arguments), printable by gtest

Calls as_pairs(const std::vector<ToolCall>& calls) {
  Calls out;
  for (const ToolCall& c : calls) out.emplace_back(c.name, c.arguments);
  return out;
}

// Feeds `text` to a fresh stream in deltas of next_size() bytes, then finish(), merged.
ToolParseResult stream_in(const ToolParser& parser, std::string_view text, const std::function<size_t()>& next_size) {
  std::unique_ptr<ToolCallStream> s = parser.stream();
  ToolParseResult merged;
  auto add = [&](ToolParseResult r) {
    merged.content += r.content;
    for (ToolCall& c : r.calls) merged.calls.push_back(std::move(c));
  };
  for (size_t pos = 0; pos < text.size();) {
    const size_t n = std::min(next_size(), text.size() - pos);
    add(s->feed(text.substr(pos, n)));
    pos += n;
  }
  add(s->finish());
  return merged;
}

// parse() of `text` with `parser_name`, after checking that streaming agrees with it.
ToolParseResult parse_checked(const std::string& parser_name, std::string_view text) {
  std::unique_ptr<ToolParser> parser = make_tool_parser(parser_name);
  const ToolParseResult whole = parser->parse(text);
  auto expect_same = [&](const ToolParseResult& streamed, const std::string& how) {
    EXPECT_EQ(streamed.content, whole.content) << parser_name << ", " << how << ", text: " << text;
    EXPECT_EQ(as_pairs(streamed.calls), as_pairs(whole.calls)) << parser_name << ", " << how << ", text: " << text;
  };
  expect_same(stream_in(*parser, text, [] { return size_t{1}; }), "1-byte deltas");
  for (uint32_t seed : {1u, 7u, 2024u}) {
    for (size_t max_size : {size_t{5}, size_t{40}}) {
      std::mt19937 rng(seed);
      std::uniform_int_distribution<size_t> size(1, max_size);
      expect_same(stream_in(*parser, text, [&] { return size(rng); }),
                  "random deltas, seed " + std::to_string(seed) + ", up to " + std::to_string(max_size));
    }
  }
  return whole;
}

// The whole output as content, no calls.
void expect_content_only(const std::string& parser_name, std::string_view text) {
  const ToolParseResult r = parse_checked(parser_name, text);
  EXPECT_EQ(r.content, text) << parser_name;
  EXPECT_TRUE(r.calls.empty()) << parser_name << ": " << text;
}

// ---- registry -------------------------------------------------------------------------------------------------

TEST(ToolParser, NamesAndUnknownNameError) {
  EXPECT_EQ(tool_parser_names(), (std::vector<std::string>{"hermes", "llama3_json", "mistral", "pythonic"}));
  for (const std::string& name : tool_parser_names()) EXPECT_EQ(make_tool_parser(name)->name(), name);
  try {
    make_tool_parser("hermes2");
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'hermes2'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("hermes, llama3_json, mistral, pythonic"), std::string::npos) << msg;
  }
}

// ---- hermes -----------------------------------------------------------------------------------------------------

TEST(ToolParser, HermesSingleCall) {
  const ToolParseResult r = parse_checked(
      "hermes",
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n"
      "</tool_call>");
  EXPECT_EQ(r.content, "");
  EXPECT_EQ(as_pairs(r.calls), (Calls{{"get_weather", R"({"city":"Paris","unit":"celsius"})"}}));
}

TEST(ToolParser, HermesContentBeforeAndSeveralCalls) {
  const std::string text =
      "I'll check both cities.\n\n"
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Tokyo\"}}\n</tool_call>";
  const ToolParseResult r = parse_checked("hermes", text);
  EXPECT_EQ(r.content, "I'll check both cities.\n\n");
  EXPECT_EQ(as_pairs(r.calls),
            (Calls{{"get_weather", R"({"city":"Paris"})"}, {"get_weather", R"({"city":"Tokyo"})"}}));
}

TEST(ToolParser, HermesContentBetweenAndAfterCalls) {
  const std::string text =
      "First <tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call> then "
      "<tool_call>{\"name\": \"b\", \"arguments\": {\"x\": 1}}</tool_call>\nDone.";
  const ToolParseResult r = parse_checked("hermes", text);
  EXPECT_EQ(r.content, "First  then \nDone.");
  EXPECT_EQ(as_pairs(r.calls), (Calls{{"a", "{}"}, {"b", R"({"x":1})"}}));
}

TEST(ToolParser, HermesNestedArgumentsWithUnicodeAndEscapes) {
  const std::string text =
      "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"caf\\u00e9 \\\"best\\\" 東京 \\\\ end\", "
      "\"filters\": {\"tags\": [\"a\", \"b\"], \"limit\": 5, \"ratio\": 0.25, \"nested\": {\"deep\": [1, "
      "{\"x\": null, \"y\": true}]}}, \"note\": \"</tool\"}}\n</tool_call>";
  const ToolParseResult r = parse_checked("hermes", text);
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "search");
  EXPECT_EQ(r.calls[0].arguments,
            "{\"query\":\"café \\\"best\\\" 東京 \\\\ end\",\"filters\":{\"tags\":[\"a\",\"b\"],\"limit\":5,"
            "\"ratio\":0.25,\"nested\":{\"deep\":[1,{\"x\":null,\"y\":true}]}},\"note\":\"</tool\"}");
}

TEST(ToolParser, HermesKeepsKeyOrder) {
  const ToolParseResult r =
      parse_checked("hermes", "<tool_call>{\"name\": \"f\", \"arguments\": {\"zeta\": 1, \"alpha\": 2}}</tool_call>");
  EXPECT_EQ(as_pairs(r.calls), (Calls{{"f", R"({"zeta":1,"alpha":2})"}}));
}

TEST(ToolParser, HermesArgumentsAsStringOrMissing) {
  const ToolParseResult r = parse_checked(
      "hermes",
      "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": [1, 2]}\"}</tool_call>"
      "<tool_call>{\"name\": \"g\"}</tool_call><tool_call>{\"arguments\": null, \"name\": \"h\"}</tool_call>");
  EXPECT_EQ(r.content, "");
  EXPECT_EQ(as_pairs(r.calls), (Calls{{"f", R"({"a":[1,2]})"}, {"g", "{}"}, {"h", "{}"}}));
}

TEST(ToolParser, HermesMalformedCallsAreContent) {
  // Missing closing brace.
  expect_content_only("hermes", "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}\n</tool_call>");
  // No name, a name that is not a string, arguments that are not an object, a string that is not JSON.
  expect_content_only("hermes", "<tool_call>{\"arguments\": {}}</tool_call>");
  expect_content_only("hermes", "<tool_call>{\"name\": 3, \"arguments\": {}}</tool_call>");
  expect_content_only("hermes", "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>");
  expect_content_only("hermes", "<tool_call>{\"name\": \"f\", \"arguments\": \"not json\"}</tool_call>");
  // Not an object at all, trailing garbage, and invalid UTF-8 in a string.
  expect_content_only("hermes", "<tool_call>[\"f\"]</tool_call>");
  expect_content_only("hermes", "<tool_call>{\"name\": \"f\", \"arguments\": {}} extra</tool_call>");
  expect_content_only("hermes", "<tool_call>{\"name\": \"f" "\xff" "\", \"arguments\": {}}</tool_call>");
  // Nested deeper than 64 levels.
  expect_content_only("hermes", "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": " + std::string(70, '[') +
                                    std::string(70, ']') + "}}</tool_call>");
}

TEST(ToolParser, HermesMalformedCallAmongGoodOnes) {
  const std::string bad = "<tool_call>\n{\"name\": \"broken\", \"arguments\": {\"q\": \"unterminated}\n</tool_call>";
  const std::string text = "<tool_call>{\"name\": \"ok\", \"arguments\": {}}</tool_call>\n" + bad +
                           "\n<tool_call>{\"name\": \"ok2\", \"arguments\": {}}</tool_call>";
  const ToolParseResult r = parse_checked("hermes", text);
  EXPECT_EQ(r.content, "\n" + bad + "\n");
  EXPECT_EQ(as_pairs(r.calls), (Calls{{"ok", "{}"}, {"ok2", "{}"}}));
}

TEST(ToolParser, HermesUnfinishedCallAtEnd) {
  // Cut off inside the JSON: content.
  expect_content_only("hermes", "Let me look.\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"ca");
  expect_content_only("hermes", "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_");
  // Complete JSON without the closing tag (a stop string ate it): a call, as vLLM has it.
  const ToolParseResult r = parse_checked("hermes", "Sure.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n");
  EXPECT_EQ(r.content, "Sure.\n");
  EXPECT_EQ(as_pairs(r.calls), (Calls{{"f", "{}"}}));
}

TEST(ToolParser, HermesPlainTextAndLookalikes) {
  expect_content_only("hermes", "");
  expect_content_only("hermes", "The answer is 42.");
  expect_content_only("hermes", "Use a <tool> or a <tool_cal> tag, x < y, and </tool_call> alone.");
  expect_content_only("hermes", "Ends with a partial tag <tool_ca");
  expect_content_only("hermes", "  \n\n");
  expect_content_only("hermes", "Unicode: 東京, émoji 🙂 and <<tool_call");
}

TEST(ToolParser, HermesWhitespaceAroundCallsIsDropped) {
  const ToolParseResult r = parse_checked(
      "hermes", "\n\n<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n\n  "
                "<tool_call>{\"name\": \"b\", \"arguments\": {}}</tool_call>\n");
  EXPECT_EQ(r.content, "");
  EXPECT_EQ(r.calls.size(), 2u);
  // Whitespace next to a malformed call is kept with it.
  expect_content_only("hermes", "\n<tool_call>{oops}</tool_call>\n");
}

TEST(ToolParser, HermesStreamsContentEarlyAndCallsWhenClosed) {
  std::unique_ptr<ToolCallStream> s = make_tool_parser("hermes")->stream();
  ToolParseResult r = s->feed("Checking the weather <tool");
  EXPECT_EQ(r.content, "Checking the weather ");  // "<tool" held back
  r = s->feed("_call>\n{\"name\": \"get_weather\", ");
  EXPECT_EQ(r.content, "");
  EXPECT_TRUE(r.calls.empty());
  r = s->feed("\"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>");
  EXPECT_EQ(as_pairs(r.calls), (Calls{{"get_weather", R"({"city":"Oslo"})"}}));
  r = s->feed("\nAnything else?");
  EXPECT_EQ(r.content, "\nAnything else?");
  r = s->finish();
  EXPECT_EQ(r.content, "");
  EXPECT_TRUE(r.calls.empty());
}

// ---- llama3_json ------------------------------------------------------------------------------------------------

TEST(ToolParser, Llama3JsonSingleCall) {
  const ToolParseResult r =
      parse_checked("llama3_json", "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"San Francisco\"}}");
  EXPECT_EQ(r.content, "");
  EXPECT_EQ(as_pairs(r.calls), (Calls{{"get_weather", R"({"city":"San Francisco"})"}}));
}

TEST(ToolParser, Llama3JsonPythonTagWhitespaceAndArgumentsKey) {
  const ToolParseResult r = parse_checked(
      "llama3_json", "\n <|python_tag|>{\"name\": \"lookup\", \"arguments\": {\"id\": 7, \"tags\": [\"x\"]}}\n");
  EXPECT_EQ(r.content, "");
  EXPECT_EQ(as_pairs(r.calls), (Calls{{"lookup", R"({"id":7,"tags":["x"]})"}}));
}

TEST(ToolParser, Llama3JsonSeveralCallsJoinedBySemicolons) {
  const ToolParseResult r = parse_checked(
      "llama3_json",
      "{\"name\": \"a\", \"parameters\": {\"q\": \"x; y\"}}; {\"name\": \"b\", \"parameters\": {\"n\": {\"m\": "
      "[1, {\"k\": \"}\"}]}}};{\"name\": \"c\", \"parameters\": {}}");
  EXPECT_EQ(r.content, "");
  EXPECT_EQ(as_pairs(r.calls),
            (Calls{{"a", R"({"q":"x; y"})"}, {"b", R"({"n":{"m":[1,{"k":"}"}]}})"}, {"c", "{}"}}));
}

TEST(ToolParser, Llama3JsonUnicodeAndEscapedQuotes) {
  const ToolParseResult r = parse_checked(
      "llama3_json", "{\"name\": \"translate\", \"parameters\": {\"text\": \"He said \\\"こんにちは\\\"\\n\", "
                     "\"to\": \"fran\\u00e7ais\"}}");
  EXPECT_EQ(as_pairs(r.calls),
            (Calls{{"translate", "{\"text\":\"He said \\\"こんにちは\\\"\\n\",\"to\":\"français\"}"}}));
}

TEST(ToolParser, Llama3JsonContent) {
  expect_content_only("llama3_json", "The weather in Paris is sunny.");
  expect_content_only("llama3_json", "Here is JSON: {\"name\": \"f\", \"parameters\": {}}");
  expect_content_only("llama3_json", "  \n");
  expect_content_only("llama3_json", "<|python_tag|>print(\"hi\")");
  expect_content_only("llama3_json", "<|python_ta");
  expect_content_only("llama3_json", "<|pyth0n_tag|>{}");
  // JSON that is not a call: an answer in JSON, a name without parameters, a list.
  expect_content_only("llama3_json", "{\"answer\": 42, \"unit\": \"km\"}");
  expect_content_only("llama3_json", "{\"name\": \"Ada Lovelace\", \"born\": 1815}");
  expect_content_only("llama3_json", "[{\"name\": \"f\", \"parameters\": {}}]");
  // Malformed or unfinished, or followed by text.
  expect_content_only("llama3_json", "{\"name\": \"f\", \"parameters\": {\"a\": 1}");
  expect_content_only("llama3_json", "{\"name\": \"f\", \"parameters\": {\"a\": tru}}");
  expect_content_only("llama3_json", "{\"name\": \"f\", \"parameters\": {}} and then some text");
  expect_content_only("llama3_json", "{\"name\": \"f\", \"parameters\": {}}; oops");
  expect_content_only("llama3_json", "{\"name\": \"f\", \"parameters\": \"text\"}");
}

// ---- mistral ----------------------------------------------------------------------------------------------------

TEST(ToolParser, MistralJsonList) {
  const ToolParseResult r = parse_checked(
      "mistral", "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Lyon\"}}, {\"name\": "
                 "\"get_time\", \"arguments\": {\"tz\": \"Europe/Paris\"}}]");
  EXPECT_EQ(r.content, "");
  EXPECT_EQ(as_pairs(r.calls),
            (Calls{{"get_weather", R"({"city":"Lyon"})"}, {"get_time", R"({"tz":"Europe/Paris"})"}}));
  // A lone call object, not in a list.
  const ToolParseResult lone = parse_checked("mistral", "[TOOL_CALLS]{\"name\": \"ping\", \"arguments\": {}}\n");
  EXPECT_EQ(lone.content, "");
  EXPECT_EQ(as_pairs(lone.calls), (Calls{{"ping", "{}"}}));
}

TEST(ToolParser, MistralContentBeforeCalls) {
  const ToolParseResult r = parse_checked(
      "mistral", "Let me compute that. [TOOL_CALLS][{\"name\": \"add\", \"arguments\": {\"a\": 3.5, \"b\": -4}}]");
  EXPECT_EQ(r.content, "Let me compute that. ");
  EXPECT_EQ(as_pairs(r.calls), (Calls{{"add", R"({"a":3.5,"b":-4})"}}));
}

TEST(ToolParser, MistralNameArgsFormat) {
  const ToolParseResult r = parse_checked(
      "mistral", "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Zürich\", \"opts\": {\"days\": [1, 2]}}"
                 "[TOOL_CALLS]get-time[ARGS]{}[TOOL_CALLS]add{\"a\": 1, \"b\": \"[TOOL_CALLS]\"}");
  EXPECT_EQ(r.content, "");
  EXPECT_EQ(as_pairs(r.calls), (Calls{{"get_weather", R"({"city":"Zürich","opts":{"days":[1,2]}})"},
                                      {"get-time", "{}"},
                                      {"add", R"({"a":1,"b":"[TOOL_CALLS]"})"}}));
}

TEST(ToolParser, MistralNestedEscapes) {
  const ToolParseResult r = parse_checked(
      "mistral", "[TOOL_CALLS][{\"name\": \"run\", \"arguments\": {\"code\": \"print(\\\"]}\\\")\\n\", \"env\": "
                 "{\"A\": \"\\u00fc\"}}}]");
  EXPECT_EQ(as_pairs(r.calls), (Calls{{"run", "{\"code\":\"print(\\\"]}\\\")\\n\",\"env\":{\"A\":\"ü\"}}"}}));
}

TEST(ToolParser, MistralMalformedIsContent) {
  expect_content_only("mistral", "No tools needed.");
  expect_content_only("mistral", "An array [TOOLS] and a [TOOL_CALL] and [TOOL_CALLS");
  expect_content_only("mistral", "[TOOL_CALLS] Sorry, I cannot call tools.");
  expect_content_only("mistral", "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": 1}}");
  expect_content_only("mistral", "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": 1]]");
  expect_content_only("mistral", "[TOOL_CALLS][{\"arguments\": {}}]");
  expect_content_only("mistral", "[TOOL_CALLS][]");
  expect_content_only("mistral", "[TOOL_CALLS]f[ARG]{}");
  expect_content_only("mistral", "[TOOL_CALLS]f[ARGS][1]");
  expect_content_only("mistral", "[TOOL_CALLS]f[ARGS]{\"a\": }");
  expect_content_only("mistral", "[TOOL_CALLS]get_weather");
}

TEST(ToolParser, MistralMalformedBlockThenGoodOne) {
  const ToolParseResult r =
      parse_checked("mistral", "[TOOL_CALLS] oops\n[TOOL_CALLS]f[ARGS]{\"x\": true} Done.");
  EXPECT_EQ(r.content, "[TOOL_CALLS] oops\n Done.");
  EXPECT_EQ(as_pairs(r.calls), (Calls{{"f", R"({"x":true})"}}));
}

// ---- pythonic ---------------------------------------------------------------------------------------------------

TEST(ToolParser, PythonicSingleCall) {
  const ToolParseResult r = parse_checked("pythonic", "[get_weather(city=\"San Francisco\", unit='fahrenheit')]");
  EXPECT_EQ(r.content, "");
  EXPECT_EQ(as_pairs(r.calls), (Calls{{"get_weather", R"({"city":"San Francisco","unit":"fahrenheit"})"}}));
}

TEST(ToolParser, PythonicSeveralCallsWithNestedLiterals) {
  const ToolParseResult r = parse_checked(
      "pythonic",
      "[f(a=1, b=-2.5, c=True, d=None, e=[1, 2, \"x\"], g={\"k\": None, 'n': {'m': [False, 1e3, .5]}}), g(), "
      "h(big=12345678901234567890, neg=-9223372036854775808, hex=0xFF, under=1_000, f2=5.)]");
  EXPECT_EQ(r.content, "");
  EXPECT_EQ(as_pairs(r.calls),
            (Calls{{"f", R"({"a":1,"b":-2.5,"c":true,"d":null,"e":[1,2,"x"],)"
                         R"("g":{"k":null,"n":{"m":[false,1000.0,0.5]}}})"},
                   {"g", "{}"},
                   {"h", R"({"big":12345678901234567890,"neg":-9223372036854775808,"hex":255,)"
                         R"("under":1000,"f2":5.0})"}}));
}

TEST(ToolParser, PythonicStringEscapesAndUnicode) {
  const ToolParseResult r = parse_checked(
      "pythonic", "[say(text='It\\'s \"quoted\"\\n\\u00e9\\x41\\101', other=\"tab\\there \\\\ \\d\", "
                  "raw=\"東京 café 🙂\", joined='a' \"b\", doc='''multi\nline''')]");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments,
            "{\"text\":\"It's \\\"quoted\\\"\\néAA\",\"other\":\"tab\\there \\\\ \\\\d\","
            "\"raw\":\"東京 café 🙂\","
            "\"joined\":\"ab\",\"doc\":\"multi\\nline\"}");
}

TEST(ToolParser, PythonicDictKeysAndTrailingCommas) {
  const ToolParseResult r =
      parse_checked("pythonic", "[f(m={1: 'a', True: 'b', None: 'c', 'k': [1, 2,],}, n=[],)]");
  EXPECT_EQ(as_pairs(r.calls), (Calls{{"f", R"({"m":{"1":"a","true":"b","null":"c","k":[1,2]},"n":[]})"}}));
}

TEST(ToolParser, PythonicWhitespaceAndLlama4Tags) {
  const ToolParseResult r = parse_checked(
      "pythonic",
      "\n<|python_start|>[\n  search(\n    query=\"vLLM\",\n    limit=3\n  ),\n  done()\n]<|python_end|>\n");
  EXPECT_EQ(r.content, "");
  EXPECT_EQ(as_pairs(r.calls), (Calls{{"search", R"({"query":"vLLM","limit":3})"}, {"done", "{}"}}));
}

TEST(ToolParser, PythonicContent) {
  expect_content_only("pythonic", "Hello there! How can I help?");
  expect_content_only("pythonic", "[link](https://example.com) is a markdown link.");
  expect_content_only("pythonic", "[1, 2, 3]");
  expect_content_only("pythonic", "[]");
  expect_content_only("pythonic", "   ");
  expect_content_only("pythonic", "[f(a=1)] and some text");
  // Malformed calls.
  expect_content_only("pythonic", "[f(a=1, b=)]");
  expect_content_only("pythonic", "[f(a=1)");
  expect_content_only("pythonic", "[f(1, b=2)]");
  expect_content_only("pythonic", "[f(a=foo)]");
  expect_content_only("pythonic", "[f(a=1, a=2)]");
  expect_content_only("pythonic", "[f(a=(1, 2))]");
  expect_content_only("pythonic", "[f(a={1, 2})]");
  expect_content_only("pythonic", "[f(a='unterminated)]");
  expect_content_only("pythonic", "[f(a='line\nbreak')]");
  expect_content_only("pythonic", "[f(a=1j)]");
  expect_content_only("pythonic", "[f(a=007)]");
  expect_content_only("pythonic", "[f(a=1e999)]");
  expect_content_only("pythonic", "[f(a='\\ud800')]");
  expect_content_only("pythonic", "[f(a={[1]: 2})]");
  expect_content_only("pythonic", "[math.sqrt(x=2)]");
  expect_content_only("pythonic", "[f(a=" + std::string(70, '[') + std::string(70, ']') + ")]");
}

// ---- all parsers --------------------------------------------------------------------------------------------

// Streaming must stay linear: 1-byte deltas of long outputs (a long argument, long content) finish quickly.
TEST(ToolParser, LongOutputsStreamInLinearTime) {
  const std::string long_text(1 << 19, 'x');
  const std::string long_json_string = "\"" + long_text + "\"";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"hermes", "<tool_call>{\"name\": \"f\", \"arguments\": {\"s\": " + long_json_string + "}}</tool_call>"},
      {"hermes", long_text + "<tool_call"},
      {"llama3_json", "{\"name\": \"f\", \"parameters\": {\"s\": " + long_json_string + "}}"},
      {"mistral", "[TOOL_CALLS]f[ARGS]{\"s\": " + long_json_string + "}"},
      {"mistral", long_text},
      {"pythonic", "[f(s=" + long_json_string + ")]"},
      {"pythonic", "\n" + long_text},
  };
  for (const auto& [name, text] : cases) {
    const auto t0 = std::chrono::steady_clock::now();
    const ToolParseResult r = stream_in(*make_tool_parser(name), text, [] { return size_t{1}; });
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(seconds, 10.0) << name;
    EXPECT_EQ(r.calls.size() + r.content.size() / text.size(), 1u) << name;  // one call, or all content
  }
}

// Every parser returns content untouched when there is no call in it, whatever the deltas.
TEST(ToolParser, PlainProseIsContentForEveryParser) {
  const std::string prose = "Sure! Here's a summary:\n\n- item one\n- item two (with a [note])\n\nThanks, 東京 🙂";
  for (const std::string& name : tool_parser_names()) expect_content_only(name, prose);
}

// Outputs assembled at random from pieces of every format (markers, partial markers, calls, brackets, quotes,
// whitespace, prose), and well-formed outputs with pieces spliced in or a byte cut out: streaming agrees with
// parse(), and an output without calls comes back whole as content.
TEST(ToolParser, RandomFragmentsStreamLikeParse) {
  const std::vector<std::string> pieces = {
      "<tool_call>", "</tool_call>", "<tool_", "</tool", "[TOOL_CALLS]", "[TOOL_", "[ARGS]", "<|python_tag|>",
      "<|python_start|>", "<|python_end|>", "{\"name\": \"f\", \"arguments\": {\"a\": 1}}",
      "{\"name\": \"g\", \"parameters\": {}}", "[{\"name\": \"h\", \"arguments\": {}}]", "f(a=1)", "[g(b='x')]", "get",
      "{", "}", "[", "]", "\"", "'", "\\", ";", ",", "(", ")", "=", " ", "\n", "text", "東京",
  };
  const std::vector<std::string> well_formed = {
      "Hi.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1, \"]\"]}}\n</tool_call>\n<tool_call>\n"
      "{\"name\": \"g\", \"arguments\": {}}\n</tool_call>",
      "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"q\": \"x\"}}; {\"name\": \"g\", \"parameters\": {}}",
      "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": {\"b\": null}}}]",
      "Ok [TOOL_CALLS]f[ARGS]{\"a\": \"}\"}[TOOL_CALLS]g{}",
      "[f(a=1, b='x\\'y', c={'k': [None, True]}), g()]",
  };
  std::mt19937 rng(12345);
  size_t outputs_with_calls = 0;
  for (int i = 0; i < 400; ++i) {
    std::string text;
    if (i % 2 == 0) {
      for (size_t n = rng() % 8 + 1; n > 0; --n) text += pieces[rng() % pieces.size()];
    } else {
      text = well_formed[rng() % well_formed.size()];
      switch (rng() % 3) {
        case 0:
          break;
        case 1:
          text.insert(rng() % (text.size() + 1), pieces[rng() % pieces.size()]);
          break;
        case 2:
          text.erase(rng() % text.size(), 1);
          break;
      }
    }
    for (const std::string& name : tool_parser_names()) {
      const ToolParseResult r = parse_checked(name, text);
      if (r.calls.empty()) {
        EXPECT_EQ(r.content, text) << name;
      } else {
        ++outputs_with_calls;
      }
    }
  }
  EXPECT_GT(outputs_with_calls, 100u);  // the cases do make calls, not only content
}

}  // namespace
}  // namespace pagellm::chat
