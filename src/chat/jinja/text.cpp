#include "chat/jinja/text.h"

#include <algorithm>
#include <cstdio>

#include "core/utf8.h"

namespace pagellm::jinja::text {

char32_t next_cp(std::string_view s, size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  const int extra = (b0 >= 0xF0 && b0 < 0xF5) ? 3 : (b0 >= 0xE0 && b0 < 0xF0) ? 2 : (b0 >= 0xC2 && b0 < 0xE0) ? 1 : 0;
  if (extra == 0 || i + static_cast<size_t>(extra) >= s.size()) {
    ++i;
    return b0;
  }
  char32_t cp = b0 & (0x3F >> extra);
  for (int k = 1; k <= extra; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) {
      ++i;
      return b0;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  // Reject overlong forms and surrogates the way a strict decoder would.
  if ((extra == 2 && cp < 0x800) || (extra == 3 && (cp < 0x10000 || cp > 0x10FFFF)) ||
      (cp >= 0xD800 && cp <= 0xDFFF)) {
    ++i;
    return b0;
  }
  i += extra + 1;
  return cp;
}

void append_utf8(std::string& out, char32_t cp) { pagellm::append_utf8(out, static_cast<uint32_t>(cp)); }

std::u32string to_u32(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) out.push_back(next_cp(s, i));
  return out;
}

std::string to_utf8(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) append_utf8(out, c);
  return out;
}

bool is_ascii(std::string_view s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

size_t length(std::string_view s) {
  if (is_ascii(s)) return s.size();
  size_t n = 0;
  for (size_t i = 0; i < s.size();) {
    next_cp(s, i);
    ++n;
  }
  return n;
}

bool is_space(char32_t c) {
  if (c < 0x80) return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20);
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool is_linebreak(char32_t c) {
  return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E ||
         c == 0x85 || c == 0x2028 || c == 0x2029;
}

// ---- case mapping ---------------------------------------------------------
// Covered: ASCII, Latin-1, Latin Extended-A, Greek and Coptic (basic), Cyrillic,
// Armenian, fullwidth Latin. Other scripts keep their code points unchanged.

namespace {

// Lowercase form of an uppercase letter, or 0 when c is not one.
char32_t lower_of(char32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c < 0xC0) return 0;
  if (c <= 0xDE) return c == 0xD7 ? 0 : c + 32;
  if (c >= 0x100 && c <= 0x137) return (c % 2 == 0 && c != 0x130) ? c + 1 : 0;
  if (c >= 0x139 && c <= 0x148) return c % 2 == 1 ? c + 1 : 0;
  if (c >= 0x14A && c <= 0x177) return c % 2 == 0 ? c + 1 : 0;
  if (c == 0x178) return 0xFF;
  if (c >= 0x179 && c <= 0x17E) return c % 2 == 1 ? c + 1 : 0;
  if (c == 0x386) return 0x3AC;
  if (c >= 0x388 && c <= 0x38A) return c + 37;
  if (c == 0x38C) return 0x3CC;
  if (c == 0x38E || c == 0x38F) return c + 63;
  if ((c >= 0x391 && c <= 0x3A1) || (c >= 0x3A3 && c <= 0x3AB)) return c + 32;
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  if (c >= 0x410 && c <= 0x42F) return c + 32;
  if ((c >= 0x460 && c <= 0x481) || (c >= 0x48A && c <= 0x4BF) || (c >= 0x4D0 && c <= 0x52F))
    return c % 2 == 0 ? c + 1 : 0;
  if (c == 0x4C0) return 0x4CF;
  if (c >= 0x4C1 && c <= 0x4CE) return c % 2 == 1 ? c + 1 : 0;
  if (c >= 0x531 && c <= 0x556) return c + 48;
  if (c >= 0xFF21 && c <= 0xFF3A) return c + 32;
  return 0;
}

// Uppercase form of a lowercase letter (single code point), or 0.
char32_t upper_of(char32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if (c < 0xB5) return 0;
  if (c == 0xB5) return 0x39C;
  if (c >= 0xE0 && c <= 0xFE) return c == 0xF7 ? 0 : c - 32;
  if (c == 0xFF) return 0x178;
  if (c >= 0x101 && c <= 0x137) return c % 2 == 1 && c != 0x131 ? c - 1 : 0;
  if (c == 0x131) return 'I';
  if (c >= 0x13A && c <= 0x148) return c % 2 == 0 ? c - 1 : 0;
  if (c >= 0x14B && c <= 0x177) return c % 2 == 1 ? c - 1 : 0;
  if (c >= 0x17A && c <= 0x17E) return c % 2 == 0 ? c - 1 : 0;
  if (c == 0x17F) return 'S';
  if (c == 0x3AC) return 0x386;
  if (c >= 0x3AD && c <= 0x3AF) return c - 37;
  if (c == 0x3CC) return 0x38C;
  if (c == 0x3CD || c == 0x3CE) return c - 63;
  if (c == 0x3C2) return 0x3A3;
  if ((c >= 0x3B1 && c <= 0x3C1) || (c >= 0x3C3 && c <= 0x3CB)) return c - 32;
  if (c >= 0x430 && c <= 0x44F) return c - 32;
  if (c >= 0x450 && c <= 0x45F) return c - 80;
  if ((c >= 0x461 && c <= 0x481) || (c >= 0x48B && c <= 0x4BF) || (c >= 0x4D1 && c <= 0x52F))
    return c % 2 == 1 ? c - 1 : 0;
  if (c == 0x4CF) return 0x4C0;
  if (c >= 0x4C2 && c <= 0x4CE) return c % 2 == 0 ? c - 1 : 0;
  if (c >= 0x561 && c <= 0x586) return c - 48;
  if (c >= 0xFF41 && c <= 0xFF5A) return c - 32;
  return 0;
}

}  // namespace

