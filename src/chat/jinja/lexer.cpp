#include "chat/jinja/lexer.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <tuple>

#include "chat/jinja/text.h"

namespace pagellm::jinja {

SyntaxError::SyntaxError(const std::string& msg, int line, int col)
    : Error("chat template syntax error at line " + std::to_string(line) + ", column " + std::to_string(col) +
            ": " + msg),
      detail_(msg),
      line_(line),
      col_(col) {}

namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || static_cast<unsigned char>(c) >= 0x80;
}
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

class Lexer {
 public:
  explicit Lexer(std::string_view source) {
    // jinja2 splits on \r\n, \r and \n, joins with \n and drops one trailing
    // newline (keep_trailing_newline=False).
    src_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_.push_back('\n');
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_.push_back(source[i]);
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Token> run() {
    const size_t n = src_.size();
    size_t pos = 0;
    while (pos < n) {
      size_t q = find_tag_start(pos);
      if (q == std::string::npos) {
        emit_data(src_.substr(pos), pos);
        break;
      }
      std::string text = src_.substr(pos, q - pos);
      const char kind = src_[q + 1];
      size_t p = q + 2;
      const char sign = (p < n && (src_[p] == '-' || src_[p] == '+')) ? src_[p] : 0;
      size_t raw_end = 0;
      const bool raw = kind == '%' && match_raw_begin(q, &raw_end);
      apply_strip(text, sign, kind == '{');
      emit_data(std::move(text), pos);
      if (raw) {
        line_starting_ = src_[raw_end - 1] == '\n';
        pos = lex_raw(raw_end);
        continue;
      }
      line_starting_ = false;
      if (sign) ++p;
      if (kind == '#') {
        pos = lex_comment(p);
        continue;
      }
      push(kind == '%' ? Tok::BlockBegin : Tok::VarBegin, q, kind == '%' ? "{%" : "{{");
      pos = lex_tag(p, kind == '%');
    }
    push(Tok::Eof, n, "");
    return std::move(out_);
  }

 private:
  std::string src_;
  mutable size_t cursor_pos_ = 0;
  mutable int cursor_line_ = 1, cursor_col_ = 1;
  std::vector<Token> out_;
  std::vector<char> balance_;
  bool line_starting_ = true;

  [[noreturn]] void fail(const std::string& msg, size_t pos) const {
    const auto [line, col] = line_col(pos);
    throw SyntaxError(msg, line, col);
  }

  // Line and column (in code points) of pos. Tokens arrive in source order,
  // so a cursor that only moves forward makes this linear overall.
  std::pair<int, int> line_col(size_t pos) const {
    if (pos < cursor_pos_) {
      cursor_pos_ = 0;
      cursor_line_ = 1;
      cursor_col_ = 1;
    }
    while (cursor_pos_ < pos && cursor_pos_ < src_.size()) {
      if (src_[cursor_pos_] == '\n') {
        ++cursor_line_;
        cursor_col_ = 1;
      } else if ((static_cast<unsigned char>(src_[cursor_pos_]) & 0xC0) != 0x80) {
        ++cursor_col_;
      }
      ++cursor_pos_;
    }
    return {cursor_line_, cursor_col_};
  }

  Token& push(Tok type, size_t pos, std::string text) {
    Token t;
    t.type = type;
    t.text = std::move(text);
    std::tie(t.line, t.col) = line_col(pos);
    out_.push_back(std::move(t));
    return out_.back();
  }

  void emit_data(std::string text, size_t pos) {
    if (!text.empty()) push(Tok::Data, pos, std::move(text));
  }

  bool starts_with(size_t pos, std::string_view s) const { return std::string_view(src_).substr(pos).starts_with(s); }

  // Python whitespace (str.isspace) at pos: its byte length, or 0.
  size_t space_len(size_t pos) const {
    if (pos >= src_.size()) return 0;
    size_t i = pos;
    const char32_t c = text::next_cp(src_, i);
    return text::is_space(c) ? i - pos : 0;
  }

  size_t skip_space(size_t pos) const {
    while (size_t l = space_len(pos)) pos += l;
    return pos;
  }

  size_t find_tag_start(size_t pos) const {
    while (true) {
      pos = src_.find('{', pos);
      if (pos == std::string::npos || pos + 1 >= src_.size()) return std::string::npos;
      const char c = src_[pos + 1];
      if (c == '{' || c == '%' || c == '#') return pos;
      ++pos;
    }
  }

  // The text before a tag: "-" strips all whitespace; otherwise lstrip_blocks
  // removes spaces/tabs between a line start and a block or comment tag.
  void apply_strip(std::string& text, char sign, bool is_variable) const {
    if (sign == '-') {
      text = text::strip(text, nullptr, false, true);
      return;
    }
    if (sign == '+' || is_variable) return;
    const size_t nl = text.rfind('\n');
    const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
    if (l_pos == 0 && !line_starting_) return;
    if (l_pos >= text.size()) return;
    for (size_t i = l_pos; i < text.size();) {
      const char32_t c = text::next_cp(text, i);
      if (!text::is_space(c)) return;
    }
    text.resize(l_pos);
  }

  // {% raw %} with optional signs: `{%[-+]?\s*raw\s*(-%}\s*|%})`.
  bool match_raw_begin(size_t q, size_t* end) const {
    size_t p = q + 2;
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
    p = skip_space(p);
    if (!starts_with(p, "raw")) return false;
    p = skip_space(p + 3);
    if (starts_with(p, "-%}")) {
      *end = skip_space(p + 3);
      return true;
    }
    if (starts_with(p, "%}")) {
      *end = p + 2;
      return true;
    }
    return false;
  }

  size_t lex_raw(size_t pos) {
    for (size_t q = src_.find("{%", pos); q != std::string::npos; q = src_.find("{%", q + 1)) {
      size_t p = q + 2;
      const char sign = (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ? src_[p] : 0;
      if (sign) ++p;
      p = skip_space(p);
      if (!starts_with(p, "endraw")) continue;
      p = skip_space(p + 6);
      size_t end;
      if (starts_with(p, "+%}")) {
        end = p + 3;
      } else if (starts_with(p, "-%}")) {
        end = skip_space(p + 3);
      } else if (starts_with(p, "%}")) {
        end = p + 2;
        if (end < src_.size() && src_[end] == '\n') ++end;
      } else {
        continue;
      }
      std::string text = src_.substr(pos, q - pos);
      apply_strip(text, sign, false);
      emit_data(std::move(text), pos);
      line_starting_ = src_[end - 1] == '\n';
      return end;
    }
    fail("Missing end of raw directive", pos);
  }

  size_t lex_comment(size_t pos) {
    const size_t q = src_.find("#}", pos);
    if (q == std::string::npos) fail("Missing end of comment tag", pos);
    size_t end = q + 2;
    if (q > pos && src_[q - 1] == '-') {
      end = skip_space(end);
    } else if (!(q > pos && src_[q - 1] == '+')) {
      if (end < src_.size() && src_[end] == '\n') ++end;
    }
    line_starting_ = src_[end - 1] == '\n';
    return end;
  }

  size_t lex_tag(size_t pos, bool block) {
    const size_t n = src_.size();
    while (true) {
      if (balance_.empty()) {
        size_t end = 0;
        if (block) {
          if (starts_with(pos, "+%}"))
            end = pos + 3;
          else if (starts_with(pos, "-%}"))
            end = skip_space(pos + 3);
          else if (starts_with(pos, "%}"))
            end = pos + 2 + ((pos + 2 < n && src_[pos + 2] == '\n') ? 1 : 0);
        } else {
          if (starts_with(pos, "-}}"))
            end = skip_space(pos + 3);
          else if (starts_with(pos, "}}"))
            end = pos + 2;
        }
        if (end) {
          push(block ? Tok::BlockEnd : Tok::VarEnd, pos, block ? "%}" : "}}");
          line_starting_ = src_[end - 1] == '\n';
          return end;
        }
      }
      if (pos >= n) return n;  // the parser reports the unfinished tag
      if (const size_t l = space_len(pos)) {
        pos += l;
        continue;
      }
      const char c = src_[pos];
      if (is_digit(c)) {
        pos = lex_number(pos);
      } else if (is_name_start(c)) {
        size_t e = pos;
        while (e < n && is_name_char(src_[e])) ++e;
        push(Tok::Name, pos, src_.substr(pos, e - pos));
        pos = e;
      } else if (c == '\'' || c == '"') {
        pos = lex_string(pos);
      } else {
        pos = lex_operator(pos);
      }
    }
  }

  // `(\d+_)*\d+` starting at pos; npos when there is no digit.
  size_t scan_digits(size_t pos) const {
    if (pos >= src_.size() || !is_digit(src_[pos])) return std::string::npos;
    while (true) {
      while (pos < src_.size() && is_digit(src_[pos])) ++pos;
      if (pos + 1 < src_.size() && src_[pos] == '_' && is_digit(src_[pos + 1])) {
        ++pos;
        continue;
      }
      return pos;
    }
  }

  static std::string without_underscores(std::string_view s) {
    std::string out;
    for (char c : s)
      if (c != '_') out.push_back(c);
    return out;
  }

  size_t lex_number(size_t pos) {
    const size_t n = src_.size();
    // Float first, as jinja2's rule order does; never right after a '.'.
    if (pos == 0 || src_[pos - 1] != '.') {
      const size_t i = scan_digits(pos);
      size_t end = std::string::npos;
      size_t j = i;
      if (j < n && src_[j] == '.') {
        if (size_t k = scan_digits(j + 1); k != std::string::npos) j = k;
      }
      if (j < n && (src_[j] == 'e' || src_[j] == 'E')) {
        size_t k = j + 1;
        if (k < n && (src_[k] == '+' || src_[k] == '-')) ++k;
        if (size_t m = scan_digits(k); m != std::string::npos) end = m;
      }
      if (end == std::string::npos && i < n && src_[i] == '.') {
        if (size_t k = scan_digits(i + 1); k != std::string::npos) end = k;
      }
      if (end != std::string::npos) {
        Token& t = push(Tok::Float, pos, src_.substr(pos, end - pos));
        t.fval = std::strtod(without_underscores(t.text).c_str(), nullptr);
        return end;
      }
    }
    int base = 10;
    size_t digits_begin = pos, end;
    if (src_[pos] == '0' && pos + 1 < n && std::string_view("bBoOxX").find(src_[pos + 1]) != std::string_view::npos) {
      const char p = static_cast<char>(src_[pos + 1] | 0x20);
      base = p == 'b' ? 2 : p == 'o' ? 8 : 16;
      auto ok = [&](char c) {
        if (base == 2) return c == '0' || c == '1';
        if (base == 8) return c >= '0' && c <= '7';
        return is_digit(c) || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f');
      };
      size_t e = pos + 2;
      while (true) {
        if (e < n && ok(src_[e])) {
          ++e;
        } else if (e + 1 < n && src_[e] == '_' && ok(src_[e + 1])) {
          e += 2;
        } else {
          break;
        }
      }
      if (e > pos + 2) {
        digits_begin = pos + 2;
        end = e;
      } else {
        base = 10;
        end = pos + 1;  // just "0"; the letter becomes a name
      }
    } else if (src_[pos] == '0') {
      end = pos + 1;
      while (true) {
        if (end < n && src_[end] == '0') {
          ++end;
        } else if (end + 1 < n && src_[end] == '_' && src_[end + 1] == '0') {
          end += 2;
        } else {
          break;
        }
      }
    } else {
      end = scan_digits(pos);
    }
    const std::string digits = without_underscores(std::string_view(src_).substr(digits_begin, end - digits_begin));
    errno = 0;
    char* stop = nullptr;
    const unsigned long long v = std::strtoull(digits.c_str(), &stop, base);
    if (errno == ERANGE || v > static_cast<unsigned long long>(INT64_MAX)) fail("integer literal too large", pos);
    Token& t = push(Tok::Integer, pos, src_.substr(pos, end - pos));
    t.ival = static_cast<int64_t>(v);
    return end;
  }

  size_t lex_string(size_t pos) {
    const char quote = src_[pos];
    size_t i = pos + 1;
    while (i < src_.size() && src_[i] != quote) {
      if (src_[i] == '\\') {
        if (i + 1 >= src_.size()) break;
        i += 2;
      } else {
        ++i;
      }
    }
    if (i >= src_.size()) fail(std::string("unexpected char '") + quote + "'", pos);
    push(Tok::String, pos, decode_string(std::string_view(src_).substr(pos + 1, i - pos - 1), pos));
    return i + 1;
  }

  static int hex_value(char c) {
    if (is_digit(c)) return c - '0';
    c = static_cast<char>(c | 0x20);
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  }

  // Python's unicode-escape decoding, as jinja2 applies it to string literals.
  std::string decode_string(std::string_view s, size_t pos) const {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
      if (s[i] != '\\') {
        out.push_back(s[i++]);
        continue;
      }
      const char n = s[i + 1];
      if (static_cast<unsigned char>(n) >= 0x80) {
        // jinja2 first backslash-escapes non-ASCII text, so "\é" ends up as the
        // four characters "\xe9".
        size_t j = i + 1;
        const char32_t cp = text::next_cp(s, j);
        char buf[16];
        if (cp <= 0xFF)
          std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(cp));
        else if (cp <= 0xFFFF)
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(cp));
        else
          std::snprintf(buf, sizeof buf, "\\U%08x", static_cast<unsigned>(cp));
        out += buf;
        i = j;
        continue;
      }
      i += 2;
      switch (n) {
        case '\n': break;
        case '\\': out.push_back('\\'); break;
        case '\'': out.push_back('\''); break;
        case '"': out.push_back('"'); break;
        case 'a': out.push_back('\a'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'v': out.push_back('\v'); break;
        case 'x':
        case 'u':
        case 'U': {
          const int count = n == 'x' ? 2 : n == 'u' ? 4 : 8;
          char32_t cp = 0;
          for (int k = 0; k < count; ++k) {
            const int h = i + k < s.size() ? hex_value(s[i + k]) : -1;
            if (h < 0)
              fail(std::string("truncated \\") + (n == 'x' ? "xXX" : n == 'u' ? "uXXXX" : "UXXXXXXXX") + " escape", pos);
            cp = cp * 16 + static_cast<char32_t>(h);
          }
          if (cp > 0x10FFFF) fail("illegal Unicode character", pos);
          i += count;
          text::append_utf8(out, cp);
          break;
        }
        case 'N': fail("\\N{...} escapes are not supported", pos);
        default:
          if (n >= '0' && n <= '7') {
            char32_t cp = static_cast<char32_t>(n - '0');
            for (int k = 0; k < 2 && i < s.size() && s[i] >= '0' && s[i] <= '7'; ++k) cp = cp * 8 + (s[i++] - '0');
            text::append_utf8(out, cp);
          } else {
            out.push_back('\\');
            out.push_back(n);
          }
      }
    }
    return out;
  }

  size_t lex_operator(size_t pos) {
    static constexpr std::string_view kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
    for (std::string_view op : kTwo) {
      if (starts_with(pos, op)) {
        push(Tok::Op, pos, std::string(op));
        return pos + 2;
      }
    }
    const char c = src_[pos];
    if (std::string_view("+-/*%~[](){}><=.:|,;").find(c) == std::string_view::npos) {
      size_t i = pos;
      std::string ch;
      text::append_utf8(ch, text::next_cp(src_, i));
      fail("unexpected char '" + ch + "'", pos);
    }
    if (c == '{' || c == '(' || c == '[') {
      balance_.push_back(c == '{' ? '}' : c == '(' ? ')' : ']');
    } else if (c == '}' || c == ')' || c == ']') {
      if (balance_.empty()) fail(std::string("unexpected '") + c + "'", pos);
      const char expected = balance_.back();
      balance_.pop_back();
      if (expected != c) fail(std::string("unexpected '") + c + "', expected '" + expected + "'", pos);
    }
    push(Tok::Op, pos, std::string(1, c));
    return pos + 1;
  }
};

}  // namespace

std::vector<Token> tokenize(std::string_view source) { return Lexer(source).run(); }

}  // namespace pagellm::jinja
