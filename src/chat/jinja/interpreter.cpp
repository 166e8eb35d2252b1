#include "chat/jinja/interpreter.h"

#include <cmath>
#include <limits>

#include "chat/jinja/errors.h"
#include "chat/jinja/parser.h"
#include "chat/jinja/text.h"

namespace pagellm::jinja {

// ---- frames -------------------------------------------------------------------

const Value* Frame::lookup(std::string_view name) const {
  for (const Frame* f = this; f; f = f->parent_.get())
    if (const Value* v = f->vars_.find(name)) return v;
  return nullptr;
}

namespace {

const FramePtr& globals_frame() {
  static const FramePtr frame = [] {
    auto f = std::make_shared<Frame>(nullptr);
    for (auto& [name, value] : make_globals()) f->set(name, std::move(value));
    return f;
  }();
  return frame;
}

std::string undefined_name_message(std::string_view name) { return text::py_repr(name) + " is undefined"; }

// jinja2's Undefined for a missing attribute / item of `obj`.
Value missing_attr(const Value& obj, std::string_view name) {
  return Value::undefined(text::py_repr(object_type_repr(obj)) + " has no attribute " + text::py_repr(name));
}
Value missing_element(const Value& obj, const Value& key) {
  return Value::undefined(object_type_repr(obj) + " has no element " + repr(key));
}

// Python's slice index adjustment for a sequence of `len` elements.
struct SliceRange {
  int64_t start, stop, step, count;
  // The i-th index taken, i < count: within the sequence, where stepping on
  // past the last one (start + count * step) could overflow.
  size_t at(int64_t i) const { return static_cast<size_t>(start + i * step); }
};
SliceRange adjust_slice(int64_t len, const Value& start, const Value& stop, const Value& step) {
  auto as_index = [](const Value& v) -> std::optional<int64_t> {
    if (v.is_none() || v.is_undefined()) return std::nullopt;
    if (!v.is_integral()) raise("TypeError", "slice indices must be integers or None or have an __index__ method");
    return v.as_int();
  };
  const int64_t st = as_index(step).value_or(1);
  if (st == 0) raise("ValueError", "slice step cannot be zero");
  const int64_t lower = st > 0 ? 0 : -1, upper = st > 0 ? len : len - 1;
  auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t x = *v;
    if (x < 0) {
      x += len;
      if (x < lower) x = lower;
    } else if (x > upper) {
      x = upper;
    }
    return x;
  };
  const int64_t b = clamp(as_index(start), st > 0 ? 0 : len - 1);
  const int64_t e = clamp(as_index(stop), st > 0 ? len : -1);
  // ceil(distance / |step|) without forming distance + |step| (or -INT64_MIN).
  int64_t count = 0;
  if (st > 0 && b < e) count = (e - b - 1) / st + 1;
  if (st < 0 && b > e) {
    const uint64_t magnitude = 0 - static_cast<uint64_t>(st);
    count = static_cast<int64_t>((static_cast<uint64_t>(b - e) - 1) / magnitude + 1);
  }
  return {b, e, st, count};
}

// Integer arithmetic with Python results; int64 overflow is reported
// instead of growing into a big integer.
int64_t checked(bool overflow, int64_t v, const char* op) {
  if (overflow) raise_int_overflow(op);
  return v;
}

Value repeat(Interpreter& in, const Value& seq, int64_t n) {
  const size_t size = seq.is_string() ? seq.str().size() : seq.items().size();
  // An empty sequence stays empty however large n is: no loop of n steps.
  if (n <= 0 || size == 0) return seq.is_string() ? Value::string("", seq.is_safe()) : Value::list({}, seq.seq_kind());
  const size_t total = mul_sat(size, static_cast<uint64_t>(n));
  if (seq.is_string()) {
    in.check_string(total);
    std::string out;
    out.reserve(total);
    for (int64_t i = 0; i < n; ++i) out += seq.str();
    return Value::string(std::move(out), seq.is_safe());
  }
  in.check_items(total);
  std::vector<Value> out;
  out.reserve(total);
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.items().begin(), seq.items().end());
  return Value::list(std::move(out), seq.seq_kind());
}

double float_floordiv(double a, double b) {
  if (b == 0) raise("ZeroDivisionError", "float floor division by zero");
  double mod = std::fmod(a, b);
  double div = (a - mod) / b;
  if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1.0;
  if (div == 0) return std::copysign(0.0, a / b);
  double fl = std::floor(div);
  if (div - fl > 0.5) fl += 1.0;
  return fl;
}

double float_mod(double a, double b) {
  if (b == 0) raise("ZeroDivisionError", "float modulo");
  double mod = std::fmod(a, b);
  if (mod != 0) {
    if ((b < 0) != (mod < 0)) mod += b;
  } else {
    mod = std::copysign(0.0, b);
  }
  return mod;
}

[[noreturn]] void unsupported(const char* op, const Value& a, const Value& b) {
  raise("TypeError", std::string("unsupported operand type(s) for ") + op + ": '" + type_name(a) + "' and '" +
                         type_name(b) + "'");
}

}  // namespace

