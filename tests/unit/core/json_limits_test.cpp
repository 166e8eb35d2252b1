#include "core/json_limits.h"

#include <gtest/gtest.h>
#include <malloc.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "core/error.h"
#include "hostile_input.h"
#include "test_paths.h"

namespace pagellm {
namespace {

using nlohmann::json;
using test::error_of;

std::string nested_objects(size_t depth, const std::string& inner = "1") {
  std::string s;
  s.reserve(depth * 6 + inner.size());
  for (size_t k = 0; k < depth; ++k) s += "{\"a\":";
  s += inner;
  s.append(depth, '}');
  return s;
}

std::string nested_arrays(size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); }

std::string repeated(const std::string& item, size_t n, const char* open = "[", const char* close = "]") {
  std::string s = open;
  for (size_t k = 0; k < n; ++k) s += (k ? "," : "") + item;
  return s + close;
}

}  // namespace

TEST(JsonLimits, DeepChatMessageIsRefusedByDepth) {
  // 100,000 levels (600 KB) inside a chat message: copying such a DOM
  // recursed the server to SIGSEGV.
  const std::string body =
      R"({"model": "m", "messages": [{"role": "user", "content": )" + nested_objects(100000) + "}]}";
  EXPECT_EQ(error_of([&] {
              parse_json_bounded(body, kRequestJsonLimits, "request body");
            }).rfind("request body: JSON nesting depth exceeds the limit of 64", 0),
            0u);
  const std::string kwargs = R"({"messages": [], "chat_template_kwargs": )" + nested_arrays(100000) + "}";
  EXPECT_NE(error_of([&] {
              parse_json_bounded(kwargs, kRequestJsonLimits, "request body");
            }).find("JSON nesting depth exceeds the limit of 64"),
            std::string::npos);
}

