// Tokens -> syntax tree, with jinja2's grammar and operator precedence
// (jinja2/parser.py): condexpr < or < and < not < compare < + - < ~ <
// * / // % < ** < unary, with filters, tests and calls binding to the
// primary they follow.
#pragma once

#include <string_view>

#include "tokenizer/jinja/ast.h"

namespace pagellm::jinja {

// Nesting of statements and expressions a template may use; deeper sources
// are refused so that parsing and evaluation stay within the stack.
inline constexpr int kMaxParseDepth = 100;

// Throws SyntaxError (line, column) for malformed templates and for unknown
// tags, filters and tests (jinja2 rejects those when compiling, too).
Body parse_template(std::string_view source);

}  // namespace pagellm::jinja
