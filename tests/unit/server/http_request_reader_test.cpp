// HttpRequestReader: framing, limits and decoding, fed whole and byte by byte.
#include "server/http_request_reader.h"

#include <gtest/gtest.h>
#include <fmt/format.h>
#include <zlib.h>

#include <random>

namespace pagellm::server {
namespace {

using State = HttpRequestReader::State;

HttpLimits small_limits() {
  HttpLimits l;
  l.max_body_bytes = 1000;
  l.max_header_bytes = 2000;
  l.max_header_line_bytes = 500;
  l.max_header_count = 10;
  return l;
}

// Feeds `wire` in pieces of `step` bytes; returns the bytes used.
size_t feed_in_steps(HttpRequestReader& r, std::string_view wire, size_t step) {
  size_t used = 0;
  while (used < wire.size() && (r.state() == State::kHead || r.state() == State::kBody)) {
    const size_t n = r.feed(wire.substr(used, std::min(step, wire.size() - used)));
    used += n;
    if (n == 0) break;
  }
  return used;
}

std::string repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

std::string compress(const std::string& s, bool gzip) {
  z_stream z{};
  deflateInit2(&z, 9, Z_DEFLATED, gzip ? 16 + MAX_WBITS : MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
  std::string out(deflateBound(&z, s.size()) + 32, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(s.data()));
  z.avail_in = static_cast<uInt>(s.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

TEST(HttpRequestReader, ContentLengthBodyInAnyPieces) {
  const std::string wire = "POST /v1/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 11\r\n\r\nhello world";
  for (size_t step : {1, 2, 7, 1000}) {
    HttpRequestReader r(small_limits());
    EXPECT_EQ(feed_in_steps(r, wire, step), wire.size());
    ASSERT_EQ(r.state(), State::kComplete) << step;
    EXPECT_EQ(r.head().method, "POST");
    EXPECT_EQ(r.head().path(), "/v1/completions");
    EXPECT_EQ(r.head().header("host"), "a");
    EXPECT_EQ(r.body(), "hello world");
  }
}

TEST(HttpRequestReader, LeavesAPipelinedRequestUnread) {
  const std::string one = "GET /health HTTP/1.1\r\n\r\n";
  HttpRequestReader r(small_limits());
  EXPECT_EQ(r.feed(one + one), one.size());
  EXPECT_EQ(r.state(), State::kComplete);
}

TEST(HttpRequestReader, ChunkedBodyWithExtensionsAndTrailers) {
  const std::string wire =
      "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-T: 1\r\n\r\n";
  for (size_t step : {1, 3, 1000}) {
    HttpRequestReader r(small_limits());
    EXPECT_EQ(feed_in_steps(r, wire, step), wire.size());
    ASSERT_EQ(r.state(), State::kComplete) << step;
    EXPECT_EQ(r.body(), "hello world");
    const std::string n = r.normalized();
    EXPECT_NE(n.find("Content-Length: 11\r\n\r\nhello world"), std::string::npos);
    EXPECT_EQ(n.find("Transfer-Encoding"), std::string::npos);
  }
}

TEST(HttpRequestReader, ChunkedBodyPastTheLimitIsRefusedAtTheChunkHead) {
  HttpRequestReader r(small_limits());
  r.feed("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3e8\r\n");  // 1000: fits
  EXPECT_EQ(r.state(), State::kBody);
  r.feed(std::string(1000, 'x') + "\r\n1\r\n");  // one byte more
  ASSERT_EQ(r.state(), State::kFailed);
  EXPECT_EQ(r.refusal().status, 413);
}

TEST(HttpRequestReader, RefusalsNameTheLimit) {
  struct Case {
    std::string wire;
    int status;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"POST / HTTP/1.1\r\nContent-Length: 1001\r\n\r\n", 413, "exceeds the limit of 1000 bytes"},
      {"GET /" + std::string(600, 'a') + " HTTP/1.1\r\n\r\n", 414, "limit of 500 bytes"},
      {"GET / HTTP/1.1\r\nX: " + std::string(600, 'a') + "\r\n\r\n", 431, "limit of 500 bytes"},
      {"GET / HTTP/1.1\r\n" + repeat("A: bb\r\n", 11) + "\r\n", 431, "more than 10 headers"},
      {"GET / HTTP/1.1\r\n" + repeat("A: b\r\n", 400), 431, "limit of 2000 bytes"},
      {"GET / HTTP/3\r\n\r\n", 505, "not supported"},
      {"GET / FOO\r\n\r\n", 400, "malformed HTTP request line"},
      {"GET noslash HTTP/1.1\r\n\r\n", 400, "malformed HTTP request line"},
      {"GET / HTTP/1.1\r\n folded: x\r\n\r\n", 400, "malformed HTTP header line"},
      {"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400, "conflicting Content-Length"},
      {"POST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n", 400, "both"},
      {"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501, "only chunked"},
      {"POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\n", 400, "invalid Content-Length"},
      {"POST / HTTP/1.1\r\nContent-Length: 18446744073709551616\r\n\r\n", 400, "invalid Content-Length"},
      {"POST / HTTP/1.1\r\nContent-Encoding: br\r\n\r\n", 415, "'br' is not supported"},
      {"POST / HTTP/1.1\r\nExpect: 200-ok\r\n\r\n", 417, "not supported"},
      {"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffff\r\n", 400, "malformed chunk size"},
      {"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n", 400, "longer than its declared size"},
  };
  for (const Case& c : cases) {
    HttpRequestReader r(small_limits());
    r.feed(c.wire);
    ASSERT_EQ(r.state(), State::kFailed) << c.wire.substr(0, 80);
    EXPECT_EQ(r.refusal().status, c.status) << c.wire.substr(0, 80);
    EXPECT_NE(r.refusal().message.find(c.message), std::string::npos) << r.refusal().message;
  }
}

TEST(HttpRequestReader, HeadMemoryStaysBoundedByTheLimit) {
  HttpRequestReader r(small_limits());
  const std::string flood(100000, 'a');
  r.feed("GET / HTTP/1.1\r\nX: ");
  r.feed(flood);
  EXPECT_EQ(r.state(), State::kFailed);
  EXPECT_EQ(r.refusal().status, 431);
}

TEST(HttpRequestReader, InflatesGzipAndDeflateBodies) {
  const std::string plain = R"({"prompt": "hello"})";
  for (bool gzip : {true, false}) {
    const std::string z = compress(plain, gzip);
    HttpRequestReader r(small_limits());
    r.feed(fmt::format("POST / HTTP/1.1\r\nContent-Encoding: {}\r\nContent-Length: {}\r\n\r\n", gzip ? "gzip" : "deflate",
                       z.size()) +
           z);
    ASSERT_EQ(r.state(), State::kComplete);
    EXPECT_EQ(r.body(), plain);
    EXPECT_EQ(r.normalized().find("Content-Encoding"), std::string::npos);
  }
}

TEST(HttpRequestReader, GzipBombStopsAtTheLimit) {
  const std::string z = compress(std::string(10'000'000, '\0'), true);
  HttpLimits limits = small_limits();
  limits.max_body_bytes = 100'000;
  ASSERT_LT(z.size(), limits.max_body_bytes);  // the wire size fits; the inflated one does not
  HttpRequestReader r(limits);
  r.feed(fmt::format("POST / HTTP/1.1\r\nContent-Encoding: gzip\r\nContent-Length: {}\r\n\r\n", z.size()) + z);
  ASSERT_EQ(r.state(), State::kFailed);
  EXPECT_EQ(r.refusal().status, 413);
  EXPECT_NE(r.refusal().message.find("decompressed"), std::string::npos);
}

TEST(HttpRequestReader, CorruptGzipIs400) {
  std::string z = compress("hello hello hello", true);
  z[z.size() / 2] ^= 0x55;
  z.resize(z.size() - 4);
  HttpRequestReader r(small_limits());
  r.feed(fmt::format("POST / HTTP/1.1\r\nContent-Encoding: gzip\r\nContent-Length: {}\r\n\r\n", z.size()) + z);
  ASSERT_EQ(r.state(), State::kFailed);
  EXPECT_EQ(r.refusal().status, 400);
}

TEST(HttpRequestReader, ExpectContinueAndReset) {
  HttpRequestReader r(small_limits());
  r.feed("POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n");
  EXPECT_TRUE(r.head_ready());
  EXPECT_TRUE(r.expects_continue());
  r.feed("ok");
  EXPECT_EQ(r.state(), State::kComplete);
  r.reset();
  EXPECT_EQ(r.state(), State::kHead);
  EXPECT_FALSE(r.started());
  r.feed("\r\n");  // empty lines before a request are skipped
  EXPECT_FALSE(r.started());
}

// Random bytes in random pieces: the reader ends in a defined state and
// never keeps more than its limits allow.
TEST(HttpRequestReader, RandomInputNeverOverflowsItsLimits) {
  std::mt19937 rng(7);
  const std::string alphabet = "GET POST /HTTP/1.1\r\n:abcContent-Length: 10 Transfer-Encoding chunked 0123456789abcdef;";
  for (int iter = 0; iter < 2000; ++iter) {
    std::string wire;
    const size_t n = rng() % 3000;
    for (size_t i = 0; i < n; ++i) wire += alphabet[rng() % alphabet.size()];
    HttpRequestReader r(small_limits());
    feed_in_steps(r, wire, 1 + rng() % 64);
    EXPECT_LE(r.body().size(), 1000u);
  }
}

}  // namespace
}  // namespace pagellm::server
