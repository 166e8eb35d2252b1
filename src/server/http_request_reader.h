// One HTTP/1.x request read from the wire with every limit applied before the
// bytes are kept: the head (request line, header count and size), the body
// (Content-Length or chunked, counted on the wire and after decoding) and
// gzip/deflate bodies (inflated only up to the body limit). Pure bookkeeping
// over bytes the caller feeds in; no sockets, so it is unit-tested and fuzzed
// directly. The result is re-serialised as a plain request (Content-Length,
// no Transfer-Encoding / Content-Encoding) for the route handlers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pagellm::server {

struct HttpLimits {
  size_t max_body_bytes = 16u << 20;        // decoded (and inflated) body; --max-request-bytes
  size_t max_header_bytes = 64u << 10;      // request line + all header lines
  size_t max_header_line_bytes = 8u << 10;  // one line (the request line too: longer is 414)
  size_t max_header_count = 100;
};

struct RequestHead {
  std::string method, target, version;                      // "POST", "/v1/completions", "HTTP/1.1"
  std::vector<std::pair<std::string, std::string>> headers;  // in order, names as sent
  // Value of the first header named `name` (any case), or "".
  std::string_view header(std::string_view name) const;
  bool has_header(std::string_view name) const;
  std::string path() const;  // target without the query
};

// A reply the reader (or a check before the body) decided on: the request
// is refused with `status` and the connection closes after it.
struct HttpRefusal {
  int status = 0;
  std::string message;
  std::string code;  // OpenAI-style error code, e.g. "request_too_large"
};

class HttpRequestReader {
 public:
  enum class State { kHead, kBody, kComplete, kFailed };

  explicit HttpRequestReader(HttpLimits limits) : limits_(limits) {}

  // Consumes bytes from `data` and returns how many were used; bytes after a
  // complete request (a pipelined next one) are left to the caller.
  size_t feed(std::string_view data);
  State state() const { return state_; }
  bool head_ready() const { return state_ == State::kBody || state_ == State::kComplete; }
  const RequestHead& head() const { return head_; }
  const HttpRefusal& refusal() const { return refusal_; }
  // Whether any byte of a request has arrived (idle keep-alive vs. a slow head).
  bool started() const { return started_; }
  // Whether the client asked for "100 Continue" before it sends the body.
  bool expects_continue() const { return expects_continue_; }

  // kComplete: the request as a plain HTTP/1.x message with the decoded
  // body and its Content-Length (what the handlers parse).
  std::string normalized() const;
  const std::string& body() const { return body_; }

  // Starts over for the next request on the same connection.
  void reset();

 private:
  size_t feed_head(std::string_view data);
  size_t feed_body(std::string_view data);
  size_t feed_chunked(std::string_view data);
  void parse_head();
  void finish_body();
  void refuse(int status, std::string message, std::string code = "");

  HttpLimits limits_;
  State state_ = State::kHead;
  bool started_ = false;
  bool expects_continue_ = false;
  std::string pending_;  // head bytes so far; in chunked mode, the line being read
  RequestHead head_;
  HttpRefusal refusal_;

  // Body framing.
  bool chunked_ = false;
  uint64_t content_length_ = 0;
  std::string content_encoding_;  // "", "gzip" or "deflate"
  size_t wire_body_bytes_ = 0;    // body bytes as sent (chunk framing included)
  enum class Chunk { kSize, kData, kDataEnd, kTrailer } chunk_ = Chunk::kSize;
  uint64_t chunk_left_ = 0;
  size_t trailer_bytes_ = 0;
  std::string body_;
};

// Inflates a gzip or zlib ("deflate") body; refuses (413) output past
// `max_bytes` without producing it, and 400 for corrupt data.
bool inflate_body(const std::string& in, const std::string& encoding, size_t max_bytes, std::string& out,
                  HttpRefusal& refusal);

// The reason phrase of a status code ("Payload Too Large").
const char* http_status_text(int status);

}  // namespace pagellm::server