Value binary_op(Interpreter& in, BinOp op, const Value& a, const Value& b) {
  if (a.is_undefined()) raise_undefined(a);
  if (b.is_undefined()) raise_undefined(b);
  const bool ints = a.is_integral() && b.is_integral();
  const bool nums = a.is_number() && b.is_number();
  switch (op) {
    case BinOp::Add:
      if (ints) {
        int64_t r = 0;
        const bool overflow = __builtin_add_overflow(a.as_int(), b.as_int(), &r);
        return Value::integer(checked(overflow, r, "+"));
      }
      if (nums) return Value::number(a.as_float() + b.as_float());
      if (a.is_string() && b.is_string()) {
        in.check_string(a.str().size() + b.str().size());
        // Markup + str escapes the str (and the other way round).
        if (a.is_safe() || b.is_safe()) {
          return Value::string((a.is_safe() ? a.str() : text::html_escape(a.str())) +
                                   (b.is_safe() ? b.str() : text::html_escape(b.str())),
                               true);
        }
        return Value::string(a.str() + b.str());
      }
      if (a.is_list() && b.is_list() && a.seq_kind() == b.seq_kind() &&
          (a.seq_kind() == SeqKind::List || a.seq_kind() == SeqKind::Tuple)) {
        in.check_items(a.items().size() + b.items().size());
        std::vector<Value> out = a.items();
        out.insert(out.end(), b.items().begin(), b.items().end());
        return Value::list(std::move(out), a.seq_kind());
      }
      if (a.is_string() && !a.is_safe())
        raise("TypeError", "can only concatenate str (not \"" + type_name(b) + "\") to str");
      if (a.is_list() && (a.seq_kind() == SeqKind::List || a.seq_kind() == SeqKind::Tuple))
        raise("TypeError", "can only concatenate " + type_name(a) + " (not \"" + type_name(b) + "\") to " + type_name(a));
      unsupported("+", a, b);
    case BinOp::Sub:
      if (ints) {
        int64_t r = 0;
        const bool overflow = __builtin_sub_overflow(a.as_int(), b.as_int(), &r);
        return Value::integer(checked(overflow, r, "-"));
      }
      if (nums) return Value::number(a.as_float() - b.as_float());
      unsupported("-", a, b);
    case BinOp::Mul:
      if (ints) {
        int64_t r = 0;
        const bool overflow = __builtin_mul_overflow(a.as_int(), b.as_int(), &r);
        return Value::integer(checked(overflow, r, "*"));
      }
      if (nums) return Value::number(a.as_float() * b.as_float());
      if ((a.is_string() || a.is_list()) && b.is_integral()) {
        if (a.is_list() && a.seq_kind() != SeqKind::List && a.seq_kind() != SeqKind::Tuple) unsupported("*", a, b);
        return repeat(in, a, b.as_int());
      }
      if (a.is_integral() && (b.is_string() || b.is_list())) {
        if (b.is_list() && b.seq_kind() != SeqKind::List && b.seq_kind() != SeqKind::Tuple) unsupported("*", a, b);
        return repeat(in, b, a.as_int());
      }
      if ((a.is_string() || a.is_list()) && b.is_number())
        raise("TypeError", "can't multiply sequence by non-int of type '" + type_name(b) + "'");
      unsupported("*", a, b);
    case BinOp::Div:
      if (nums) {
        if (b.as_float() == 0) raise("ZeroDivisionError", "division by zero");
        return Value::number(a.as_float() / b.as_float());
      }
      unsupported("/", a, b);
    case BinOp::FloorDiv:
      if (ints) {
        const int64_t x = a.as_int(), y = b.as_int();
        if (y == 0) raise("ZeroDivisionError", "integer division or modulo by zero");
        if (x == std::numeric_limits<int64_t>::min() && y == -1) raise_int_overflow("//");
        int64_t q = x / y;
        if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
        return Value::integer(q);
      }
      if (nums) return Value::number(float_floordiv(a.as_float(), b.as_float()));
      unsupported("//", a, b);
    case BinOp::Mod:
      if (ints) {
        const int64_t x = a.as_int(), y = b.as_int();
        if (y == 0) raise("ZeroDivisionError", "integer modulo by zero");
        if (y == -1) return Value::integer(0);
        int64_t m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) m += y;
        return Value::integer(m);
      }
      if (nums) return Value::number(float_mod(a.as_float(), b.as_float()));
      if (a.is_string()) return Value::string(percent_format(in, a.str(), b, a.is_safe()), a.is_safe());
      unsupported("%", a, b);
    case BinOp::Pow:
      if (ints && b.as_int() >= 0) {
        int64_t base = a.as_int(), e = b.as_int(), r = 1;
        while (e > 0) {
          if (e & 1) checked(__builtin_mul_overflow(r, base, &r), 0, "**");
          e >>= 1;
          if (e > 0) checked(__builtin_mul_overflow(base, base, &base), 0, "**");
        }
        return Value::integer(r);
      }
      if (nums) {
        if (a.as_float() == 0 && b.as_float() < 0)
          raise("ZeroDivisionError", "0.0 cannot be raised to a negative power");
        return Value::number(std::pow(a.as_float(), b.as_float()));
      }
      unsupported("** or pow()", a, b);
  }
  unsupported("?", a, b);
}

// ---- objects ------------------------------------------------------------------