bool is_upper_cp(char32_t c) { return lower_of(c) != 0 || c == 0x130; }
bool is_lower_cp(char32_t c) {
  return upper_of(c) != 0 || c == 0xDF || c == 0x149 || c == 0x138 || c == 0xAA || c == 0xBA;
}
bool is_cased(char32_t c) { return is_upper_cp(c) || is_lower_cp(c); }

void append_lower(std::u32string& out, char32_t c) {
  if (c == 0x130) {  // 'İ'.lower() == 'i̇'
    out.push_back('i');
    out.push_back(0x307);
    return;
  }
  const char32_t l = lower_of(c);
  out.push_back(l ? l : c);
}

void append_upper(std::u32string& out, char32_t c) {
  if (c == 0xDF) {
    out.append(U"SS");
    return;
  }
  if (c == 0x149) {
    out.push_back(0x2BC);
    out.push_back('N');
    return;
  }
  const char32_t u = upper_of(c);
  out.push_back(u ? u : c);
}

namespace {

void append_title(std::u32string& out, char32_t c) {
  if (c == 0xDF) {
    out.append(U"Ss");
    return;
  }
  append_upper(out, c);
}

// Greek capital sigma lowercases to final sigma at the end of a word.
bool final_sigma(const std::u32string& s, size_t i) {
  bool before = false;
  for (size_t j = i; j-- > 0;) {
    if (is_cased(s[j])) {
      before = true;
      break;
    }
    if (s[j] != '\'' && s[j] != 0x2019 && s[j] != 0xAD) break;
  }
  if (!before) return false;
  for (size_t j = i + 1; j < s.size(); ++j) {
    if (is_cased(s[j])) return false;
    if (s[j] != '\'' && s[j] != 0x2019 && s[j] != 0xAD) break;
  }
  return true;
}

std::u32string lower_u32(const std::u32string& s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == 0x3A3 && final_sigma(s, i))
      out.push_back(0x3C2);
    else
      append_lower(out, s[i]);
  }
  return out;
}

}  // namespace

std::string lower(std::string_view s) {
  if (is_ascii(s)) {
    std::string out(s);
    for (char& c : out)
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
    return out;
  }
  return to_utf8(lower_u32(to_u32(s)));
}

std::string upper(std::string_view s) {
  if (is_ascii(s)) {
    std::string out(s);
    for (char& c : out)
      if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 32);
    return out;
  }
  std::u32string out;
  for (char32_t c : to_u32(s)) append_upper(out, c);
  return to_utf8(out);
}

std::string swapcase(std::string_view s) {
  const std::u32string u = to_u32(s);
  std::u32string out;
  for (size_t i = 0; i < u.size(); ++i) {
    if (is_upper_cp(u[i])) {
      if (u[i] == 0x3A3 && final_sigma(u, i))
        out.push_back(0x3C2);
      else
        append_lower(out, u[i]);
    } else if (is_lower_cp(u[i])) {
      append_upper(out, u[i]);
    } else {
      out.push_back(u[i]);
    }
  }
  return to_utf8(out);
}

