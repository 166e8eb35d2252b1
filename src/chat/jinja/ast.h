// Syntax tree of a parsed template: expressions and statements as jinja2's
// parser builds them (jinja2.nodes), without the parts we do not support
// (inheritance, includes, imports).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat/jinja/value.h"

namespace pagellm::jinja {

struct Node {
  int line = 0, col = 0;
};

enum class ExprKind : uint8_t {
  Const,
  Name,
  List,
  Tuple,
  Dict,
  GetAttr,
  GetItem,
  Slice,
  Call,
  Filter,
  Test,
  Neg,
  Pos,
  Binary,
  And,
  Or,
  Not,
  Compare,
  Concat,
  Cond,
  NSRef,
};

struct Expr : Node {
  explicit Expr(ExprKind k) : kind(k) {}
  virtual ~Expr() = default;
  ExprKind kind;
  // Levels of the tree below and including this node; the parser bounds it
  // (Limits::max_expr_depth), which bounds evaluating and destroying the tree.
  uint32_t depth = 1;
};
using ExprPtr = std::unique_ptr<Expr>;

struct ConstExpr : Expr {
  ConstExpr() : Expr(ExprKind::Const) {}
  Value value;
};

struct NameExpr : Expr {
  NameExpr() : Expr(ExprKind::Name) {}
  std::string name;
};

struct SeqExpr : Expr {  // List or Tuple literal
  explicit SeqExpr(ExprKind k) : Expr(k) {}
  std::vector<ExprPtr> items;
};

struct DictExpr : Expr {
  DictExpr() : Expr(ExprKind::Dict) {}
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
};

struct GetAttrExpr : Expr {
  GetAttrExpr() : Expr(ExprKind::GetAttr) {}
  ExprPtr object;
  std::string attr;
};

struct GetItemExpr : Expr {
  GetItemExpr() : Expr(ExprKind::GetItem) {}
  ExprPtr object;
  ExprPtr key;  // may be a SliceExpr
};

struct SliceExpr : Expr {
  SliceExpr() : Expr(ExprKind::Slice) {}
  ExprPtr start, stop, step;  // each may be null
};

struct CallArgsExpr {
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  ExprPtr dyn_args, dyn_kwargs;  // *args, **kwargs
};

struct CallExpr : Expr {
  CallExpr() : Expr(ExprKind::Call) {}
  ExprPtr callee;
  CallArgsExpr args;
};

// `input | name(args)`; in filter blocks and `{% set x | f %}` the innermost
// input is null and stands for the rendered body.
struct FilterExpr : Expr {
  FilterExpr() : Expr(ExprKind::Filter) {}
  ExprPtr input;
  std::string name;
  CallArgsExpr args;
};

struct TestExpr : Expr {
  TestExpr() : Expr(ExprKind::Test) {}
  ExprPtr input;
  std::string name;
  CallArgsExpr args;
};

struct UnaryExpr : Expr {  // Neg, Pos, Not
  explicit UnaryExpr(ExprKind k) : Expr(k) {}
  ExprPtr operand;
};

enum class BinOp : uint8_t { Add, Sub, Mul, Div, FloorDiv, Mod, Pow };

struct BinaryExpr : Expr {
  BinaryExpr() : Expr(ExprKind::Binary) {}
  BinOp op = BinOp::Add;
  ExprPtr left, right;
};

struct LogicalExpr : Expr {  // And, Or
  explicit LogicalExpr(ExprKind k) : Expr(k) {}
  ExprPtr left, right;
};

enum class CmpOp : uint8_t { Eq, Ne, Lt, Le, Gt, Ge, In, NotIn };

struct CompareExpr : Expr {
  CompareExpr() : Expr(ExprKind::Compare) {}
  ExprPtr first;
  std::vector<std::pair<CmpOp, ExprPtr>> ops;
};

struct ConcatExpr : Expr {
  ConcatExpr() : Expr(ExprKind::Concat) {}
  std::vector<ExprPtr> items;
};

struct CondExpr : Expr {
  CondExpr() : Expr(ExprKind::Cond) {}
  ExprPtr test, then_expr, else_expr;  // else_expr may be null
};

struct NSRefExpr : Expr {  // `ns.attr` as an assignment target
  NSRefExpr() : Expr(ExprKind::NSRef) {}
  std::string name, attr;
};

// Calls fn(const Expr&) for each direct, non-null sub-expression of e.
template <class Fn>
void for_each_child(const Expr& e, Fn&& fn) {
  auto one = [&](const ExprPtr& x) {
    if (x) fn(*x);
  };
  auto args = [&](const CallArgsExpr& a) {
    for (const auto& x : a.args) one(x);
    for (const auto& kv : a.kwargs) one(kv.second);
    one(a.dyn_args);
    one(a.dyn_kwargs);
  };
  switch (e.kind) {
    case ExprKind::Const:
    case ExprKind::Name:
    case ExprKind::NSRef: return;
    case ExprKind::List:
    case ExprKind::Tuple:
      for (const auto& x : static_cast<const SeqExpr&>(e).items) one(x);
      return;
    case ExprKind::Dict:
      for (const auto& [k, v] : static_cast<const DictExpr&>(e).items) {
        one(k);
        one(v);
      }
      return;
    case ExprKind::GetAttr: one(static_cast<const GetAttrExpr&>(e).object); return;
    case ExprKind::GetItem:
      one(static_cast<const GetItemExpr&>(e).object);
      one(static_cast<const GetItemExpr&>(e).key);
      return;
    case ExprKind::Slice: {
      const auto& s = static_cast<const SliceExpr&>(e);
      one(s.start);
      one(s.stop);
      one(s.step);
      return;
    }
    case ExprKind::Call:
      one(static_cast<const CallExpr&>(e).callee);
      args(static_cast<const CallExpr&>(e).args);
      return;
    case ExprKind::Filter:
      one(static_cast<const FilterExpr&>(e).input);
      args(static_cast<const FilterExpr&>(e).args);
      return;
    case ExprKind::Test:
      one(static_cast<const TestExpr&>(e).input);
      args(static_cast<const TestExpr&>(e).args);
      return;
    case ExprKind::Neg:
    case ExprKind::Pos:
    case ExprKind::Not: one(static_cast<const UnaryExpr&>(e).operand); return;
    case ExprKind::Binary:
      one(static_cast<const BinaryExpr&>(e).left);
      one(static_cast<const BinaryExpr&>(e).right);
      return;
    case ExprKind::And:
    case ExprKind::Or:
      one(static_cast<const LogicalExpr&>(e).left);
      one(static_cast<const LogicalExpr&>(e).right);
      return;
    case ExprKind::Compare:
      one(static_cast<const CompareExpr&>(e).first);
      for (const auto& op : static_cast<const CompareExpr&>(e).ops) one(op.second);
      return;
    case ExprKind::Concat:
      for (const auto& x : static_cast<const ConcatExpr&>(e).items) one(x);
      return;
    case ExprKind::Cond: {
      const auto& c = static_cast<const CondExpr&>(e);
      one(c.test);
      one(c.then_expr);
      one(c.else_expr);
      return;
    }
  }
}

// ---- statements ---------------------------------------------------------------

enum class StmtKind : uint8_t {
  Output,
  If,
  For,
  Set,
  SetBlock,
  Macro,
  CallBlock,
  FilterBlock,
  With,
  Break,
  Continue,
  Scope,  // a body rendered in place ({% generation %})
};

struct Stmt : Node {
  explicit Stmt(StmtKind k) : kind(k) {}
  virtual ~Stmt() = default;
  StmtKind kind;
};
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct OutputStmt : Stmt {
  OutputStmt() : Stmt(StmtKind::Output) {}
  struct Part {
    std::string text;  // literal text when expr is null
    ExprPtr expr;
  };
  std::vector<Part> parts;
};

struct IfStmt : Stmt {
  IfStmt() : Stmt(StmtKind::If) {}
  std::vector<std::pair<ExprPtr, Body>> branches;  // if, elif...
  Body else_body;
};

struct ForStmt : Stmt {
  ForStmt() : Stmt(StmtKind::For) {}
  ExprPtr target;  // Name or Tuple of names
  ExprPtr iter;
  ExprPtr filter;  // `for x in y if cond`
  Body body, else_body;
  bool recursive = false;
};

struct SetStmt : Stmt {
  SetStmt() : Stmt(StmtKind::Set) {}
  ExprPtr target;  // Name, Tuple or NSRef
  ExprPtr value;
};

struct SetBlockStmt : Stmt {
  SetBlockStmt() : Stmt(StmtKind::SetBlock) {}
  ExprPtr target;
  ExprPtr filter;  // FilterExpr chain applied to the body, or null
  Body body;
};

struct MacroStmt : Stmt {
  explicit MacroStmt(StmtKind k = StmtKind::Macro) : Stmt(k) {}
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // for the last defaults.size() params
  Body body;
  // Whether the body refers to these names (jinja2 then accepts extra
  // arguments / a caller).
  bool uses_caller = false, uses_varargs = false, uses_kwargs = false;
};

struct CallBlockStmt : MacroStmt {  // {% call(params) macro(args) %}body{% endcall %}
  CallBlockStmt() : MacroStmt(StmtKind::CallBlock) {}
  ExprPtr call;  // a CallExpr
};

struct FilterBlockStmt : Stmt {
  FilterBlockStmt() : Stmt(StmtKind::FilterBlock) {}
  ExprPtr filter;
  Body body;
};

struct WithStmt : Stmt {
  WithStmt() : Stmt(StmtKind::With) {}
  std::vector<ExprPtr> targets, values;
  Body body;
};

struct ScopeStmt : Stmt {
  explicit ScopeStmt(StmtKind k) : Stmt(k) {}
  Body body;
};

}  // namespace pagellm::jinja
