#include "engine/stop_checker.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace pagellm {
namespace {

struct Case {
  const char* name;
  std::vector<std::string> stop;
  bool include_stop;
  std::vector<std::string> deltas;
  std::vector<std::string> emitted;  // one per delta fed (feeding ends at the stop)
  int32_t stop_index;                // -1: no stop
  std::string flushed;
};

TEST(StopChecker, Table) {
  const Case cases[] = {
      {"holds back a possible stop, then releases it", {"\n\nUser:"}, false,
       {"\n\n", "Hi"}, {"", "\n\nHi"}, -1, ""},
      {"stop spanning three deltas", {"\n\nUser:"}, false,
       {"Hello", "\n\nUs", "er:", " more"}, {"Hello", "", ""}, 0, ""},
      {"include_stop_str_in_output keeps the stop string", {"\n\nUser:"}, true,
       {"Hello", "\n\nUs", "er:"}, {"Hello", "\n\nUs", "er:"}, 0, ""},
      {"text after the stop inside the same delta is dropped", {"###"}, false,
       {"ab#", "## tail"}, {"ab", ""}, 0, ""},
      {"include keeps only up to the stop", {"###"}, true,
       {"ab#", "## tail"}, {"ab#", "##"}, 0, ""},
      {"stop at the very start", {"Hello"}, false, {"Hello world"}, {""}, 0, ""},
      {"several stops, the short one matches", {"STOP", "\n"}, false,
       {"ab", "c\nd"}, {"ab", "c"}, 1, ""},
      {"several stops, the long one matches", {"\n", "STOP"}, false,
       {"xST", "O", "P!"}, {"x", "", ""}, 1, ""},
      {"the stop that ends first wins", {"abcd", "bc"}, false, {"xabcd"}, {"xa"}, 1, ""},
      {"same end: the longer stop wins", {"cd", "bcd"}, false, {"abcde"}, {"a"}, 1, ""},
      {"flush releases held text", {"END"}, false, {"foo E"}, {"foo "}, -1, "E"},
      {"a broken prefix is released", {"abc"}, false, {"ab", "x"}, {"", "abx"}, -1, ""},
      {"overlapping prefixes", {"aab"}, false, {"a", "a", "a", "b"}, {"", "", "a", ""}, 0, ""},
      {"no stop strings: pass through", {}, false, {"one ", "two"}, {"one ", "two"}, -1, ""},
      {"multi-byte stop held whole", {"\xe2\x82\xacuro"}, false,
       {"x\xe2\x82\xac", "ur", "o"}, {"x", "", ""}, 0, ""},
      {"multi-byte prefix released whole", {"\xc3\xa9!"}, false,
       {"caf\xc3\xa9", "?"}, {"caf", "\xc3\xa9?"}, -1, ""},
      {"a split code point is held until complete", {}, false,
       {"a\xe2\x82", "\xac b"}, {"a", "\xe2\x82\xac b"}, -1, ""},
      {"split code point inside a possible stop", {"\xe2\x82\xac!"}, false,
       {"a\xe2", "\x82\xac", "!"}, {"a", "", ""}, 0, ""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    StopChecker checker(c.stop, c.include_stop);
    std::vector<std::string> emitted;
    StopCheckResult r;
    for (const std::string& d : c.deltas) {
      r = checker.feed(d);
      emitted.push_back(r.text);
      if (r.stopped) break;
    }
    EXPECT_EQ(emitted, c.emitted);
    EXPECT_EQ(r.stopped, c.stop_index >= 0);
    EXPECT_EQ(r.stop_index, c.stop_index);
    EXPECT_EQ(checker.stop_index(), c.stop_index);
    if (c.stop_index >= 0) {
      EXPECT_EQ(checker.matched_stop(), c.stop[c.stop_index]);
    }
    EXPECT_EQ(checker.flush(), c.flushed);
  }
}

TEST(StopChecker, HeldBytesCountsWhatIsNotOutYet) {
  StopChecker checker({"\n\nUser:"});
  EXPECT_EQ(checker.feed("Hi\n\nUs").text, "Hi");
  EXPECT_EQ(checker.held_bytes(), 4u);
  EXPECT_EQ(checker.feed("e").text, "");
  EXPECT_EQ(checker.held_bytes(), 5u);
  EXPECT_EQ(checker.flush(), "\n\nUse");
  EXPECT_EQ(checker.held_bytes(), 0u);

  StopChecker including({"\n\nUser:"}, true);
  EXPECT_EQ(including.feed("Hi\n\nUs").text, "Hi\n\nUs");  // out at once, still watched
  EXPECT_EQ(including.held_bytes(), 0u);
  const StopCheckResult r = including.feed("er: more");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "er:");
}

TEST(StopChecker, NothingAfterTheStop) {
  StopChecker checker({"x"});
  EXPECT_TRUE(checker.feed("abxcd").stopped);
  const StopCheckResult r = checker.feed("more");
  EXPECT_TRUE(r.text.empty());
  EXPECT_FALSE(r.stopped);
  EXPECT_TRUE(checker.stopped());
  EXPECT_EQ(checker.flush(), "");
}

TEST(StopChecker, CanStopFalseDefersMatching) {
  {  // A stop string complete while stopping is not allowed does not count.
    StopChecker checker({"ab"});
    EXPECT_EQ(checker.feed("xab", false).text, "xab");
    const StopCheckResult r = checker.feed("cab");
    EXPECT_TRUE(r.stopped);
    EXPECT_EQ(r.text, "c");
  }
  {  // One that starts before and ends after the min_tokens boundary counts.
    StopChecker checker({"ab"});
    EXPECT_EQ(checker.feed("xa", false).text, "x");
    const StopCheckResult r = checker.feed("b");
    EXPECT_TRUE(r.stopped);
    EXPECT_EQ(r.text, "");
  }
  {  // A shorter stop complete inside a held prefix of a longer one does not count later.
    StopChecker checker({"ab", "xaby"});
    EXPECT_EQ(checker.feed("xab", false).text, "");
    const StopCheckResult r = checker.feed("y");
    EXPECT_TRUE(r.stopped);
    EXPECT_EQ(r.stop_index, 1);
    EXPECT_EQ(r.text, "");
  }
}

// The result does not depend on how the text is split into deltas: it equals
// cutting the whole text at the stop string that ends first.
TEST(StopChecker, AnySplitGivesTheSameOutput) {
  const std::vector<std::string> stops = {"ab", "bca", "cc", "abcab"};
  std::mt19937 gen(5);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string text;
    const int len = 1 + gen() % 20;
    for (int i = 0; i < len; ++i) text.push_back("abcd"[gen() % 4]);
    const bool include = trial % 2;

    // Reference on the whole text.
    size_t best_end = std::string::npos, best_start = 0;
    int32_t best = -1;
    for (size_t i = 0; i < stops.size(); ++i) {
      const size_t pos = text.find(stops[i]);
      if (pos == std::string::npos) continue;
      const size_t end = pos + stops[i].size();
      if (end < best_end || (end == best_end && pos < best_start)) {
        best_end = end;
        best_start = pos;
        best = static_cast<int32_t>(i);
      }
    }
    const std::string expected =
        best < 0 ? text : text.substr(0, include ? best_end : best_start);

    StopChecker checker(stops, include);
    std::string out;
    size_t at = 0;
    bool stopped = false;
    while (at < text.size() && !stopped) {
      const size_t n = 1 + gen() % 4;
      const StopCheckResult r = checker.feed(std::string_view(text).substr(at, n));
      at += n;
      out += r.text;
      stopped = r.stopped;
      // Emitted text is never later taken back.
      ASSERT_EQ(expected.compare(0, out.size(), out), 0) << text;
    }
    if (!stopped) out += checker.flush();
    EXPECT_EQ(out, expected) << text;
    EXPECT_EQ(checker.stop_index(), best) << text;
  }
}

}  // namespace
}  // namespace pagellm
