// Bytes from a client as the connection reactor reads them: HttpRequestReader
// fed in pieces (sizes taken from the input's first byte), every pipelined
// request in turn. Invariants: nothing kept beyond the limits, a complete
// request re-reads to the same head and body from its normalised form.
#include "common.h"
#include "server/http_request_reader.h"
#include "targets.h"

namespace pagellm::fuzz {

int http_request(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  server::HttpLimits limits;
  limits.max_body_bytes = 4096;
  limits.max_header_bytes = 2048;
  limits.max_header_line_bytes = 512;
  limits.max_header_count = 16;
  const size_t step = 1 + data[0] % 97;
  std::string_view wire(reinterpret_cast<const char*>(data) + 1, size - 1);
  server::HttpRequestReader r(limits);
  for (int requests = 0; requests < 64 && !wire.empty();) {
    const size_t n = r.feed(wire.substr(0, std::min(step, wire.size())));
    wire.remove_prefix(n);
    FUZZ_INVARIANT(r.body().size() <= limits.max_body_bytes);
    using State = server::HttpRequestReader::State;
    if (r.state() == State::kFailed) {
      FUZZ_INVARIANT(r.refusal().status >= 400 && r.refusal().status < 600);
      break;
    }
    if (r.state() == State::kComplete) {
      // The normal form adds a Content-Length line and writes every header as
      // "name: value": a line sent as "name:value" at the line limit comes
      // back one byte longer.
      server::HttpLimits roomier = limits;
      roomier.max_header_count += 1;
      roomier.max_header_bytes += 64 + limits.max_header_count;
      roomier.max_header_line_bytes += 1;
      server::HttpRequestReader again(roomier);
      const std::string normal = r.normalized();
      FUZZ_INVARIANT(again.feed(normal) == normal.size());
      FUZZ_INVARIANT(again.state() == State::kComplete && again.body() == r.body());
      FUZZ_INVARIANT(again.head().target == r.head().target && again.head().method == r.head().method);
      r.reset();
      ++requests;
      continue;
    }
    if (n == 0) break;
  }
  return 0;
}

}  // namespace pagellm::fuzz