namespace {

bool is_seq(const Value& v) {
  return v.is_list() && (v.seq_kind() == SeqKind::List || v.seq_kind() == SeqKind::Tuple || v.seq_kind() == SeqKind::Range);
}

}  // namespace

// jinja2.runtime.LoopContext: loop.index, loop.first, loop.cycle(...), ...
// Recursive loops are callable: loop(children) renders the body again one level deeper.
class LoopObject : public Object {
 public:
  LoopObject(Interpreter& in, std::shared_ptr<const std::vector<Value>> items, int depth, const ForStmt* recursive,
             FramePtr frame)
      : in_(in), items_(std::move(items)), depth_(depth), recursive_(recursive), frame_(std::move(frame)) {}

  size_t index0 = 0;

  std::string repr() const override {
    return "<LoopContext " + std::to_string(index0 + 1) + "/" + std::to_string(items_->size()) + ">";
  }
  std::string type_repr() const override { return "jinja2.runtime.LoopContext object"; }
  bool is_callable() const override { return true; }
  void clear() override { frame_.reset(); }

  std::optional<Value> get_attr(std::string_view name) const override {
    const int64_t n = static_cast<int64_t>(items_->size()), i = static_cast<int64_t>(index0);
    if (name == "index0") return Value::integer(i);
    if (name == "index") return Value::integer(i + 1);
    if (name == "revindex0") return Value::integer(n - i - 1);
    if (name == "revindex") return Value::integer(n - i);
    if (name == "first") return Value::boolean(i == 0);
    if (name == "last") return Value::boolean(i == n - 1);
    if (name == "length") return Value::integer(n);
    if (name == "depth") return Value::integer(depth_);
    if (name == "depth0") return Value::integer(depth_ - 1);
    if (name == "previtem")
      return i > 0 ? (*items_)[index0 - 1] : Value::undefined("there is no previous item");
    if (name == "nextitem")
      return i + 1 < n ? (*items_)[index0 + 1] : Value::undefined("there is no next item");
    if (name == "cycle") {
      const size_t idx = index0;
      return Value::function("cycle", [idx](Interpreter&, CallArgs& a) -> Value {
        if (a.args.empty()) raise("TypeError", "no items for cycling given");
        return a.args[idx % a.args.size()];
      }, "<bound method LoopContext.cycle>");
    }
    if (name == "changed") {
      auto last = last_changed_;
      return Value::function("changed", [last](Interpreter&, CallArgs& a) -> Value {
        Value now = Value::list(a.args, SeqKind::Tuple);
        if (last->has_value() && equal(**last, now)) return Value::boolean(false);
        *last = now;
        return Value::boolean(true);
      }, "<bound method LoopContext.changed>");
    }
    return std::nullopt;
  }

  Value call(CallArgs& args) {
    if (!recursive_)
      raise("TypeError", "The loop must have the 'recursive' marker to be called recursively.");
    if (args.args.size() != 1 || !args.kwargs.empty()) raise("TypeError", "loop() takes exactly one argument");
    return Value::string(in_.render_for_loop(*recursive_, frame_, args.args[0], depth_ + 1));
  }

 private:
  Interpreter& in_;
  std::shared_ptr<const std::vector<Value>> items_;
  int depth_;
  const ForStmt* recursive_;
  FramePtr frame_;
  std::shared_ptr<std::optional<Value>> last_changed_ = std::make_shared<std::optional<Value>>();
};

// ---- interpreter ----------------------------------------------------------------

Interpreter::Interpreter(const RenderOptions& options) : opts_(options) {}

Interpreter::~Interpreter() {
  // Macros hold the frame they were defined in and frames hold the macros;
  // namespaces can hold themselves. Break those cycles.
  for (auto& f : closure_frames_) f->clear();
  for (auto& o : objects_) o->clear();
}

Interpreter::DepthScope::DepthScope(Interpreter& in, int levels) : in_(in), levels_(levels) {
  in_.eval_depth_ += levels_;
  if (in_.eval_depth_ > in_.opts_.limits.max_eval_depth) {
    in_.eval_depth_ -= levels_;
    raise("RecursionError", "template evaluation nests deeper than the limit of " +
                                std::to_string(in_.opts_.limits.max_eval_depth) + " levels (recursive macros?)");
  }
}

Interpreter::CallScope::CallScope(Interpreter& in, const std::string* macro)
    : in_(in), depth_(in, kCallLevels) {
  if (++in_.call_depth_ > in_.opts_.limits.max_call_depth) {
    --in_.call_depth_;
    raise("RecursionError", "template calls nest deeper than the limit of " +
                                std::to_string(in_.opts_.limits.max_call_depth) + " (" +
                                (macro ? "macro " + text::py_repr(*macro) : std::string("recursive loop")) + ")");
  }
}

void Interpreter::check_string(size_t bytes) const {
  if (bytes > opts_.limits.max_string_bytes)
    raise_size_limit("string", "bytes", bytes, opts_.limits.max_string_bytes);
}

void Interpreter::check_items(size_t count) const {
  if (count > opts_.limits.max_items) raise_size_limit("list", "items", count, opts_.limits.max_items);
}

void Interpreter::count_iteration() {
  step();
  if (++loop_iterations_ > opts_.limits.max_loop_iterations)
    raise("ResourceLimitError",
          "template loop iterations exceed the limit of " + std::to_string(opts_.limits.max_loop_iterations));
}

