#include "chat/jinja/parser.h"

#include <algorithm>
#include <functional>

#include "chat/jinja/builtins.h"
#include "chat/jinja/lexer.h"

namespace pagellm::jinja {

namespace {

// Calls fn for every name an expression or statement reads.
void visit_loaded_names(const Expr* e, const std::function<void(const std::string&)>& fn) {
  if (!e) return;
  if (e->kind == ExprKind::Name) {
    fn(static_cast<const NameExpr*>(e)->name);
    return;
  }
  for_each_child(*e, [&](const Expr& child) { visit_loaded_names(&child, fn); });
}

void visit_loaded_names(const Body& body, const std::function<void(const std::string&)>& fn) {
  for (const auto& s : body) {
    switch (s->kind) {
      case StmtKind::Output:
        for (const auto& p : static_cast<const OutputStmt*>(s.get())->parts) visit_loaded_names(p.expr.get(), fn);
        break;
      case StmtKind::If: {
        auto* i = static_cast<const IfStmt*>(s.get());
        for (const auto& [test, b] : i->branches) {
          visit_loaded_names(test.get(), fn);
          visit_loaded_names(b, fn);
        }
        visit_loaded_names(i->else_body, fn);
        break;
      }
      case StmtKind::For: {
        auto* f = static_cast<const ForStmt*>(s.get());
        visit_loaded_names(f->iter.get(), fn);
        visit_loaded_names(f->filter.get(), fn);
        visit_loaded_names(f->body, fn);
        visit_loaded_names(f->else_body, fn);
        break;
      }
      case StmtKind::Set: visit_loaded_names(static_cast<const SetStmt*>(s.get())->value.get(), fn); break;
      case StmtKind::SetBlock: {
        auto* b = static_cast<const SetBlockStmt*>(s.get());
        visit_loaded_names(b->filter.get(), fn);
        visit_loaded_names(b->body, fn);
        break;
      }
      case StmtKind::Macro:
      case StmtKind::CallBlock: {
        auto* m = static_cast<const MacroStmt*>(s.get());
        for (const auto& d : m->defaults) visit_loaded_names(d.get(), fn);
        visit_loaded_names(m->body, fn);
        if (s->kind == StmtKind::CallBlock) visit_loaded_names(static_cast<const CallBlockStmt*>(s.get())->call.get(), fn);
        break;
      }
      case StmtKind::FilterBlock: {
        auto* b = static_cast<const FilterBlockStmt*>(s.get());
        visit_loaded_names(b->filter.get(), fn);
        visit_loaded_names(b->body, fn);
        break;
      }
      case StmtKind::With: {
        auto* w = static_cast<const WithStmt*>(s.get());
        for (const auto& v : w->values) visit_loaded_names(v.get(), fn);
        visit_loaded_names(w->body, fn);
        break;
      }
      case StmtKind::Scope: visit_loaded_names(static_cast<const ScopeStmt*>(s.get())->body, fn); break;
      case StmtKind::Break:
      case StmtKind::Continue: break;
    }
  }
}

template <class T>
std::unique_ptr<T> node_at(const Token& t, std::unique_ptr<T> n) {
  n->line = t.line;
  n->col = t.col;
  return n;
}

class Parser {
 public:
  Parser(std::vector<Token> tokens, const Limits& limits) : toks_(std::move(tokens)), limits_(limits) {}

  Body parse() {
    Body body = subparse({});
    if (cur().type != Tok::Eof) fail("unexpected '" + describe(cur()) + "'");
    return body;
  }

 private:
  std::vector<Token> toks_;
  const Limits& limits_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  std::vector<std::string> tag_stack_;

  // One level of source nesting (a block, bracket or unary operator), which
  // the parser recurses into.
  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser) : p(parser) {
      if (++p.depth_ > p.limits_.max_nesting) {
        --p.depth_;
        p.fail("template nesting exceeds the limit of " + std::to_string(p.limits_.max_nesting) + " levels");
      }
    }
    ~DepthGuard() { --p.depth_; }
  };

