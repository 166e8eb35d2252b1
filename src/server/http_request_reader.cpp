#include "server/http_request_reader.h"

#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <charconv>

namespace pagellm::server {
namespace {

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) { return std::tolower(x) == std::tolower(y); });
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// RFC 9110 token characters (header names, methods).
bool is_token(std::string_view s) {
  if (s.empty()) return false;
  for (unsigned char c : s)
    if (!(std::isalnum(c) || std::string_view("!#$%&'*+-.^_`|~").find(static_cast<char>(c)) != std::string_view::npos))
      return false;
  return true;
}

std::string lower(std::string_view s) {
  std::string r(s);
  for (char& c : r) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

}  // namespace

std::string_view RequestHead::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (iequals(k, name)) return v;
  return {};
}

bool RequestHead::has_header(std::string_view name) const {
  return std::any_of(headers.begin(), headers.end(), [&](const auto& h) { return iequals(h.first, name); });
}

std::string RequestHead::path() const { return target.substr(0, target.find('?')); }

void HttpRequestReader::reset() { *this = HttpRequestReader(limits_); }

void HttpRequestReader::refuse(int status, std::string message, std::string code) {
  state_ = State::kFailed;
  refusal_ = {status, std::move(message), std::move(code)};
  pending_.clear();
  body_.clear();
}

size_t HttpRequestReader::feed(std::string_view data) {
  size_t used = 0;
  while (used < data.size() && (state_ == State::kHead || state_ == State::kBody)) {
    const size_t n = state_ == State::kHead ? feed_head(data.substr(used)) : feed_body(data.substr(used));
    used += n;
    if (n == 0) break;
  }
  // A request without a body completes as soon as its head does.
  if (state_ == State::kBody && !chunked_ && content_length_ == 0) finish_body();
  return used;
}

size_t HttpRequestReader::feed_head(std::string_view data) {
  // Empty lines before a request line are ignored (RFC 9112 2.2).
  size_t used = 0;
  if (pending_.empty())
    while (used < data.size() && (data[used] == '\r' || data[used] == '\n')) used++;
  if (used < data.size()) started_ = true;
  // Look for the blank line that ends the head, starting a few bytes back in
  // case it straddles two reads.
  const size_t scan_from = pending_.size() > 3 ? pending_.size() - 3 : 0;
  const size_t room = limits_.max_header_bytes + 4 - std::min(pending_.size(), limits_.max_header_bytes + 4);
  const size_t take = std::min(data.size() - used, room);
  pending_.append(data.substr(used, take));
  const size_t end = pending_.find("\r\n\r\n", scan_from);
  if (end == std::string::npos) {
    const size_t first_line = pending_.find("\r\n");
    if ((first_line == std::string::npos ? pending_.size() : first_line) > limits_.max_header_line_bytes)
      refuse(414, fmt::format("the request line exceeds the limit of {} bytes", limits_.max_header_line_bytes),
             "uri_too_long");
    else if (pending_.size() > limits_.max_header_bytes)
      refuse(431, fmt::format("the request headers exceed the limit of {} bytes", limits_.max_header_bytes),
             "headers_too_large");
    return used + take;
  }
  // Bytes past the head belong to the body: give them back.
  const size_t head_len = end + 4;
  const size_t extra = pending_.size() - head_len;
  pending_.resize(head_len);
  if (head_len > limits_.max_header_bytes + 4) {
    refuse(431, fmt::format("the request headers exceed the limit of {} bytes", limits_.max_header_bytes),
           "headers_too_large");
    return used + take - extra;
  }
  parse_head();
  pending_.clear();
  return used + take - extra;
}

