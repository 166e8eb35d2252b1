#include "api/utf8_check.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

#include "core/error.h"
#include "core/util.h"

namespace pagellm::api {
namespace {

TEST(ServerUtf8, FindsTheFirstInvalidByte) {
  struct Case {
    std::string text;
    std::optional<size_t> bad;
  };
  const Case cases[] = {
      {"", std::nullopt},
      {"plain ascii", std::nullopt},
      {"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", std::nullopt},  // é € 😀
      {"\xf4\x8f\xbf\xbf", std::nullopt},                           // U+10FFFF
      {"ab\xff", 2},                                                // never valid
      {"a\x80", 1},                                                 // stray continuation
      {"\xc0\xaf", 0},                                              // overlong '/'
      {"\xe0\x80\xaf", 0},                                          // overlong, 3 bytes
      {"x\xed\xa0\x80", 1},                                         // UTF-16 surrogate D800
      {"\xf4\x90\x80\x80", 0},                                      // > U+10FFFF
      {"ok\xe2\x82", 2},                                            // truncated at the end
      {"\xe2\x82x", 0},                                             // truncated in the middle
      {"\xc3\xa9\xc3", 2},
  };
  for (const Case& c : cases) EXPECT_EQ(find_invalid_utf8(c.text), c.bad) << testing::PrintToString(c.text);
}

TEST(ServerUtf8, RequireNamesTheParameterAndOffset) {
  EXPECT_NO_THROW(require_valid_utf8("fine \xc3\xa9", "prompt"));
  try {
    require_valid_utf8("abc\xfe", "prompt");
    FAIL() << "no throw";
  } catch (const InvalidRequest& e) {
    EXPECT_EQ(e.param(), "prompt");
    EXPECT_NE(std::string(e.what()).find("offset 3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("0xFE"), std::string::npos) << e.what();
  }
}

TEST(ServerUtf8, SanitizeAndLength) {
  EXPECT_EQ(sanitize_utf8("a\xffz"), "a\xef\xbf\xbdz");
  EXPECT_EQ(sanitize_utf8("\xe2\x82"), "\xef\xbf\xbd\xef\xbf\xbd");
  EXPECT_EQ(sanitize_utf8("caf\xc3\xa9"), "caf\xc3\xa9");
  EXPECT_EQ(utf8_length(""), 0u);
  EXPECT_EQ(utf8_length("caf\xc3\xa9"), 4u);
  EXPECT_EQ(utf8_length("\xf0\x9f\x98\x80!"), 2u);
  EXPECT_EQ(utf8_length("a\xff"), 2u);  // an invalid byte counts one, as U+FFFD
}

// Random byte strings: the finder agrees with core's validator, and
// sanitizing always gives valid UTF-8 that keeps valid input unchanged.
TEST(ServerUtf8, RandomBytes) {
  std::mt19937 rng(1234);
  const std::string alphabet[] = {"a",    " ",    "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80",
                                  "\x80", "\xbf", "\xc0",     "\xe0",         "\xed",
                                  "\xf4", "\xf5", "\xff",     "\xc3",         "\xe2\x82"};
  std::uniform_int_distribution<size_t> pick(0, std::size(alphabet) - 1), len(0, 12);
  for (int i = 0; i < 5000; ++i) {
    std::string s;
    for (size_t k = len(rng); k > 0; --k) s += alphabet[pick(rng)];
    const bool valid = !find_invalid_utf8(s).has_value();
    EXPECT_EQ(valid, is_valid_utf8(s)) << testing::PrintToString(s);
    const std::string clean = sanitize_utf8(s);
    EXPECT_TRUE(is_valid_utf8(clean)) << testing::PrintToString(s);
    if (valid) {
      EXPECT_EQ(clean, s);
    }
    EXPECT_EQ(utf8_length(s), utf8_length(clean));
  }
}

}  // namespace
}  // namespace pagellm::api