TEST(JsonLimits, DepthLimitIsExact) {
  JsonLimits l;
  l.max_depth = 5;
  EXPECT_NO_THROW(parse_json_bounded(nested_arrays(5), l, "x"));
  EXPECT_NO_THROW(parse_json_bounded(nested_objects(5), l, "x"));
  EXPECT_NE(error_of([&] { parse_json_bounded(nested_arrays(6), l, "x"); }).find("depth exceeds the limit of 5"),
            std::string::npos);
  EXPECT_EQ(estimate_json_cost(nested_arrays(1000)).depth, 1000u);
  EXPECT_EQ(estimate_json_cost("1").depth, 0u);
  // Brackets inside strings, escaped quotes included, do not nest.
  EXPECT_EQ(estimate_json_cost(R"(["[[[\"[[[", {"k\"{{": "}}]]"}])").depth, 2u);
}

TEST(JsonLimits, ElementCount) {
  EXPECT_EQ(estimate_json_cost("[1, 2.5, true, null, \"s\", {\"k\": [false]}]").elements, 9u);
  EXPECT_EQ(estimate_json_cost(R"({"a\"b": "c", "d": {}})").elements, 3u);  // keys are not elements
  JsonLimits l;
  l.max_elements = 100;
  EXPECT_NO_THROW(parse_json_bounded(repeated("0", 99), l, "x"));
  EXPECT_NE(error_of([&] {
              parse_json_bounded(repeated("0", 100), l, "x");
            }).find("x: JSON element count exceeds the limit of 100"),
            std::string::npos);
}

TEST(JsonLimits, EmptyObjectFloodIsRefusedByMemory) {
  // 15 MB of "[{},{},...]": ~560 MB of DOM each; eight at once reached 4.5 GB.
  const std::string body = "{\"messages\": " + repeated("{}", 5'000'000) + "}";
  ASSERT_GT(body.size(), 14'000'000u);
  const std::string msg = error_of([&] { parse_json_bounded(body, kRequestJsonLimits, "request body"); });
  EXPECT_NE(msg.find("request body: JSON estimated memory exceeds the limit of 67108864 bytes"), std::string::npos)
      << msg;
  // The same count of small numbers fits the element limit but not the memory
  // budget either (32 bytes each).
  EXPECT_GT(estimate_json_cost(repeated("1", 5'000'000)).memory_bytes, kRequestJsonLimits.max_memory_bytes);
}

TEST(JsonLimits, OrdinaryBodiesPass) {
  // A 16 MiB prompt and 1M token ids are ordinary requests.
  const std::string text(16u << 20, 'a');
  EXPECT_NO_THROW(parse_json_bounded("{\"prompt\": \"" + text + "\"}", kRequestJsonLimits, "request body"));
  EXPECT_NO_THROW(
      parse_json_bounded("{\"prompt\": " + repeated("12345", 1'000'000) + "}", kRequestJsonLimits, "request body"));
}

TEST(JsonLimits, MalformedJsonKeepsTheParserMessage) {
  const std::string msg = error_of([] { parse_json_bounded("{\"a\": [1, 2", kRequestJsonLimits, "request body"); });
  EXPECT_EQ(msg.rfind("request body is not valid JSON: [json.exception.parse_error.101]", 0), 0u) << msg;
  for (const char* bad : {"", "]]]]", "}", "\"unterminated", "[1,,]", "{\"a\" 1}", "\\", "[\"\\"})
    EXPECT_NE(error_of([&] { parse_json_bounded(bad, kRequestJsonLimits, "x"); }), "") << bad;
}

TEST(JsonLimits, TextSizeAndFiles) {
  JsonLimits l;
  l.max_text_bytes = 10;
  EXPECT_NE(error_of([&] {
              parse_json_bounded("[1,2,3,4,5,6]", l, "x");
            }).find("x: JSON text of 13 bytes exceeds the limit of 10 bytes"),
            std::string::npos);
  const std::string path = test::temp_dir() + "/limits.json";
  std::ofstream(path) << R"({"a": [1, 2, 3, 4, 5]})";
  EXPECT_NE(error_of([&] { read_json_file_bounded(path, l); }).find("exceeds the limit of 10 bytes"),
            std::string::npos);
  l.max_text_bytes = 100;
  EXPECT_EQ(read_json_file_bounded(path, l)["a"].size(), 5u);
  EXPECT_NE(error_of([&] { read_json_file_bounded(path + ".missing", l); }).find("cannot read"), std::string::npos);
}

// The estimate against glibc's count of the bytes the DOM really holds.
// Sanitizer builds replace malloc, so mallinfo2 means nothing there.
TEST(JsonLimits, MemoryEstimateMatchesTheHeap) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "mallinfo2 does not see ASan's allocator";
#endif
  const std::string long_str = "\"" + std::string(40, 'x') + "\"";
  struct Shape {
    const char* name;
    std::string text;
  };
  std::string members = "{";
  for (int k = 0; k < 200'000; ++k) members += fmt::format("{}\"key_{:016d}\": {}", k ? "," : "", k, k);
  members += "}";
  const Shape shapes[] = {
      {"empty objects", repeated("{}", 300'000)},
      {"small ints", repeated("7", 600'000)},
      {"long strings", repeated(long_str, 200'000)},
      {"short strings", repeated("\"abc\"", 300'000)},
      {"long-key members", members},
      {"records", repeated(R"({"id": 1, "role": "user", "ids": [1, 2, 3]})", 100'000)},
  };
  for (const auto& s : shapes) {
    malloc_trim(0);
    const struct mallinfo2 before = mallinfo2();
    auto* j = new json(json::parse(s.text));
    const struct mallinfo2 after = mallinfo2();
    const double used = static_cast<double>((after.uordblks + after.hblkhd) - (before.uordblks + before.hblkhd));
    delete j;
    const double est = static_cast<double>(estimate_json_cost(s.text).memory_bytes);
    std::printf("  %-18s text %8zu  heap %10.0f  estimate %10.0f  ratio %.2f\n", s.name, s.text.size(), used, est,
                est / used);
    // Roughly right, and not much below: the estimate is a budget.
    EXPECT_GT(est, 0.8 * used) << s.name;
    EXPECT_LT(est, 2.5 * used) << s.name;
  }
}

}  // namespace pagellm
