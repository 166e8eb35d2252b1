#include "core/util.h"

#include <cctype>
#include <cmath>
#include <cstdlib>

#include "core/error.h"

namespace pagellm {

int64_t parse_byte_size(std::string_view text) {
  const std::string s(text);
  size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(s, &pos);
  } catch (const std::exception&) {
    fail("invalid size '{}' (expected e.g. 2GiB, 512MiB, 1000000)", s);
  }
  std::string unit;
  for (size_t i = pos; i < s.size(); ++i)
    if (!std::isspace(static_cast<unsigned char>(s[i]))) unit += static_cast<char>(std::tolower(s[i]));
  double mult = 1;
  if (unit.empty() || unit == "b") mult = 1;
  else if (unit == "k" || unit == "kib") mult = 1024.0;
  else if (unit == "m" || unit == "mib") mult = 1024.0 * 1024;
  else if (unit == "g" || unit == "gib") mult = 1024.0 * 1024 * 1024;
  else if (unit == "kb") mult = 1e3;
  else if (unit == "mb") mult = 1e6;
  else if (unit == "gb") mult = 1e9;
  else fail("invalid size unit in '{}' (use B, KiB, MiB, GiB, KB, MB, GB)", s);
  if (!(value >= 0) || !std::isfinite(value)) fail("invalid size '{}'", s);
  return static_cast<int64_t>(std::llround(value * mult));
}

std::string format_bytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", b / (1024.0 * 1024 * 1024));
  if (b >= 1024.0 * 1024) return fmt::format("{:.1f} MiB", b / (1024.0 * 1024));
  if (b >= 1024.0) return fmt::format("{:.1f} KiB", b / 1024.0);
  return fmt::format("{} B", bytes);
}

namespace {
// Expected length of a sequence from its lead byte; 0 for an invalid lead.
int utf8_seq_len(unsigned char c) {
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return 2;
  if (c >= 0xE0 && c <= 0xEF) return 3;
  if (c >= 0xF0 && c <= 0xF4) return 4;
  return 0;
}
}  // namespace

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const int len = utf8_seq_len(c);
    if (len == 0 || i + len > s.size()) return false;
    for (int k = 1; k < len; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    if (len == 3) {
      const auto c1 = static_cast<unsigned char>(s[i + 1]);
      if (c == 0xE0 && c1 < 0xA0) return false;  // overlong
      if (c == 0xED && c1 >= 0xA0) return false;  // surrogate
    } else if (len == 4) {
      const auto c1 = static_cast<unsigned char>(s[i + 1]);
      if (c == 0xF0 && c1 < 0x90) return false;  // overlong
      if (c == 0xF4 && c1 >= 0x90) return false;  // > U+10FFFF
    }
    i += len;
  }
  return true;
}

size_t utf8_complete_prefix(std::string_view s) {
  // Walk back over at most 3 continuation bytes to the last lead byte.
  size_t n = s.size();
  size_t back = 0;
  while (back < 4 && back < n && (static_cast<unsigned char>(s[n - 1 - back]) & 0xC0) == 0x80) ++back;
  if (back == n) return n;
  const auto lead = static_cast<unsigned char>(s[n - 1 - back]);
  const int len = utf8_seq_len(lead);
  if (len == 0 || lead < 0x80) return n;  // ASCII or invalid: nothing to wait for
  if (static_cast<size_t>(len) > back + 1) return n - 1 - back;  // unfinished sequence
  return n;
}

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return (v && *v) ? std::string(v) : fallback;
}

}  // namespace pagellm
