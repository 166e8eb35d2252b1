#include "bench/sse.h"

#include <gtest/gtest.h>

namespace pagellm::bench {
namespace {

const std::string kStream =
    ": keep-alive comment\n"
    "data: {\"a\":1}\n\n"
    "event: message\r\ndata: {\"b\":2}\r\n\r\n"
    "data: line one\ndata: line two\n\n"
    "id: 7\n\n"  // no data: no event
    "data:[DONE]\n\n";
const std::vector<std::string> kExpected = {"{\"a\":1}", "{\"b\":2}", "line one\nline two", "[DONE]"};

TEST(BenchSse, WholeStream) {
  SseParser p;
  EXPECT_EQ(p.feed(kStream.data(), kStream.size()), kExpected);
  EXPECT_TRUE(p.finish().empty());
}

TEST(BenchSse, SplitAtEveryByte) {
  // Chunk boundaries fall anywhere in real streams, CRLF pairs included.
  for (size_t cut = 0; cut <= kStream.size(); ++cut) {
    SseParser p;
    std::vector<std::string> got = p.feed(kStream.data(), cut);
    const auto rest = p.feed(kStream.data() + cut, kStream.size() - cut);
    got.insert(got.end(), rest.begin(), rest.end());
    EXPECT_EQ(got, kExpected) << "cut at " << cut;
  }
  SseParser p;
  std::vector<std::string> got;
  for (char c : kStream)
    for (auto& e : p.feed(&c, 1)) got.push_back(e);
  EXPECT_EQ(got, kExpected);
}

TEST(BenchSse, UnterminatedLastEvent) {
  SseParser p;
  const std::string s = "data: x\n\ndata: tail";
  EXPECT_EQ(p.feed(s.data(), s.size()), std::vector<std::string>{"x"});
  EXPECT_GT(p.buffered(), 0u);
  EXPECT_EQ(p.finish(), std::vector<std::string>{"tail"});
}

}  // namespace
}  // namespace pagellm::bench