std::string capitalize(std::string_view s) {
  const std::u32string u = to_u32(s);
  if (u.empty()) return {};
  std::u32string out;
  append_title(out, u[0]);
  const std::u32string rest = lower_u32(u);
  // lower_u32 over the whole string keeps the final-sigma context; drop what
  // the first code point produced.
  std::u32string first_lower;
  if (u[0] == 0x3A3 && final_sigma(u, 0))
    first_lower.push_back(0x3C2);
  else
    append_lower(first_lower, u[0]);
  out.append(rest.substr(first_lower.size()));
  return to_utf8(out);
}

std::string title(std::string_view s) {
  const std::u32string u = to_u32(s);
  std::u32string out;
  bool prev_cased = false;
  for (size_t i = 0; i < u.size(); ++i) {
    const char32_t c = u[i];
    if (prev_cased) {
      if (c == 0x3A3 && final_sigma(u, i))
        out.push_back(0x3C2);
      else
        append_lower(out, c);
    } else {
      append_title(out, c);
    }
    prev_cased = is_cased(c);
  }
  return to_utf8(out);
}

bool is_digit(char32_t c) {
  return (c >= '0' && c <= '9') || (c >= 0x660 && c <= 0x669) || (c >= 0x6F0 && c <= 0x6F9) ||
         (c >= 0x966 && c <= 0x96F) || (c >= 0xFF10 && c <= 0xFF19) || c == 0xB2 || c == 0xB3 || c == 0xB9;
}

bool is_alpha(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  if (is_cased(c)) return true;
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x3041 && c <= 0x3096) ||
         (c >= 0x30A1 && c <= 0x30FA) || (c >= 0xAC00 && c <= 0xD7A3) || (c >= 0x5D0 && c <= 0x5EA) ||
         (c >= 0x620 && c <= 0x64A) || (c >= 0x904 && c <= 0x939) || (c >= 0xE01 && c <= 0xE30) ||
         (c >= 0x1100 && c <= 0x11FF) || (c >= 0x20000 && c <= 0x2FA1F);
}

bool is_alnum(char32_t c) { return is_alpha(c) || is_digit(c); }

bool is_word(char32_t c) {
  return is_alnum(c) || c == '_' || (c >= 0x300 && c <= 0x36F) || (c >= 0x64B && c <= 0x65F);
}

bool is_printable(char32_t c) {
  if (c < 0x20 || c == 0x7F) return false;
  if (c < 0xA0) return c < 0x7F;
  if (c == 0xA0 || c == 0xAD) return false;
  if ((c >= 0x600 && c <= 0x605) || c == 0x61C || c == 0x6DD || c == 0x70F || c == 0x180E || c == 0x1680)
    return false;
  if ((c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F) || (c >= 0x205F && c <= 0x206F))
    return false;
  if (c == 0x3000 || c == 0xFEFF || (c >= 0xFFF9 && c <= 0xFFFB) || c == 0xFFFE || c == 0xFFFF) return false;
  if ((c >= 0xD800 && c <= 0xF8FF) || c >= 0xF0000 || (c >= 0xE0000 && c <= 0xE0FFF)) return false;
  return true;
}

std::string strip(std::string_view s, const std::string* chars, bool left, bool right) {
  if (!chars && is_ascii(s)) {
    size_t b = 0, e = s.size();
    auto sp = [](char c) { return is_space(static_cast<unsigned char>(c)); };
    if (left)
      while (b < e && sp(s[b])) ++b;
    if (right)
      while (e > b && sp(s[e - 1])) --e;
    return std::string(s.substr(b, e - b));
  }
  const std::u32string u = to_u32(s);
  std::u32string set;
  if (chars) set = to_u32(*chars);
  auto drop = [&](char32_t c) { return chars ? set.find(c) != std::u32string::npos : is_space(c); };
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && drop(u[b])) ++b;
  if (right)
    while (e > b && drop(u[e - 1])) --e;
  return to_utf8(std::u32string_view(u).substr(b, e - b));
}

