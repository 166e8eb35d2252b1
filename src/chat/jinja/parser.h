// Tokens -> syntax tree, with jinja2's grammar and operator precedence
// (jinja2/parser.py): condexpr < or < and < not < compare < + - < ~ <
// * / // % < ** < unary, with filters, tests and calls binding to the
// primary they follow.
#pragma once

#include <string_view>

#include "chat/jinja/ast.h"
#include "chat/jinja/template.h"

namespace pagellm::jinja {

// Throws SyntaxError (line, column) for malformed templates, for unknown
// tags, filters and tests (jinja2 rejects those when compiling, too) and for
// sources nested deeper than limits.max_nesting or with an expression deeper
// than limits.max_expr_depth, so that parsing, evaluating and destroying the
// tree stay within the stack.
Body parse_template(std::string_view source, const Limits& limits);

}  // namespace pagellm::jinja