void Interpreter::write(std::string_view s) {
  const size_t size = out_->size() + s.size();
  if (out_ == root_out_ && size > opts_.limits.max_output_bytes)
    raise_size_limit("output", "bytes", size, opts_.limits.max_output_bytes);
  check_string(size);
  charge_bytes(s.size());
  out_->append(s);
}

std::string Interpreter::render(const Body& body, const Value& context) {
  LimitScope limits(opts_.limits.max_string_bytes, opts_.limits.max_items, opts_.limits.max_steps);
  auto root = std::make_shared<Frame>(globals_frame());
  if (context.is_dict()) {
    for (const auto& [k, v] : context.dict().items)
      if (k.is_string()) root->set(k.str(), v);
  }
  closure_frames_.push_back(root);
  std::string out;
  out_ = &out;
  root_out_ = &out;
  exec_body(body, root);
  return out;
}

std::string Interpreter::render_to_string(const Body& body, const FramePtr& f) {
  std::string buf;
  std::string* saved = out_;
  out_ = &buf;
  try {
    exec_body(body, f);
  } catch (...) {
    out_ = saved;
    throw;
  }
  out_ = saved;
  return buf;
}

Interpreter::Flow Interpreter::exec_body(const Body& body, const FramePtr& f) {
  for (const auto& s : body) {
    const Flow flow = exec(*s, f);
    if (flow != Flow::Normal) return flow;
  }
  return Flow::Normal;
}

Interpreter::Flow Interpreter::exec(const Stmt& s, const FramePtr& f) {
  step();
  DepthScope depth(*this);
  try {
    switch (s.kind) {
      case StmtKind::Output: {
        for (const auto& part : static_cast<const OutputStmt&>(s).parts) {
          if (!part.expr) {
            write(part.text);
            continue;
          }
          try {
            const Value v = eval(*part.expr, *f);
            if (v.is_string())
              write(v.str());
            else if (!v.is_undefined())
              write(to_str(v));
          } catch (const RenderError& e) {
            if (e.line() > 0) throw;
            throw RenderError(e.py_type(), e.detail(), part.expr->line);
          }
        }
        return Flow::Normal;
      }
      case StmtKind::If: {
        const auto& n = static_cast<const IfStmt&>(s);
        for (const auto& [test, body] : n.branches)
          if (truthy(eval(*test, *f))) return exec_body(body, f);
        return exec_body(n.else_body, f);
      }
      case StmtKind::For: {
        const auto& n = static_cast<const ForStmt&>(s);
        return exec_for(n, f, eval(*n.iter, *f), 1);
      }
      case StmtKind::Set: {
        const auto& n = static_cast<const SetStmt&>(s);
        assign(*n.target, eval(*n.value, *f), *f);
        return Flow::Normal;
      }
      case StmtKind::SetBlock: {
        const auto& n = static_cast<const SetBlockStmt&>(s);
        Value v = Value::string(render_to_string(n.body, std::make_shared<Frame>(f)));
        if (n.filter) v = apply_filter_chain(*n.filter, v, *f);
        assign(*n.target, v, *f);
        return Flow::Normal;
      }
      case StmtKind::Macro: {
        const auto& n = static_cast<const MacroStmt&>(s);
        f->set(n.name, make_macro(n, f));
        return Flow::Normal;
      }
      case StmtKind::CallBlock: {
        const auto& n = static_cast<const CallBlockStmt&>(s);
        const auto& call = static_cast<const CallExpr&>(*n.call);
        Value callee = call.callee->kind == ExprKind::GetAttr
                           ? getattr(eval(*static_cast<const GetAttrExpr&>(*call.callee).object, *f),
                                     static_cast<const GetAttrExpr&>(*call.callee).attr)
                           : eval(*call.callee, *f);
        CallArgs args = eval_args(call.args, *f);
        args.kwargs.emplace_back("caller", make_macro(n, f));
        const Value result = this->call(callee, args);
        write(to_str(result));
        return Flow::Normal;
      }
      case StmtKind::FilterBlock: {
        const auto& n = static_cast<const FilterBlockStmt&>(s);
        const Value body = Value::string(render_to_string(n.body, std::make_shared<Frame>(f)));
        write(to_str(apply_filter_chain(*n.filter, body, *f)));
        return Flow::Normal;
      }
      case StmtKind::With: {
        const auto& n = static_cast<const WithStmt&>(s);
        auto inner = std::make_shared<Frame>(f);
        for (size_t i = 0; i < n.targets.size(); ++i) assign(*n.targets[i], eval(*n.values[i], *f), *inner);
        return exec_body(n.body, inner);
      }
      case StmtKind::Scope:
        write(render_to_string(static_cast<const ScopeStmt&>(s).body, std::make_shared<Frame>(f)));
        return Flow::Normal;
      case StmtKind::Break: return Flow::Break;
      case StmtKind::Continue: return Flow::Continue;
    }
  } catch (const RenderError& e) {
    if (e.line() > 0) throw;
    throw RenderError(e.py_type(), e.detail(), s.line);
  }
  return Flow::Normal;
}

