#include "api/utf8_check.h"

#include <fmt/format.h>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace pagellm::api {

std::optional<size_t> find_invalid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t len = unicode::valid_char_len(s, i);
    if (len == 0) return i;
    i += len;
  }
  return std::nullopt;
}

void require_valid_utf8(std::string_view s, const char* param) {
  if (auto at = find_invalid_utf8(s))
    throw InvalidRequest(fmt::format("'{}' is not valid UTF-8 (bad byte 0x{:02X} at offset {})", param,
                                     static_cast<unsigned char>(s[*at]), *at),
                         param);
}

std::string sanitize_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const size_t len = static_cast<unsigned char>(s[i]) < 0x80 ? 1 : unicode::valid_char_len(s, i);
    if (len == 0) {
      unicode::append_utf8(out, unicode::kReplacementChar);
      ++i;
    } else {
      out.append(s.substr(i, len));
      i += len;
    }
  }
  return out;
}

size_t utf8_length(std::string_view s) {
  size_t n = 0, i = 0;
  while (i < s.size()) {
    const size_t len = static_cast<unsigned char>(s[i]) < 0x80 ? 1 : unicode::valid_char_len(s, i);
    i += len == 0 ? 1 : len;
    ++n;
  }
  return n;
}

}  // namespace pagellm::api