  // Records the depth of a node whose children are attached. Checked as each
  // node is finished, so no tree deeper than the limit is ever built.
  template <class T>
  std::unique_ptr<T> seal(std::unique_ptr<T> n) const {
    uint32_t d = 0;
    for_each_child(*n, [&](const Expr& c) { d = std::max(d, c.depth); });
    n->depth = d + 1;
    if (n->depth > static_cast<uint32_t>(std::max(limits_.max_expr_depth, 1)))
      fail_at_node(*n, "expression nesting exceeds the limit of " + std::to_string(limits_.max_expr_depth) +
                           " levels (each link of a chain such as a.b.c, x|f|g or 1 + 2 + 3 is a level)");
    return n;
  }

  const Token& cur() const { return toks_[pos_]; }
  const Token& look() const { return toks_[std::min(pos_ + 1, toks_.size() - 1)]; }
  const Token& next() {
    const Token& t = toks_[pos_];
    if (pos_ + 1 < toks_.size()) ++pos_;
    return t;
  }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::Eof: return "end of template";
      case Tok::VarEnd: return "end of print statement";
      case Tok::BlockEnd: return "end of statement block";
      case Tok::VarBegin: return "begin of print statement";
      case Tok::BlockBegin: return "begin of statement block";
      case Tok::Data: return "template data";
      default: return t.text;
    }
  }

  [[noreturn]] void fail(const std::string& msg) const { fail_at(cur(), msg); }
  [[noreturn]] static void fail_at(const Token& t, const std::string& msg) { throw SyntaxError(msg, t.line, t.col); }
  [[noreturn]] static void fail_at_node(const Node& n, const std::string& msg) { throw SyntaxError(msg, n.line, n.col); }

  bool skip_op(std::string_view op) {
    if (!cur().is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(std::string_view name) {
    if (!cur().is_name(name)) return false;
    next();
    return true;
  }
  const Token& expect_op(std::string_view op) {
    if (!cur().is_op(op)) fail("expected token '" + std::string(op) + "', got '" + describe(cur()) + "'");
    return next();
  }
  const Token& expect_name() {
    if (cur().type != Tok::Name) fail("expected token 'name', got '" + describe(cur()) + "'");
    return next();
  }
  void expect_name(std::string_view name) {
    if (!cur().is_name(name)) fail("expected token '" + std::string(name) + "', got '" + describe(cur()) + "'");
    next();
  }
  void expect(Tok type, const char* what) {
    if (cur().type != type) {
      if (cur().type == Tok::Eof) fail(std::string("unexpected end of template, expected '") + what + "'");
      fail(std::string("expected token '") + what + "', got '" + describe(cur()) + "'");
    }
    next();
  }

  // ---- statements -------------------------------------------------------------

  Body subparse(const std::vector<std::string_view>& end_tokens) {
    Body body;
    std::unique_ptr<OutputStmt> data;
    auto flush = [&] {
      if (data) body.push_back(std::move(data));
      data.reset();
    };
    while (cur().type != Tok::Eof) {
      const Token& t = cur();
      if (t.type == Tok::Data) {
        if (!data) data = node_at(t, std::make_unique<OutputStmt>());
        data->parts.push_back({t.text, nullptr});
        next();
      } else if (t.type == Tok::VarBegin) {
        if (!data) data = node_at(t, std::make_unique<OutputStmt>());
        next();
        data->parts.push_back({{}, parse_tuple(false, true, {})});
        expect(Tok::VarEnd, "end of print statement");
      } else if (t.type == Tok::BlockBegin) {
        flush();
        next();
        if (cur().type == Tok::Name) {
          for (std::string_view e : end_tokens)
            if (cur().text == e) return body;
        }
        body.push_back(parse_statement());
        expect(Tok::BlockEnd, "end of statement block");
      } else {
        fail("unexpected '" + describe(t) + "'");
      }
    }
    flush();
    return body;
  }

  Body parse_statements(const std::vector<std::string_view>& end_tokens, bool drop_needle) {
    skip_op(":");
    expect(Tok::BlockEnd, "end of statement block");
    Body body = subparse(end_tokens);
    if (cur().type == Tok::Eof) {
      std::string msg = "Unexpected end of template. Jinja was looking for the following tags: ";
      for (size_t i = 0; i < end_tokens.size(); ++i)
        msg += (i ? (i + 1 == end_tokens.size() ? " or '" : ", '") : "'") + std::string(end_tokens[i]) + "'";
      msg += ". The innermost block that needs to be closed is '" + tag_stack_.back() + "'.";
      fail(msg);
    }
    if (drop_needle) next();
    return body;
  }

  StmtPtr parse_statement() {
    DepthGuard guard(*this);
    const Token& t = cur();
    if (t.type != Tok::Name) fail("tag name expected");
    const std::string tag = t.text;
    tag_stack_.push_back(tag);
    StmtPtr s;
    if (tag == "if") {
      s = parse_if();
    } else if (tag == "for") {
      s = parse_for();
    } else if (tag == "set") {
      s = parse_set();
    } else if (tag == "macro") {
      s = parse_macro();
    } else if (tag == "call") {
      s = parse_call_block();
    } else if (tag == "filter") {
      s = parse_filter_block();
    } else if (tag == "with") {
      s = parse_with();
    } else if (tag == "print") {
      s = parse_print();
    } else if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) fail("'" + tag + "' outside loop");
      next();
      s = node_at(t, std::make_unique<Stmt>(tag == "break" ? StmtKind::Break : StmtKind::Continue));
    } else if (tag == "generation") {
      // transformers' AssistantTracker extension: marks assistant text, renders in place.
      auto g = node_at(t, std::make_unique<ScopeStmt>(StmtKind::Scope));
      next();
      g->body = parse_statements({"endgeneration"}, true);
      s = std::move(g);
    } else if (tag == "block" || tag == "extends" || tag == "include" || tag == "import" || tag == "from" ||
               tag == "autoescape") {
      fail("the '" + tag + "' tag is not supported in chat templates");
    } else {
      fail("Encountered unknown tag '" + tag + "'.");
    }
    tag_stack_.pop_back();
    return s;
  }

  StmtPtr parse_if() {
    auto node = node_at(cur(), std::make_unique<IfStmt>());
    next();
    while (true) {
      ExprPtr test = parse_tuple(false, false, {});
      Body body = parse_statements({"elif", "else", "endif"}, false);
      node->branches.emplace_back(std::move(test), std::move(body));
      const Token& t = next();
      if (t.is_name("elif")) continue;
      if (t.is_name("else")) node->else_body = parse_statements({"endif"}, true);
      break;
    }
    return node;
  }

  StmtPtr parse_for() {
    auto node = node_at(cur(), std::make_unique<ForStmt>());
    next();
    node->target = parse_assign_target(true, false, {"in"}, false);
    expect_name("in");
    node->iter = parse_tuple(false, false, {"recursive"});
    if (skip_name("if")) node->filter = parse_expression(true);
    node->recursive = skip_name("recursive");
    ++loop_depth_;
    node->body = parse_statements({"endfor", "else"}, false);
    --loop_depth_;
    if (next().is_name("else")) {
      const int saved = loop_depth_;
      loop_depth_ = 0;  // break/continue in the else block have no loop
      node->else_body = parse_statements({"endfor"}, true);
      loop_depth_ = saved;
    }
    return node;
  }

  StmtPtr parse_set() {
    const Token& start = cur();
    next();
    ExprPtr target = parse_assign_target(true, false, {}, true);
    if (skip_op("=")) {
      auto node = node_at(start, std::make_unique<SetStmt>());
      node->target = std::move(target);
      node->value = parse_tuple(false, true, {});
      return node;
    }
    auto node = node_at(start, std::make_unique<SetBlockStmt>());
    node->target = std::move(target);
    node->filter = parse_filter(nullptr, false);
    node->body = parse_statements({"endset"}, true);
    return node;
  }

  void parse_signature(MacroStmt& node) {
    expect_op("(");
    while (!cur().is_op(")")) {
      if (!node.params.empty()) expect_op(",");
      node.params.push_back(expect_name().text);
      if (skip_op("=")) {
        node.defaults.push_back(parse_expression(true));
      } else if (!node.defaults.empty()) {
        fail("non-default argument follows default argument");
      }
    }
    expect_op(")");
  }

  void finish_macro(MacroStmt& node, const char* end_tag) {
    const int saved = loop_depth_;
    loop_depth_ = 0;
    node.body = parse_statements({end_tag}, true);
    loop_depth_ = saved;
    visit_loaded_names(node.body, [&](const std::string& name) {
      if (name == "caller") node.uses_caller = true;
      if (name == "varargs") node.uses_varargs = true;
      if (name == "kwargs") node.uses_kwargs = true;
    });
  }

  StmtPtr parse_macro() {
    auto node = node_at(cur(), std::make_unique<MacroStmt>());
    next();
    node->name = expect_name().text;
    parse_signature(*node);
    finish_macro(*node, "endmacro");
    return node;
  }

  StmtPtr parse_call_block() {
    auto node = node_at(cur(), std::make_unique<CallBlockStmt>());
    next();
    if (cur().is_op("(")) parse_signature(*node);
    node->call = parse_expression(true);
    if (node->call->kind != ExprKind::Call) fail_at(toks_[pos_], "expected call");
    node->name = "caller";
    finish_macro(*node, "endcall");
    return node;
  }

  StmtPtr parse_filter_block() {
    auto node = node_at(cur(), std::make_unique<FilterBlockStmt>());
    next();
    node->filter = parse_filter(nullptr, true);
    node->body = parse_statements({"endfilter"}, true);
    return node;
  }

  StmtPtr parse_with() {
    auto node = node_at(cur(), std::make_unique<WithStmt>());
    next();
    while (cur().type != Tok::BlockEnd) {
      if (!node->targets.empty()) expect_op(",");
      node->targets.push_back(parse_assign_target(true, false, {}, false));
      expect_op("=");
      node->values.push_back(parse_expression(true));
    }
    node->body = parse_statements({"endwith"}, true);
    return node;
  }

  StmtPtr parse_print() {
    auto node = node_at(cur(), std::make_unique<OutputStmt>());
    next();
    while (cur().type != Tok::BlockEnd) {
      if (!node->parts.empty()) expect_op(",");
      node->parts.push_back({{}, parse_expression(true)});
    }
    return node;
  }

  static bool can_assign(const Expr& e) {
    if (e.kind == ExprKind::Name || e.kind == ExprKind::NSRef) return true;
    if (e.kind == ExprKind::Tuple) {
      for (const auto& x : static_cast<const SeqExpr&>(e).items)
        if (!can_assign(*x)) return false;
      return true;
    }
    return false;
  }

  ExprPtr parse_assign_target(bool with_tuple, bool name_only, const std::vector<std::string_view>& extra_end,
                              bool with_namespace) {
    const Token& start = cur();
    ExprPtr target;
    if (name_only) {
      auto n = node_at(start, std::make_unique<NameExpr>());
      n->name = expect_name().text;
      target = std::move(n);
    } else if (with_tuple) {
      target = parse_tuple(true, true, extra_end, with_namespace);
    } else {
      target = parse_primary(with_namespace);
    }
    if (!can_assign(*target)) {
      static const char* kNames[] = {"const", "name", "list", "tuple", "dict", "getattr", "getitem", "slice",
                                     "call", "filter", "test", "neg", "pos", "binary", "and", "or", "not",
                                     "compare", "concat", "condexpr", "nsref"};
      fail_at(start, std::string("can't assign to '") + kNames[static_cast<int>(target->kind)] + "'");
    }
    return target;
  }

  // ---- expressions ------------------------------------------------------------

  bool is_tuple_end(const std::vector<std::string_view>& extra_end) const {
    const Token& t = cur();
    if (t.type == Tok::VarEnd || t.type == Tok::BlockEnd || t.is_op(")")) return true;
    if (t.type == Tok::Name)
      for (std::string_view e : extra_end)
        if (t.text == e) return true;
    return false;
  }

  ExprPtr parse_tuple(bool simplified, bool with_condexpr, const std::vector<std::string_view>& extra_end,
                      bool with_namespace = false, bool explicit_parens = false) {
    const Token& start = cur();
    std::vector<ExprPtr> args;
    bool is_tuple = false;
    while (true) {
      if (!args.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      args.push_back(simplified ? parse_primary(with_namespace) : parse_expression(with_condexpr));
      if (cur().is_op(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!args.empty()) return std::move(args[0]);
      if (!explicit_parens) fail("Expected an expression, got '" + describe(cur()) + "'");
    }
    auto t = node_at(start, std::make_unique<SeqExpr>(ExprKind::Tuple));
    t->items = std::move(args);
    return seal(std::move(t));
  }

  ExprPtr parse_expression(bool with_condexpr) { return with_condexpr ? parse_condexpr() : parse_or(); }

  ExprPtr parse_condexpr() {
    const Token* start = &cur();
    ExprPtr expr1 = parse_or();
    while (skip_name("if")) {
      auto c = node_at(*start, std::make_unique<CondExpr>());
      c->test = parse_or();
      if (skip_name("else")) {
        DepthGuard guard(*this);
        c->else_expr = parse_condexpr();
      }
      c->then_expr = std::move(expr1);
      expr1 = seal(std::move(c));
      start = &cur();
    }
    return expr1;
  }

  ExprPtr parse_or() {
    const Token& start = cur();
    ExprPtr left = parse_and();
    while (skip_name("or")) {
      auto n = node_at(start, std::make_unique<LogicalExpr>(ExprKind::Or));
      n->left = std::move(left);
      n->right = parse_and();
      left = seal(std::move(n));
    }
    return left;
  }

  ExprPtr parse_and() {
    const Token& start = cur();
    ExprPtr left = parse_not();
    while (skip_name("and")) {
      auto n = node_at(start, std::make_unique<LogicalExpr>(ExprKind::And));
      n->left = std::move(left);
      n->right = parse_not();
      left = seal(std::move(n));
    }
    return left;
  }

  ExprPtr parse_not() {
    if (cur().is_name("not")) {
      DepthGuard guard(*this);
      auto n = node_at(cur(), std::make_unique<UnaryExpr>(ExprKind::Not));
      next();
      n->operand = parse_not();
      return seal(std::move(n));
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const Token& start = cur();
    ExprPtr expr = parse_math1();
    std::vector<std::pair<CmpOp, ExprPtr>> ops;
    while (true) {
      const Token& t = cur();
      CmpOp op;
      if (t.is_op("==")) {
        op = CmpOp::Eq;
      } else if (t.is_op("!=")) {
        op = CmpOp::Ne;
      } else if (t.is_op("<")) {
        op = CmpOp::Lt;
      } else if (t.is_op("<=")) {
        op = CmpOp::Le;
      } else if (t.is_op(">")) {
        op = CmpOp::Gt;
      } else if (t.is_op(">=")) {
        op = CmpOp::Ge;
      } else if (t.is_name("in")) {
        op = CmpOp::In;
      } else if (t.is_name("not") && look().is_name("in")) {
        next();
        op = CmpOp::NotIn;
      } else {
        break;
      }
      next();
      ops.emplace_back(op, parse_math1());
    }
    if (ops.empty()) return expr;
    auto c = node_at(start, std::make_unique<CompareExpr>());
    c->first = std::move(expr);
    c->ops = std::move(ops);
    return seal(std::move(c));
  }

  ExprPtr binary(const Token& at, BinOp op, ExprPtr l, ExprPtr r) {
    auto b = node_at(at, std::make_unique<BinaryExpr>());
    b->op = op;
    b->left = std::move(l);
    b->right = std::move(r);
    return seal(std::move(b));
  }

  ExprPtr parse_math1() {
    const Token& start = cur();
    ExprPtr left = parse_concat();
    while (cur().is_op("+") || cur().is_op("-")) {
      const BinOp op = next().text == "+" ? BinOp::Add : BinOp::Sub;
      left = binary(start, op, std::move(left), parse_concat());
    }
    return left;
  }

  ExprPtr parse_concat() {
    const Token& start = cur();
    ExprPtr first = parse_math2();
    if (!cur().is_op("~")) return first;
    auto c = node_at(start, std::make_unique<ConcatExpr>());
    c->items.push_back(std::move(first));
    while (skip_op("~")) c->items.push_back(parse_math2());
    return seal(std::move(c));
  }

  ExprPtr parse_math2() {
    const Token& start = cur();
    ExprPtr left = parse_pow();
    while (true) {
      BinOp op;
      if (cur().is_op("*")) {
        op = BinOp::Mul;
      } else if (cur().is_op("/")) {
        op = BinOp::Div;
      } else if (cur().is_op("//")) {
        op = BinOp::FloorDiv;
      } else if (cur().is_op("%")) {
        op = BinOp::Mod;
      } else {
        break;
      }
      next();
      left = binary(start, op, std::move(left), parse_pow());
    }
    return left;
  }

  ExprPtr parse_pow() {
    const Token& start = cur();
    ExprPtr left = parse_unary(true);
    while (skip_op("**")) left = binary(start, BinOp::Pow, std::move(left), parse_unary(true));
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    const Token& start = cur();
    ExprPtr node;
    if (start.is_op("-") || start.is_op("+")) {
      DepthGuard guard(*this);
      auto u = node_at(start, std::make_unique<UnaryExpr>(start.text == "-" ? ExprKind::Neg : ExprKind::Pos));
      next();
      u->operand = parse_unary(false);
      node = seal(std::move(u));
    } else {
      node = parse_primary(false);
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary(bool with_namespace) {
    const Token& t = cur();
    if (t.type == Tok::Name) {
      next();
      if (t.text == "true" || t.text == "True" || t.text == "false" || t.text == "False") {
        auto c = node_at(t, std::make_unique<ConstExpr>());
        c->value = Value::boolean(t.text == "true" || t.text == "True");
        return c;
      }
      if (t.text == "none" || t.text == "None") {
        auto c = node_at(t, std::make_unique<ConstExpr>());
        c->value = Value::none();
        return c;
      }
      if (with_namespace && cur().is_op(".")) {
        next();
        auto ns = node_at(t, std::make_unique<NSRefExpr>());
        ns->name = t.text;
        ns->attr = expect_name().text;
        return ns;
      }
      auto n = node_at(t, std::make_unique<NameExpr>());
      n->name = t.text;
      return n;
    }
    if (t.type == Tok::String) {
      std::string s = next().text;
      while (cur().type == Tok::String) s += next().text;  // adjacent literals concatenate
      auto c = node_at(t, std::make_unique<ConstExpr>());
      c->value = Value::string(std::move(s));
      return c;
    }
    if (t.type == Tok::Integer || t.type == Tok::Float) {
      next();
      auto c = node_at(t, std::make_unique<ConstExpr>());
      c->value = t.type == Tok::Integer ? Value::integer(t.ival) : Value::number(t.fval);
      return c;
    }
    DepthGuard guard(*this);
    if (t.is_op("(")) {
      next();
      ExprPtr e = parse_tuple(false, true, {}, false, true);
      expect_op(")");
      return e;
    }
    if (t.is_op("[")) return parse_list();
    if (t.is_op("{")) return parse_dict();
    fail("unexpected '" + describe(t) + "'");
  }

  ExprPtr parse_list() {
    auto l = node_at(cur(), std::make_unique<SeqExpr>(ExprKind::List));
    expect_op("[");
    while (!cur().is_op("]")) {
      if (!l->items.empty()) expect_op(",");
      if (cur().is_op("]")) break;
      l->items.push_back(parse_expression(true));
    }
    expect_op("]");
    return seal(std::move(l));
  }

  ExprPtr parse_dict() {
    auto d = node_at(cur(), std::make_unique<DictExpr>());
    expect_op("{");
    while (!cur().is_op("}")) {
      if (!d->items.empty()) expect_op(",");
      if (cur().is_op("}")) break;
      ExprPtr k = parse_expression(true);
      expect_op(":");
      d->items.emplace_back(std::move(k), parse_expression(true));
    }
    expect_op("}");
    return seal(std::move(d));
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (cur().is_op(".") || cur().is_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (cur().is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (cur().is_op("|")) {
        node = parse_filter(std::move(node), false);
      } else if (cur().is_name("is")) {
        node = parse_test(std::move(node));
      } else if (cur().is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    const Token& t = next();
    if (t.is_op(".")) {
      const Token& attr = cur();
      next();
      if (attr.type == Tok::Name) {
        auto g = node_at(t, std::make_unique<GetAttrExpr>());
        g->object = std::move(node);
        g->attr = attr.text;
        return seal(std::move(g));
      }
      if (attr.type != Tok::Integer) fail_at(attr, "expected name or number");
      auto key = node_at(attr, std::make_unique<ConstExpr>());
      key->value = Value::integer(attr.ival);
      auto g = node_at(t, std::make_unique<GetItemExpr>());
      g->object = std::move(node);
      g->key = std::move(key);
      return seal(std::move(g));
    }
    DepthGuard guard(*this);
    std::vector<ExprPtr> args;
    while (!cur().is_op("]")) {
      if (!args.empty()) expect_op(",");
      args.push_back(parse_subscribed());
    }
    expect_op("]");
    auto g = node_at(t, std::make_unique<GetItemExpr>());
    g->object = std::move(node);
    if (args.size() == 1) {
      g->key = std::move(args[0]);
    } else {
      auto tup = node_at(t, std::make_unique<SeqExpr>(ExprKind::Tuple));
      tup->items = std::move(args);
      g->key = seal(std::move(tup));
    }
    return seal(std::move(g));
  }

  ExprPtr parse_subscribed() {
    const Token& start = cur();
    auto slice = node_at(start, std::make_unique<SliceExpr>());
    if (cur().is_op(":")) {
      next();
    } else {
      ExprPtr e = parse_expression(true);
      if (!cur().is_op(":")) return e;
      next();
      slice->start = std::move(e);
    }
    if (!cur().is_op(":") && !cur().is_op("]") && !cur().is_op(",")) slice->stop = parse_expression(true);
    if (cur().is_op(":")) {
      next();
      if (!cur().is_op("]") && !cur().is_op(",")) slice->step = parse_expression(true);
    }
    return seal(std::move(slice));
  }

  CallArgsExpr parse_call_args() {
    DepthGuard guard(*this);
    const Token& open = expect_op("(");
    CallArgsExpr a;
    bool require_comma = false;
    auto ensure = [&](bool ok) {
      if (!ok) fail_at(open, "invalid syntax for function call expression");
    };
    while (!cur().is_op(")")) {
      if (require_comma) {
        expect_op(",");
        if (cur().is_op(")")) break;
      }
      if (cur().is_op("*")) {
        ensure(!a.dyn_args && !a.dyn_kwargs);
        next();
        a.dyn_args = parse_expression(true);
      } else if (cur().is_op("**")) {
        ensure(!a.dyn_kwargs);
        next();
        a.dyn_kwargs = parse_expression(true);
      } else if (cur().type == Tok::Name && look().is_op("=")) {
        ensure(!a.dyn_kwargs);
        std::string key = next().text;
        next();
        a.kwargs.emplace_back(std::move(key), parse_expression(true));
      } else {
        ensure(!a.dyn_args && !a.dyn_kwargs && a.kwargs.empty());
        a.args.push_back(parse_expression(true));
      }
      require_comma = true;
    }
    expect_op(")");
    return a;
  }

  ExprPtr parse_call(ExprPtr node) {
    auto c = node_at(cur(), std::make_unique<CallExpr>());
    c->callee = std::move(node);
    c->args = parse_call_args();
    return seal(std::move(c));
  }

  std::string dotted_name() {
    std::string name = expect_name().text;
    while (cur().is_op(".")) {
      next();
      name += "." + expect_name().text;
    }
    return name;
  }

  ExprPtr parse_filter(ExprPtr node, bool start_inline) {
    while (cur().is_op("|") || start_inline) {
      if (!start_inline) next();
      start_inline = false;
      const Token& t = cur();
      auto f = node_at(t, std::make_unique<FilterExpr>());
      f->name = dotted_name();
      if (!is_filter_name(f->name)) fail_at(t, "No filter named '" + f->name + "'.");
      if (cur().is_op("(")) f->args = parse_call_args();
      f->input = std::move(node);
      node = seal(std::move(f));
    }
    return node;
  }

  ExprPtr parse_test(ExprPtr node) {
    const Token& is_tok = next();
    const bool negated = skip_name("not");
    const Token& name_tok = cur();
    auto t = node_at(is_tok, std::make_unique<TestExpr>());
    t->name = dotted_name();
    if (!is_test_name(t->name)) fail_at(name_tok, "No test named '" + t->name + "'.");
    const Token& c = cur();
    if (c.is_op("(")) {
      t->args = parse_call_args();
    } else if ((c.type == Tok::Name || c.type == Tok::String || c.type == Tok::Integer || c.type == Tok::Float ||
                c.is_op("[") || c.is_op("{")) &&
               !c.is_name("else") && !c.is_name("or") && !c.is_name("and")) {
      if (c.is_name("is")) fail("You cannot chain multiple tests with is");
      t->args.args.push_back(parse_postfix(parse_primary(false)));
    }
    t->input = std::move(node);
    if (!negated) return seal(std::move(t));
    auto n = node_at(is_tok, std::make_unique<UnaryExpr>(ExprKind::Not));
    n->operand = seal(std::move(t));
    return seal(std::move(n));
  }
};

}  // namespace

Body parse_template(std::string_view source, const Limits& limits) { return Parser(tokenize(source), limits).parse(); }

}  // namespace pagellm::jinja