Interpreter::Flow Interpreter::exec_for(const ForStmt& s, const FramePtr& f, const Value& iterable, int depth) {
  if (iterable.is_undefined() && iterable.undefined_data() && iterable.undefined_data()->security)
    raise_undefined(iterable);
  std::vector<Value> all = iterate(iterable);
  auto items = std::make_shared<std::vector<Value>>();
  if (s.filter) {
    for (Value& item : all) {
      count_iteration();
      auto tmp = std::make_shared<Frame>(f);
      assign(*s.target, item, *tmp);
      if (truthy(eval(*s.filter, *tmp))) items->push_back(std::move(item));
    }
  } else {
    *items = std::move(all);
  }
  if (items->empty()) return exec_body(s.else_body, std::make_shared<Frame>(f));
  auto loop = std::make_shared<LoopObject>(*this, items, depth, s.recursive ? &s : nullptr, f);
  track(loop);
  const Value loop_value = Value::object(loop);
  for (size_t i = 0; i < items->size(); ++i) {
    count_iteration();
    loop->index0 = i;
    auto iter_frame = std::make_shared<Frame>(f);
    assign(*s.target, (*items)[i], *iter_frame);
    iter_frame->set("loop", loop_value);
    if (exec_body(s.body, iter_frame) == Flow::Break) break;
  }
  return Flow::Normal;
}

std::string Interpreter::render_for_loop(const ForStmt& s, const FramePtr& f, const Value& iterable, int depth) {
  CallScope call(*this, nullptr);
  std::string buf;
  std::string* saved = out_;
  out_ = &buf;
  try {
    exec_for(s, f, iterable, depth);
  } catch (...) {
    out_ = saved;
    throw;
  }
  out_ = saved;
  return buf;
}

void Interpreter::assign(const Expr& target, const Value& v, Frame& f) {
  switch (target.kind) {
    case ExprKind::Name: f.set(static_cast<const NameExpr&>(target).name, v); return;
    case ExprKind::Tuple: {
      const auto& names = static_cast<const SeqExpr&>(target).items;
      if (v.is_undefined()) raise_undefined(v);
      const std::vector<Value> values = iterate(v);
      if (values.size() < names.size())
        raise("ValueError", "not enough values to unpack (expected " + std::to_string(names.size()) + ", got " +
                                std::to_string(values.size()) + ")");
      if (values.size() > names.size())
        raise("ValueError", "too many values to unpack (expected " + std::to_string(names.size()) + ")");
      for (size_t i = 0; i < names.size(); ++i) assign(*names[i], values[i], f);
      return;
    }
    case ExprKind::NSRef: {
      const auto& ref = static_cast<const NSRefExpr&>(target);
      const Value* ns = f.lookup(ref.name);
      if (!ns || !ns->is_object() || !ns->object().is_namespace())
        raise("TemplateRuntimeError", "cannot assign attribute on non-namespace object");
      set_namespace_attr(ns->object(), ref.attr, v);
      return;
    }
    default: raise("TemplateRuntimeError", "cannot assign to this expression");
  }
}

Value Interpreter::make_macro(const MacroStmt& m, const FramePtr& closure) {
  closure_frames_.push_back(closure);
  const std::string repr = m.kind == StmtKind::CallBlock ? "<Macro 'caller'>" : "<Macro " + text::py_repr(m.name) + ">";
  return Value::function(m.name, [&m, closure](Interpreter& in, CallArgs& args) { return in.call_macro(m, closure, args); },
                         repr);
}

Value Interpreter::call_macro(const MacroStmt& m, const FramePtr& closure, CallArgs& args) {
  step();
  CallScope call(*this, &m.name);
  const size_t n = m.params.size();
  std::vector<std::optional<Value>> bound(n);
  for (size_t i = 0; i < n && i < args.args.size(); ++i) bound[i] = args.args[i];
  auto kwargs = args.kwargs;
  auto pop_kwarg = [&](std::string_view name) -> std::optional<Value> {
    for (auto it = kwargs.begin(); it != kwargs.end(); ++it) {
      if (it->first == name) {
        Value v = std::move(it->second);
        kwargs.erase(it);
        return v;
      }
    }
    return std::nullopt;
  };
  bool explicit_caller = false;
  if (args.args.size() < n) {
    for (size_t i = args.args.size(); i < n; ++i) {
      bound[i] = pop_kwarg(m.params[i]);
      if (m.params[i] == "caller") explicit_caller = true;
    }
  } else {
    for (const auto& p : m.params)
      if (p == "caller") explicit_caller = true;
  }
  std::optional<Value> caller;
  if (m.uses_caller && !explicit_caller) {
    caller = pop_kwarg("caller");
    if (!caller) caller = Value::undefined("No caller defined");
  }
  std::optional<Value> kwargs_value;
  if (m.uses_kwargs) {
    std::vector<std::pair<Value, Value>> items;
    for (auto& [k, v] : kwargs) items.emplace_back(Value::string(k), v);
    kwargs_value = Value::dict(std::move(items));
  } else if (!kwargs.empty()) {
    for (const auto& kv : kwargs)
      if (kv.first == "caller")
        raise("TypeError", "macro " + text::py_repr(m.name) +
                               " was invoked with two values for the special caller argument. This is most likely a bug.");
    raise("TypeError", "macro " + text::py_repr(m.name) + " takes no keyword argument " + text::py_repr(kwargs[0].first));
  }
  std::optional<Value> varargs;
  if (m.uses_varargs) {
    std::vector<Value> extra;
    for (size_t i = n; i < args.args.size(); ++i) extra.push_back(args.args[i]);
    varargs = Value::list(std::move(extra), SeqKind::Tuple);
  } else if (args.args.size() > n) {
    raise("TypeError", "macro " + text::py_repr(m.name) + " takes not more than " + std::to_string(n) + " argument(s)");
  }

  auto frame = std::make_shared<Frame>(closure);
  const size_t first_default = n - m.defaults.size();
  // Parameters are bound in order, so defaults may refer to earlier ones.
  for (size_t i = 0; i < n; ++i) {
    if (bound[i]) {
      frame->set(m.params[i], *bound[i]);
    } else if (i >= first_default) {
      frame->set(m.params[i], eval(*m.defaults[i - first_default], *frame));
    } else {
      frame->set(m.params[i], Value::undefined("parameter " + text::py_repr(m.params[i]) + " was not provided"));
    }
  }
  if (caller) frame->set("caller", *caller);
  if (kwargs_value) frame->set("kwargs", *kwargs_value);
  if (varargs) frame->set("varargs", *varargs);

  return Value::string(render_to_string(m.body, frame));
}

