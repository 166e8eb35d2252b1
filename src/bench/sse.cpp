#include "bench/sse.h"

#include <utility>

namespace pagellm::bench {

void SseParser::take_line(std::string line, std::vector<std::string>& out) {
  if (!line.empty() && line.back() == '\r') line.pop_back();
  if (line.empty()) {  // blank line: the event is complete
    if (has_data_) out.push_back(std::move(data_));
    data_.clear();
    has_data_ = false;
    return;
  }
  if (line[0] == ':') return;
  const size_t colon = line.find(':');
  const std::string field = line.substr(0, colon);
  if (field != "data") return;
  std::string value = colon == std::string::npos ? "" : line.substr(colon + 1);
  if (!value.empty() && value[0] == ' ') value.erase(0, 1);
  if (has_data_) data_ += '\n';
  data_ += value;
  has_data_ = true;
}

std::vector<std::string> SseParser::feed(const char* data, size_t n) {
  std::vector<std::string> out;
  buf_.append(data, n);
  size_t start = 0;
  for (size_t nl; (nl = buf_.find('\n', start)) != std::string::npos; start = nl + 1)
    take_line(buf_.substr(start, nl - start), out);
  buf_.erase(0, start);
  return out;
}

std::vector<std::string> SseParser::finish() {
  std::vector<std::string> out;
  if (!buf_.empty()) take_line(std::exchange(buf_, {}), out);
  take_line("", out);
  return out;
}

}  // namespace pagellm::bench
