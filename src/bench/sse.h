// Incremental parser of a Server-Sent Events stream: bytes in (split
// anywhere), the data payload of each complete event out.
#pragma once

#include <string>
#include <vector>

namespace pagellm::bench {

class SseParser {
 public:
  // Appends bytes; returns the payloads of the events they completed (the
  // "data:" lines of one event joined by '\n'). Comment lines (':') and
  // other fields are skipped; events without data yield nothing.
  std::vector<std::string> feed(const char* data, size_t n);
  // Payload of a last event that the stream ended without a blank line after.
  std::vector<std::string> finish();
  size_t buffered() const { return buf_.size(); }

 private:
  void take_line(std::string line, std::vector<std::string>& out);

  std::string buf_;    // bytes of an incomplete line
  std::string data_;   // data of the event being read
  bool has_data_ = false;
};

}  // namespace pagellm::bench