Value Interpreter::apply_filter_chain(const Expr& filter, const Value& input, Frame& f) {
  DepthScope depth(*this);
  const auto& fe = static_cast<const FilterExpr&>(filter);
  const Value in = fe.input ? apply_filter_chain(*fe.input, input, f) : input;
  CallArgs args = eval_args(fe.args, f);
  return apply_filter(*this, fe.name, in, args);
}

// ---- attribute and item access (SandboxedEnvironment.getattr / getitem) ----------

Value Interpreter::getattr(const Value& obj, std::string_view name) {
  switch (obj.type()) {
    case Value::Type::Undefined: raise_undefined(obj);
    case Value::Type::Dict: {
      const MethodKind mk = method_kind(obj, name);
      if (mk == MethodKind::Safe) return bound_method(obj, name);
      if (mk == MethodKind::Unsafe)
        return Value::undefined("access to attribute " + text::py_repr(name) + " of 'dict' object is unsafe.", true);
      if (const Value* v = obj.dict().find(name)) return *v;
      return missing_attr(obj, name);
    }
    case Value::Type::String:
    case Value::Type::List: {
      const MethodKind mk = method_kind(obj, name);
      if (mk == MethodKind::Safe) return bound_method(obj, name);
      if (mk == MethodKind::Unsafe)
        return Value::undefined(
            "access to attribute " + text::py_repr(name) + " of " + text::py_repr(type_name(obj)) + " object is unsafe.",
            true);
      return missing_attr(obj, name);
    }
    case Value::Type::Object: {
      if (auto v = obj.object().get_attr(name)) return *v;
      return missing_attr(obj, name);
    }
    default: return missing_attr(obj, name);
  }
}

Value Interpreter::getitem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) raise_undefined(obj);
  switch (obj.type()) {
    case Value::Type::Dict: {
      if (key.is_list() || key.is_dict()) return missing_element(obj, key);  // unhashable
      if (const Value* v = obj.dict().find(key)) return *v;
      break;
    }
    case Value::Type::String:
      if (key.is_integral()) {
        const std::string& s = obj.str();
        charge_bytes(s.size());  // code points are found by a scan
        const int64_t len = static_cast<int64_t>(text::length(s));
        int64_t i = key.as_int();
        if (i < 0) i += len;
        if (i >= 0 && i < len)
          return Value::string(text::substr_cp(s, static_cast<size_t>(i), static_cast<size_t>(i + 1)), obj.is_safe());
        return missing_element(obj, key);
      }
      break;
    case Value::Type::List:
      if (key.is_integral() && is_seq(obj)) {
        const auto& items = obj.items();
        int64_t i = key.as_int();
        if (i < 0) i += static_cast<int64_t>(items.size());
        if (i >= 0 && i < static_cast<int64_t>(items.size())) return items[static_cast<size_t>(i)];
        return missing_element(obj, key);
      }
      break;
    default: break;
  }
  // jinja2 falls back to attribute lookup for string keys.
  if (key.is_string()) {
    if (obj.is_dict()) {
      const MethodKind mk = method_kind(obj, key.str());
      if (mk == MethodKind::Safe) return bound_method(obj, key.str());
      if (mk == MethodKind::Unsafe)
        return Value::undefined("access to attribute " + text::py_repr(key.str()) + " of 'dict' object is unsafe.", true);
      return missing_attr(obj, key.str());
    }
    return getattr(obj, key.str());
  }
  return missing_element(obj, key);
}

