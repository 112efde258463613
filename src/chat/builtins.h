// The chat template's built-ins: filters, tests, attribute and item access (with Python's str/dict methods bound
// as callables), and the globals (range, namespace, dict, raise_exception, strftime_now). Each throws Error with a
// plain message; the interpreter adds the line and column.
#pragma once

#include <string>

#include "chat/value.h"

namespace mambacpp::chat {

class Interpreter;

// Whether a filter or test of that name exists (checked when the template runs it).
Value apply_filter(Interpreter& in, const std::string& name, const Value& value, CallArgs& args);
bool apply_test(Interpreter& in, const std::string& name, const Value& value, CallArgs& args);

// x.name (attribute first, then item) and x[key] (item first, then attribute), as Jinja's sandbox resolves them;
// a missing one is undefined; on an undefined receiver it is an error.
Value get_attribute(Interpreter& in, const Value& object, const std::string& name);
Value get_item(Interpreter& in, const Value& object, const Value& key);
Value get_slice(Interpreter& in, const Value& object, const Value& start, const Value& stop, const Value& step);

// The iteration Jinja does for `for`: a list's items, a dict's keys, a string's characters, nothing for undefined.
std::vector<Value> iterate(Interpreter& in, const Value& v);
// len(): code points of a string, items of a list or dict.
int64_t length(const Value& v);

// The globals every template sees, into `globals`.
void add_builtin_globals(DictData& globals);

// A string's code points as UTF-8 pieces (an invalid byte is one piece).
std::vector<std::string> code_points(const std::string& s);

}  // namespace mambacpp::chat