std::vector<std::string> split(std::string_view s, const std::string* sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    size_t pos = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      const size_t q = s.find(*sep, pos);
      if (q == std::string_view::npos) break;
      out.emplace_back(s.substr(pos, q - pos));
      pos = q + sep->size();
    }
    out.emplace_back(s.substr(pos));
    return out;
  }
  const std::u32string u = to_u32(s);
  size_t i = 0;
  while (true) {
    while (i < u.size() && is_space(u[i])) ++i;
    if (i >= u.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
      out.push_back(to_utf8(std::u32string_view(u).substr(i)));  // the rest keeps trailing whitespace
      break;
    }
    size_t j = i;
    while (j < u.size() && !is_space(u[j])) ++j;
    out.push_back(to_utf8(std::u32string_view(u).substr(i, j - i)));
    i = j;
  }
  return out;
}

std::vector<std::string> rsplit(std::string_view s, const std::string* sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    size_t end = s.size();
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      if (end < sep->size()) break;
      const size_t q = s.rfind(*sep, end - sep->size());
      if (q == std::string_view::npos) break;
      out.emplace_back(s.substr(q + sep->size(), end - q - sep->size()));
      end = q;
    }
    out.emplace_back(s.substr(0, end));
    std::reverse(out.begin(), out.end());
    return out;
  }
  const std::u32string u = to_u32(s);
  size_t i = u.size();
  while (true) {
    while (i > 0 && is_space(u[i - 1])) --i;
    if (i == 0) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
      out.push_back(to_utf8(std::u32string_view(u).substr(0, i)));  // the rest keeps leading whitespace
      break;
    }
    size_t j = i;
    while (j > 0 && !is_space(u[j - 1])) --j;
    out.push_back(to_utf8(std::u32string_view(u).substr(j, i - j)));
    i = j;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> splitlines(std::string_view s, bool keepends, size_t max_parts) {
  std::vector<std::string> out;
  const std::u32string u = to_u32(s);
  size_t start = 0;
  for (size_t i = 0; i < u.size(); ++i) {
    if (out.size() > max_parts) return out;
    if (!is_linebreak(u[i])) continue;
    size_t end = i;
    if (u[i] == '\r' && i + 1 < u.size() && u[i + 1] == '\n') ++i;
    out.push_back(to_utf8(std::u32string_view(u).substr(start, (keepends ? i + 1 : end) - start)));
    start = i + 1;
  }
  if (start < u.size()) out.push_back(to_utf8(std::u32string_view(u).substr(start)));
  return out;
}

std::string replace(std::string_view s, std::string_view old_s, std::string_view new_s, int64_t count) {
  std::string out;
  if (old_s.empty()) {
    // Python inserts `new` before every code point and at the end.
    int64_t n = 0;
    size_t i = 0;
    while (i < s.size()) {
      if (count >= 0 && n >= count) break;
      out.append(new_s);
      ++n;
      const size_t b = i;
      next_cp(s, i);
      out.append(s.substr(b, i - b));
    }
    if (i < s.size())
      out.append(s.substr(i));
    else if (count < 0 || n < count)
      out.append(new_s);
    return out;
  }
  size_t pos = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t q = s.find(old_s, pos);
    if (q == std::string_view::npos) break;
    out.append(s.substr(pos, q - pos));
    out.append(new_s);
    pos = q + old_s.size();
    ++n;
  }
  out.append(s.substr(pos));
  return out;
}

size_t byte_offset(std::string_view s, size_t cp_index) {
  size_t i = 0;
  for (size_t n = 0; n < cp_index && i < s.size(); ++n) next_cp(s, i);
  return i;
}

std::string substr_cp(std::string_view s, size_t cp_begin, size_t cp_end) {
  if (cp_end <= cp_begin) return {};
  if (is_ascii(s)) return std::string(s.substr(std::min(cp_begin, s.size()), cp_end - cp_begin));
  const size_t b = byte_offset(s, cp_begin);
  size_t e = b;
  for (size_t n = cp_begin; n < cp_end && e < s.size(); ++n) next_cp(s, e);
  return std::string(s.substr(b, e - b));
}

std::string py_repr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  char buf[16];
  for (size_t i = 0; i < s.size();) {
    const char32_t c = next_cp(s, i);
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7F) {
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
      out += buf;
    } else if (c < 0x7F) {
      out.push_back(static_cast<char>(c));
    } else if (!is_printable(c)) {
      if (c <= 0xFF)
        std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
      else if (c <= 0xFFFF)
        std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      else
        std::snprintf(buf, sizeof buf, "\\U%08x", static_cast<unsigned>(c));
      out += buf;
    } else {
      append_utf8(out, c);
    }
  }
  out.push_back(quote);
  return out;
}

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

}  // namespace pagellm::jinja::text