Value Interpreter::eval_slice(const Value& obj, const SliceExpr& s, Frame& f) {
  if (obj.is_undefined()) raise_undefined(obj);
  const Value start = s.start ? eval(*s.start, f) : Value::none();
  const Value stop = s.stop ? eval(*s.stop, f) : Value::none();
  const Value stepv = s.step ? eval(*s.step, f) : Value::none();
  if (obj.is_string()) {
    charge_bytes(obj.str().size());
    const std::u32string u = text::to_u32(obj.str());
    const SliceRange r = adjust_slice(static_cast<int64_t>(u.size()), start, stop, stepv);
    std::u32string out;
    for (int64_t i = 0; i < r.count; ++i) out.push_back(u[r.at(i)]);
    return Value::string(text::to_utf8(out), obj.is_safe());
  }
  if (is_seq(obj)) {
    const auto& items = obj.items();
    const SliceRange r = adjust_slice(static_cast<int64_t>(items.size()), start, stop, stepv);
    std::vector<Value> out;
    out.reserve(static_cast<size_t>(r.count));
    for (int64_t i = 0; i < r.count; ++i) out.push_back(items[r.at(i)]);
    if (obj.seq_kind() != SeqKind::Range) return Value::list(std::move(out), obj.seq_kind());
    // The bounds of the sliced range, for its repr, can leave int64 (Python's grow).
    const ListData& src = obj.list();
    auto data = std::make_shared<ListData>();
    data->kind = SeqKind::Range;
    int64_t start_off = 0, stop_off = 0;
    if (__builtin_mul_overflow(src.range_step, r.step, &data->range_step) ||
        __builtin_mul_overflow(r.start, src.range_step, &start_off) ||
        __builtin_add_overflow(src.range_start, start_off, &data->range_start) ||
        __builtin_mul_overflow(r.stop, src.range_step, &stop_off) ||
        __builtin_add_overflow(src.range_start, stop_off, &data->range_stop))
      raise_int_overflow("range slice");
    data->items = std::move(out);
    return Value::list(std::move(data));
  }
  return Value::undefined(object_type_repr(obj) + " has no element slice(" + repr(start) + ", " + repr(stop) + ", " +
                          repr(stepv) + ")");
}

// ---- calls ------------------------------------------------------------------------

Value Interpreter::call(const Value& callee, CallArgs& args) {
  switch (callee.type()) {
    case Value::Type::Function: return callee.function().fn(*this, args);
    case Value::Type::Undefined: raise_undefined(callee);
    case Value::Type::Object:
      if (auto* loop = dynamic_cast<LoopObject*>(&callee.object())) return loop->call(args);
      break;
    default: break;
  }
  raise("TypeError", "'" + type_name(callee) + "' object is not callable");
}

CallArgs Interpreter::eval_args(const CallArgsExpr& a, Frame& f) {
  CallArgs out;
  out.args.reserve(a.args.size());
  for (const auto& x : a.args) {
    out.args.push_back(eval(*x, f));
    charge_scan(out.args.back());  // the callee may scan it (e.g. 'a'.find(huge))
  }
  if (a.dyn_args) {
    const Value extra = eval(*a.dyn_args, f);
    if (extra.is_undefined()) raise_undefined(extra);
    for (Value& v : iterate(extra)) out.args.push_back(std::move(v));
  }
  for (const auto& [k, x] : a.kwargs) {
    out.kwargs.emplace_back(k, eval(*x, f));
    charge_scan(out.kwargs.back().second);
  }
  if (a.dyn_kwargs) {
    const Value extra = eval(*a.dyn_kwargs, f);
    if (!extra.is_dict()) raise("TypeError", "argument after ** must be a mapping, not " + type_name(extra));
    charge_scan(extra);
    for (const auto& [k, v] : extra.dict().items) {
      if (!k.is_string()) raise("TypeError", "keywords must be strings");
      out.kwargs.emplace_back(k.str(), v);
    }
  }
  return out;
}

Value Interpreter::eval_call(const CallExpr& c, Frame& f) {
  if (c.callee->kind == ExprKind::GetAttr) {
    const auto& ga = static_cast<const GetAttrExpr&>(*c.callee);
    const Value obj = eval(*ga.object, f);
    if (obj.is_undefined()) raise_undefined(obj);
    if ((obj.is_string() || obj.is_list() || obj.is_dict()) && method_kind(obj, ga.attr) == MethodKind::Safe) {
      CallArgs args = eval_args(c.args, f);
      step();
      return call_method(*this, obj, ga.attr, args);
    }
    const Value fn = getattr(obj, ga.attr);
    CallArgs args = eval_args(c.args, f);
    return call(fn, args);
  }
  const Value fn = eval(*c.callee, f);
  CallArgs args = eval_args(c.args, f);
  return call(fn, args);
}

Value Interpreter::eval_compare(const CompareExpr& c, Frame& f) {
  Value left = eval(*c.first, f);
  for (const auto& [op, rhs] : c.ops) {
    Value right = eval(*rhs, f);
    bool ok;
    switch (op) {
      case CmpOp::Eq: ok = equal(left, right); break;
      case CmpOp::Ne: ok = !equal(left, right); break;
      case CmpOp::Lt: ok = compare(left, right, "<") < 0; break;
      case CmpOp::Le: ok = compare(left, right, "<=") <= 0; break;
      case CmpOp::Gt: ok = compare(left, right, ">") > 0; break;
      case CmpOp::Ge: ok = compare(left, right, ">=") >= 0; break;
      case CmpOp::In: ok = contains(right, left); break;
      case CmpOp::NotIn: ok = !contains(right, left); break;
    }
    if (!ok) return Value::boolean(false);
    left = std::move(right);
  }
  return Value::boolean(true);
}

