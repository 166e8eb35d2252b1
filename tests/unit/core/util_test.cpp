#include "core/util.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace pagellm {

TEST(Util, ParsesByteSizes) {
  EXPECT_EQ(parse_byte_size("2GiB"), int64_t{2} << 30);
  EXPECT_EQ(parse_byte_size("512MiB"), int64_t{512} << 20);
  EXPECT_EQ(parse_byte_size("1.5G"), int64_t{3} << 29);
  EXPECT_EQ(parse_byte_size("1000"), 1000);
  EXPECT_EQ(parse_byte_size("3MB"), 3000000);
  EXPECT_THROW(parse_byte_size("lots"), Error);
  EXPECT_THROW(parse_byte_size("3 parsecs"), Error);
  EXPECT_THROW(parse_byte_size("-1G"), Error);
}

TEST(Util, Utf8Validation) {
  EXPECT_TRUE(is_valid_utf8("hello"));
  EXPECT_TRUE(is_valid_utf8("h\xc3\xa9llo \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x98\x80"));
  EXPECT_FALSE(is_valid_utf8("\xc3"));
  EXPECT_FALSE(is_valid_utf8("\xc0\xaf"));          // overlong
  EXPECT_FALSE(is_valid_utf8("\xed\xa0\x80"));      // surrogate
  EXPECT_FALSE(is_valid_utf8("\xf4\x90\x80\x80"));  // > U+10FFFF
  EXPECT_FALSE(is_valid_utf8("\xff"));
}

TEST(Util, Utf8CompletePrefixHoldsBackPartialCodePoints) {
  EXPECT_EQ(utf8_complete_prefix("abc"), 3u);
  EXPECT_EQ(utf8_complete_prefix("ab\xe4\xbd"), 2u);
  EXPECT_EQ(utf8_complete_prefix("ab\xe4\xbd\xa0"), 5u);
  EXPECT_EQ(utf8_complete_prefix("\xf0\x9f\x98"), 0u);
  EXPECT_EQ(utf8_complete_prefix(""), 0u);
}

}  // namespace pagellm
