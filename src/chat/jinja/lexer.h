// Template source -> tokens, following jinja2's lexer as configured by
// Hugging Face transformers: trim_blocks and lstrip_blocks on, default
// delimiters, no line statements, one trailing newline dropped.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace pagellm::jinja {

// A template that does not parse; the message names line and column.
class SyntaxError : public Error {
 public:
  SyntaxError(const std::string& msg, int line, int col);
  int line() const { return line_; }
  int col() const { return col_; }
  const std::string& detail() const { return detail_; }

 private:
  std::string detail_;
  int line_, col_;
};

enum class Tok : uint8_t {
  Data,        // literal text (after whitespace control)
  VarBegin,    // {{
  VarEnd,      // }}
  BlockBegin,  // {%
  BlockEnd,    // %}
  Name,
  String,
  Integer,
  Float,
  Op,  // + - / // * % ** ~ [ ] ( ) { } == != > >= < <= = . : | , ;
  Eof,
};

struct Token {
  Tok type = Tok::Eof;
  std::string text;  // data, name, decoded string literal, or operator
  int64_t ival = 0;
  double fval = 0;
  int line = 1, col = 1;

  bool is_op(std::string_view op) const { return type == Tok::Op && text == op; }
  bool is_name(std::string_view name) const { return type == Tok::Name && text == name; }
};

std::vector<Token> tokenize(std::string_view source);

}  // namespace pagellm::jinja