void HttpRequestReader::parse_head() {
  std::string_view rest(pending_);
  rest.remove_suffix(2);  // the blank line's CRLF; each line below ends in CRLF
  auto next_line = [&rest](std::string_view& line) {
    const size_t eol = rest.find("\r\n");
    if (eol == std::string_view::npos) return false;
    line = rest.substr(0, eol);
    rest.remove_prefix(eol + 2);
    return true;
  };
  std::string_view line;
  next_line(line);
  if (line.size() > limits_.max_header_line_bytes)
    return refuse(414, fmt::format("the request line exceeds the limit of {} bytes", limits_.max_header_line_bytes),
                  "uri_too_long");
  const size_t sp1 = line.find(' '), sp2 = line.rfind(' ');
  if (sp1 == std::string_view::npos || sp2 == sp1) return refuse(400, "malformed HTTP request line");
  head_.method = std::string(line.substr(0, sp1));
  head_.target = std::string(line.substr(sp1 + 1, sp2 - sp1 - 1));
  head_.version = std::string(line.substr(sp2 + 1));
  if (!is_token(head_.method) || head_.target.empty() || head_.target.find(' ') != std::string::npos ||
      (head_.target[0] != '/' && head_.target != "*"))
    return refuse(400, "malformed HTTP request line");
  if (head_.version != "HTTP/1.1" && head_.version != "HTTP/1.0") {
    if (head_.version.starts_with("HTTP/")) return refuse(505, fmt::format("{} is not supported", head_.version));
    return refuse(400, "malformed HTTP request line");
  }

  while (next_line(line)) {
    if (line.size() > limits_.max_header_line_bytes)
      return refuse(431, fmt::format("a request header line exceeds the limit of {} bytes",
                                     limits_.max_header_line_bytes),
                    "headers_too_large");
    if (head_.headers.size() >= limits_.max_header_count)
      return refuse(431, fmt::format("the request has more than {} headers", limits_.max_header_count),
                    "headers_too_large");
    const size_t colon = line.find(':');
    // Obsolete line folding (a line starting with white space) is refused, as RFC 9112 5.2 allows.
    if (colon == std::string_view::npos || !is_token(line.substr(0, colon)))
      return refuse(400, "malformed HTTP header line");
    head_.headers.emplace_back(std::string(line.substr(0, colon)), std::string(trim(line.substr(colon + 1))));
  }

  // Body framing (RFC 9112 6): chunked wins; both at once is refused, since
  // proxies may disagree on which one frames the message.
  std::string_view length_value;
  int length_headers = 0;
  bool has_te = false;
  std::string te;
  for (const auto& [k, v] : head_.headers) {
    if (iequals(k, "Content-Length")) {
      if (length_headers++ && v != length_value) return refuse(400, "conflicting Content-Length headers");
      length_value = v;
    } else if (iequals(k, "Transfer-Encoding")) {
      has_te = true;
      te += (te.empty() ? "" : ",") + lower(v);
    } else if (iequals(k, "Content-Encoding")) {
      const std::string enc = lower(trim(v));
      if (enc == "identity" || enc.empty()) continue;
      if (!content_encoding_.empty() || (enc != "gzip" && enc != "x-gzip" && enc != "deflate"))
        return refuse(415, fmt::format("Content-Encoding '{}' is not supported (use gzip, deflate or none)", v),
                      "unsupported_encoding");
      content_encoding_ = enc == "x-gzip" ? "gzip" : enc;
    } else if (iequals(k, "Expect")) {
      if (!iequals(trim(v), "100-continue")) return refuse(417, fmt::format("Expect '{}' is not supported", v));
      expects_continue_ = head_.version == "HTTP/1.1";
    }
  }
  if (has_te) {
    if (length_headers) return refuse(400, "a request may not carry both Transfer-Encoding and Content-Length");
    if (trim(te) != "chunked")
      return refuse(501, fmt::format("Transfer-Encoding '{}' is not supported (only chunked)", te),
                    "unsupported_encoding");
    chunked_ = true;
  } else if (length_headers) {
    uint64_t n = 0;
    const auto [p, ec] = std::from_chars(length_value.data(), length_value.data() + length_value.size(), n);
    if (ec != std::errc() || p != length_value.data() + length_value.size() || length_value.empty())
      return refuse(400, fmt::format("invalid Content-Length '{}'", length_value));
    if (n > limits_.max_body_bytes)
      return refuse(413, fmt::format("the request body exceeds the limit of {} bytes", limits_.max_body_bytes),
                    "request_too_large");
    content_length_ = n;
  }
  state_ = State::kBody;
  if (!chunked_) body_.reserve(content_length_);
}

size_t HttpRequestReader::feed_body(std::string_view data) {
  if (chunked_) return feed_chunked(data);
  const size_t take = static_cast<size_t>(std::min<uint64_t>(data.size(), content_length_ - body_.size()));
  body_.append(data.substr(0, take));
  wire_body_bytes_ += take;
  if (body_.size() == content_length_) finish_body();
  return take;
}