Value Interpreter::eval(const Expr& e, Frame& f) {
  step();
  DepthScope depth(*this);
  switch (e.kind) {
    case ExprKind::Const: return static_cast<const ConstExpr&>(e).value;
    case ExprKind::Name: {
      const auto& name = static_cast<const NameExpr&>(e).name;
      if (const Value* v = f.lookup(name)) return *v;
      return Value::undefined(undefined_name_message(name));
    }
    case ExprKind::List:
    case ExprKind::Tuple: {
      const auto& items = static_cast<const SeqExpr&>(e).items;
      std::vector<Value> out;
      out.reserve(items.size());
      for (const auto& x : items) out.push_back(eval(*x, f));
      return Value::list(std::move(out), e.kind == ExprKind::List ? SeqKind::List : SeqKind::Tuple);
    }
    case ExprKind::Dict: {
      std::vector<std::pair<Value, Value>> items;
      for (const auto& [k, v] : static_cast<const DictExpr&>(e).items) {
        Value key = eval(*k, f);
        if ((key.is_list() && key.seq_kind() != SeqKind::Tuple) || key.is_dict())
          raise("TypeError", "unhashable type: '" + type_name(key) + "'");
        items.emplace_back(std::move(key), eval(*v, f));
      }
      return Value::dict(std::move(items));
    }
    case ExprKind::GetAttr: {
      const auto& g = static_cast<const GetAttrExpr&>(e);
      return getattr(eval(*g.object, f), g.attr);
    }
    case ExprKind::GetItem: {
      const auto& g = static_cast<const GetItemExpr&>(e);
      const Value obj = eval(*g.object, f);
      if (g.key->kind == ExprKind::Slice) return eval_slice(obj, static_cast<const SliceExpr&>(*g.key), f);
      return getitem(obj, eval(*g.key, f));
    }
    case ExprKind::Slice: raise("TypeError", "slice outside of a subscript");
    case ExprKind::Call: return eval_call(static_cast<const CallExpr&>(e), f);
    case ExprKind::Filter: {
      const auto& fe = static_cast<const FilterExpr&>(e);
      const Value input = eval(*fe.input, f);
      CallArgs args = eval_args(fe.args, f);
      return apply_filter(*this, fe.name, input, args);
    }
    case ExprKind::Test: {
      const auto& te = static_cast<const TestExpr&>(e);
      const Value input = eval(*te.input, f);
      CallArgs args = eval_args(te.args, f);
      return Value::boolean(apply_test(*this, te.name, input, args));
    }
    case ExprKind::Neg:
    case ExprKind::Pos: {
      const Value v = eval(*static_cast<const UnaryExpr&>(e).operand, f);
      if (v.is_undefined()) raise_undefined(v);
      const bool neg = e.kind == ExprKind::Neg;
      if (v.is_integral()) {
        if (neg && v.as_int() == std::numeric_limits<int64_t>::min()) raise_int_overflow("unary -");
        return Value::integer(neg ? -v.as_int() : v.as_int());
      }
      if (v.is_float()) return Value::number(neg ? -v.as_float() : v.as_float());
      raise("TypeError", std::string("bad operand type for unary ") + (neg ? "-" : "+") + ": '" + type_name(v) + "'");
    }
    case ExprKind::Not: return Value::boolean(!truthy(eval(*static_cast<const UnaryExpr&>(e).operand, f)));
    case ExprKind::Binary: {
      const auto& b = static_cast<const BinaryExpr&>(e);
      const Value l = eval(*b.left, f);
      const Value r = eval(*b.right, f);
      return binary_op(*this, b.op, l, r);
    }
    case ExprKind::And: {
      const auto& b = static_cast<const LogicalExpr&>(e);
      Value l = eval(*b.left, f);
      return truthy(l) ? eval(*b.right, f) : l;
    }
    case ExprKind::Or: {
      const auto& b = static_cast<const LogicalExpr&>(e);
      Value l = eval(*b.left, f);
      return truthy(l) ? l : eval(*b.right, f);
    }
    case ExprKind::Compare: return eval_compare(static_cast<const CompareExpr&>(e), f);
    case ExprKind::Concat: {
      std::string out;
      for (const auto& x : static_cast<const ConcatExpr&>(e).items) {
        const Value v = eval(*x, f);
        const std::string piece = v.is_string() ? std::string() : to_str(v);
        const std::string& p = v.is_string() ? v.str() : piece;
        check_string(out.size() + p.size());
        out += p;
      }
      return Value::string(std::move(out));
    }
    case ExprKind::Cond: {
      const auto& c = static_cast<const CondExpr&>(e);
      if (truthy(eval(*c.test, f))) return eval(*c.then_expr, f);
      if (c.else_expr) return eval(*c.else_expr, f);
      return Value::undefined("the inline if-expression on line " + std::to_string(c.line) +
                              " evaluated to false and no else section was defined.");
    }
    case ExprKind::NSRef: raise("TypeError", "namespace reference outside of an assignment");
  }
  return Value();
}

// ---- Template -----------------------------------------------------------------------

Template::Template(std::string_view source, const Limits& limits) : body_(parse_template(source, limits)) {}

std::string Template::render(const Value& context, const RenderOptions& options) const {
  Interpreter in(options);
  return in.render(body_, context);
}

}  // namespace pagellm::jinja
