// Executes a parsed template for one render. Scoping follows jinja2: `for`
// bodies, macros, `with`, call/filter/set blocks get their own frame (a new
// one per loop iteration); `if` does not; macros see the frame they were
// defined in (lexical scope), not their caller's.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chat/jinja/ast.h"
#include "chat/jinja/builtins.h"
#include "chat/jinja/template.h"

namespace pagellm::jinja {

class Frame {
 public:
  explicit Frame(std::shared_ptr<Frame> parent) : parent_(std::move(parent)) {}
  const Value* lookup(std::string_view name) const;
  void set(std::string_view name, Value v) { vars_.set(name, std::move(v)); }
  void clear() { vars_.clear(); }

 private:
  std::shared_ptr<Frame> parent_;
  NameTable vars_;
};
using FramePtr = std::shared_ptr<Frame>;

class Interpreter {
 public:
  explicit Interpreter(const RenderOptions& options);
  ~Interpreter();
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  std::string render(const Body& body, const Value& context);

  // ---- services for builtins -------------------------------------------------
  const RenderOptions& options() const { return opts_; }
  // Counts work against Limits::max_steps (see charge()).
  void step(uint64_t n = 1) { charge(n); }
  void check_string(size_t bytes) const;  // a string about to be built
  void check_items(size_t count) const;   // a list about to be built
  Value call(const Value& callee, CallArgs& args);
  Value getattr(const Value& obj, std::string_view name);
  Value getitem(const Value& obj, const Value& key);
  Value filter(std::string_view name, const Value& input, CallArgs& args) {
    return apply_filter(*this, name, input, args);
  }
  bool test(std::string_view name, const Value& input, CallArgs& args) {
    return apply_test(*this, name, input, args);
  }
  // Objects (namespaces, loops) that may form reference cycles; cleared when the render ends.
  void track(std::shared_ptr<Object> obj) { objects_.push_back(std::move(obj)); }

 private:
  enum class Flow { Normal, Break, Continue };
  friend class LoopObject;

  // `levels` of evaluation (a statement, expression or filter link being
  // run) against Limits::max_eval_depth: the interpreter's recursion depth.
  class DepthScope {
   public:
    explicit DepthScope(Interpreter& in, int levels = 1);
    ~DepthScope() { in_.eval_depth_ -= levels_; }
    DepthScope(const DepthScope&) = delete;
    DepthScope& operator=(const DepthScope&) = delete;

   private:
    Interpreter& in_;
    int levels_;
  };
  // A macro call (macro: its name) or recursive loop (null), against
  // Limits::max_call_depth. Its frames between two evaluation levels take
  // about two levels' stack (measured), so it also counts as kCallLevels.
  static constexpr int kCallLevels = 2;
  class CallScope {
   public:
    CallScope(Interpreter& in, const std::string* macro);
    ~CallScope() { --in_.call_depth_; }
    CallScope(const CallScope&) = delete;
    CallScope& operator=(const CallScope&) = delete;

   private:
    Interpreter& in_;
    DepthScope depth_;
  };

  RenderOptions opts_;
  int eval_depth_ = 0;
  int call_depth_ = 0;
  uint64_t loop_iterations_ = 0;
  std::string* out_ = nullptr;
  const std::string* root_out_ = nullptr;  // the render's output (out_ while not in a macro or block)
  std::vector<std::shared_ptr<Object>> objects_;
  std::vector<FramePtr> closure_frames_;  // frames macros captured (cycles to break)

  void count_iteration();
  void write(std::string_view s);

  Flow exec_body(const Body& body, const FramePtr& f);
  Flow exec(const Stmt& s, const FramePtr& f);
  Flow exec_for(const ForStmt& s, const FramePtr& f, const Value& iterable, int depth);
  std::string render_to_string(const Body& body, const FramePtr& f);
  void assign(const Expr& target, const Value& v, Frame& f);
  Value make_macro(const MacroStmt& m, const FramePtr& closure);
  Value call_macro(const MacroStmt& m, const FramePtr& closure, CallArgs& args);
  Value apply_filter_chain(const Expr& filter, const Value& input, Frame& f);
  std::string render_for_loop(const ForStmt& s, const FramePtr& f, const Value& iterable, int depth);

  Value eval(const Expr& e, Frame& f);
  Value eval_call(const CallExpr& c, Frame& f);
  CallArgs eval_args(const CallArgsExpr& a, Frame& f);
  Value eval_compare(const CompareExpr& c, Frame& f);
  Value eval_slice(const Value& obj, const SliceExpr& s, Frame& f);
};

// Python binary operators with jinja2's Markup rules (a Markup operand
// escapes the other string).
Value binary_op(Interpreter& in, BinOp op, const Value& a, const Value& b);

}  // namespace pagellm::jinja