size_t HttpRequestReader::feed_chunked(std::string_view data) {
  // The wire may carry more than the decoded body (chunk framing), but not
  // without bound: a stream of empty chunk extensions is refused as well.
  const size_t wire_limit = limits_.max_body_bytes * 2 + (1u << 20);
  size_t used = 0;
  auto read_line = [&](std::string_view& line, size_t max_line) -> int {  // 1: got a line, 0: need more, -1: too long
    const size_t eol = data.find('\n', used);
    const size_t take = (eol == std::string_view::npos ? data.size() : eol + 1) - used;
    if (pending_.size() + take > max_line) return -1;
    pending_.append(data.substr(used, take));
    used += take;
    if (eol == std::string_view::npos) return 0;
    line = pending_;
    line.remove_suffix(1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    return 1;
  };
  while (used < data.size() && state_ == State::kBody) {
    const size_t before = used;
    std::string_view line;
    if (chunk_ == Chunk::kSize) {
      const int r = read_line(line, 4096);
      if (r < 0) return refuse(400, "a chunk-size line exceeds 4096 bytes"), used;
      if (r == 0) break;
      const std::string_view size_text = trim(line.substr(0, line.find(';')));
      uint64_t n = 0;
      const auto [p, ec] = std::from_chars(size_text.data(), size_text.data() + size_text.size(), n, 16);
      if (size_text.empty() || size_text.size() > 16 || ec != std::errc() || p != size_text.data() + size_text.size())
        return refuse(400, "malformed chunk size in a chunked request body"), used;
      pending_.clear();
      if (n > limits_.max_body_bytes - body_.size())
        return refuse(413, fmt::format("the request body exceeds the limit of {} bytes", limits_.max_body_bytes),
                      "request_too_large"),
               used;
      chunk_left_ = n;
      chunk_ = n == 0 ? Chunk::kTrailer : Chunk::kData;
    } else if (chunk_ == Chunk::kData) {
      const size_t take = static_cast<size_t>(std::min<uint64_t>(data.size() - used, chunk_left_));
      body_.append(data.substr(used, take));
      used += take;
      chunk_left_ -= take;
      if (chunk_left_ == 0) chunk_ = Chunk::kDataEnd;
    } else if (chunk_ == Chunk::kDataEnd) {
      const int r = read_line(line, 4096);
      if (r < 0 || (r > 0 && !line.empty())) return refuse(400, "a chunk is longer than its declared size"), used;
      if (r == 0) break;
      pending_.clear();
      chunk_ = Chunk::kSize;
    } else {  // trailer fields, then the blank line
      const int r = read_line(line, limits_.max_header_line_bytes);
      if (r < 0) return refuse(431, "a chunked-body trailer line is too long", "headers_too_large"), used;
      if (r == 0) break;
      trailer_bytes_ += pending_.size();
      pending_.clear();
      if (trailer_bytes_ > limits_.max_header_bytes)
        return refuse(431, "the chunked-body trailers are too large", "headers_too_large"), used;
      if (line.empty()) finish_body();
    }
    wire_body_bytes_ += used - before;
  }
  if (state_ == State::kBody && wire_body_bytes_ > wire_limit)
    refuse(413, fmt::format("the chunked request body exceeds {} bytes on the wire", wire_limit), "request_too_large");
  return used;
}

void HttpRequestReader::finish_body() {
  if (!content_encoding_.empty()) {
    std::string plain;
    if (!inflate_body(body_, content_encoding_, limits_.max_body_bytes, plain, refusal_)) {
      state_ = State::kFailed;
      body_.clear();
      return;
    }
    body_ = std::move(plain);
  }
  state_ = State::kComplete;
}

std::string HttpRequestReader::normalized() const {
  std::string out = fmt::format("{} {} {}\r\n", head_.method, head_.target, head_.version);
  for (const auto& [k, v] : head_.headers) {
    if (iequals(k, "Content-Length") || iequals(k, "Transfer-Encoding") || iequals(k, "Content-Encoding") ||
        iequals(k, "Expect"))
      continue;
    out += k;
    out += ": ";
    out += v;
    out += "\r\n";
  }
  out += fmt::format("Content-Length: {}\r\n\r\n", body_.size());
  out += body_;
  return out;
}

bool inflate_body(const std::string& in, const std::string& encoding, size_t max_bytes, std::string& out,
                  HttpRefusal& refusal) {
  z_stream z{};
  // 16 + MAX_WBITS: gzip framing; MAX_WBITS: zlib framing ("deflate" in HTTP).
  if (inflateInit2(&z, encoding == "gzip" ? 16 + MAX_WBITS : MAX_WBITS) != Z_OK) {
    refusal = {500, "cannot start the decompressor", "internal_error"};
    return false;
  }
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = static_cast<uInt>(in.size());
  out.clear();
  char buf[16384];
  int rc = Z_OK;
  while (rc != Z_STREAM_END) {
    z.next_out = reinterpret_cast<Bytef*>(buf);
    z.avail_out = sizeof buf;
    rc = inflate(&z, Z_NO_FLUSH);
    if (rc != Z_OK && rc != Z_STREAM_END) break;
    const size_t produced = sizeof buf - z.avail_out;
    if (out.size() + produced > max_bytes) {
      inflateEnd(&z);
      refusal = {413, fmt::format("the decompressed request body exceeds the limit of {} bytes", max_bytes),
                 "request_too_large"};
      return false;
    }
    out.append(buf, produced);
    if (rc == Z_OK && produced == 0 && z.avail_in == 0) break;  // truncated input
  }
  inflateEnd(&z);
  if (rc != Z_STREAM_END) {
    refusal = {400, fmt::format("the {} request body is corrupt or truncated", encoding), ""};
    return false;
  }
  return true;
}

const char* http_status_text(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 417: return "Expectation Failed";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Error";
  }
}

}  // namespace pagellm::server
