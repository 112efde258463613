// The chat template's interpreter: walks the syntax tree over Values and writes the output. Bounded in call depth,
// loop iterations (a budget for the whole render, which also bounds time) and output size (every string it builds).
// Errors are Error "chat template line L, column C: ..." (for raise_exception(msg), the message is msg).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chat/ast.h"
#include "chat/value.h"
#include "mambacpp/chat.h"
#include "mambacpp/error.h"

namespace mambacpp::chat {

// An error already placed at a line and column (passed through unchanged by outer nodes).
class TemplateError : public Error {
 public:
  using Error::Error;
};

class Interpreter {
 public:
  Interpreter(std::string_view source, const RenderLimits& limits) : source_(source), limits_(limits) {}

  // Renders `body` with `globals` (a dict: the caller's variables over the built-in globals).
  std::string render(const Body& body, const Value& globals);

  // For the built-ins: calls a callable value; throws for one that is not.
  Value call(const Value& f, CallArgs& args);
  // Counts one unit of work (a loop iteration, an element a filter visits) against the render's budget.
  void count_work(uint64_t units = 1);
  // Refuses a string or list about to grow past the output limit.
  void check_size(size_t size) const;
  const RenderLimits& limits() const { return limits_; }
  // A namespace() object, cleared when the render ends: `{% set ns.self = ns %}` makes a reference cycle.
  void track(std::shared_ptr<DictData> ns) { namespaces_.push_back(std::move(ns)); }
  ~Interpreter();

 private:
  struct Scope {
    std::shared_ptr<Scope> parent;
    std::vector<std::pair<std::string, Value>> vars;
    const Value* find(const std::string& name) const;
    void set(const std::string& name, Value v);
  };
  enum class Flow { Normal, Break, Continue };

  Flow exec_body(const Body& body, std::string& out);
  Flow exec(const Stmt& s, std::string& out);
  void exec_for(const Stmt& s, std::string& out);
  void exec_set(const Stmt& s);
  // Binds s.targets in `scope` to v, unpacking v when there are several targets (`what` names them in errors).
  void bind_targets(const Stmt& s, Scope& scope, const Value& v, const char* what);
  Value make_macro(const Stmt& s, std::shared_ptr<Scope> closure, Value caller);
  Value eval(const Expr& e);
  Value eval_inner(const Expr& e);
  Value eval_binary(const Expr& e, const Value& a, const Value& b);
  bool compare(const std::string& op, const Value& a, const Value& b);
  CallArgs eval_args(const Expr& e, size_t first);
  Value lookup(const std::string& name) const;
  void append(std::string& out, const std::string& text) const;
  [[noreturn]] void error_at(size_t offset, const std::string& what) const;

  std::string_view source_;
  RenderLimits limits_;
  std::shared_ptr<Scope> scope_;
  // Macros hold their defining scope, which holds them: these cycles are broken when the render ends.
  std::vector<std::shared_ptr<Scope>> closures_;
  std::vector<std::shared_ptr<DictData>> namespaces_;
  uint64_t work_ = 0;
  int depth_ = 0;
};

}  // namespace mambacpp::chat
