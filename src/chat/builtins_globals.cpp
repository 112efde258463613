// The globals every template sees: range, namespace, dict, and transformers' raise_exception and strftime_now.
#include <cmath>
#include <ctime>

#include "chat/builtins_internal.h"
#include "chat/interpreter.h"

namespace mambacpp::chat {

using namespace builtins;

void add_builtin_globals(DictData& globals) {
  globals.set("range", Value::function("range", [](Interpreter& in, CallArgs& a) {
    if (!a.keyword.empty()) fail("range() takes no keyword arguments");
    if (a.positional.empty() || a.positional.size() > 3) fail("range expected 1 to 3 arguments, got ", a.positional.size());
    int64_t start = 0, stop, step = 1;
    if (a.positional.size() == 1) {
      stop = need_int(&a.positional[0], "range");
    } else {
      start = need_int(&a.positional[0], "range");
      stop = need_int(&a.positional[1], "range");
      if (a.positional.size() == 3) step = need_int(&a.positional[2], "range");
    }
    if (step == 0) fail("range() arg 3 must not be zero");
    const long double count_ld = step > 0 ? (static_cast<long double>(stop) - start) / step
                                          : (static_cast<long double>(start) - stop) / -static_cast<long double>(step);
    const uint64_t count = count_ld <= 0 ? 0 : static_cast<uint64_t>(std::ceil(count_ld));
    if (count > in.limits().max_work) fail("range of ", count, " items is more than the render's limit of work");
    in.count_work(count);
    std::vector<Value> out;
    out.reserve(count);
    for (uint64_t k = 0; k < count; ++k) out.push_back(Value::integer(start + static_cast<int64_t>(k) * step));
    return Value::new_list(std::move(out));
  }));
  globals.set("namespace", Value::function("namespace", [](Interpreter& in, CallArgs& a) {
    Value ns = Value::new_dict();
    ns.dict->namespace_object = true;
    in.track(ns.dict);
    for (const Value& p : a.positional) {
      if (!p.is_dict()) fail("namespace() takes mappings as positional arguments, found ", p.type_name());
      for (const auto& [k, v] : p.dict->items) ns.dict->set(k, v);
    }
    for (const auto& [k, v] : a.keyword) ns.dict->set(k, v);
    return ns;
  }));
  globals.set("dict", Value::function("dict", [](Interpreter&, CallArgs& a) {
    Value d = Value::new_dict();
    for (const Value& p : a.positional) {
      if (!p.is_dict()) fail("dict() takes a mapping, found ", p.type_name());
      for (const auto& [k, v] : p.dict->items) d.dict->set(k, v);
    }
    for (const auto& [k, v] : a.keyword) d.dict->set(k, v);
    return d;
  }));
  // transformers' globals.
  globals.set("raise_exception", Value::function("raise_exception", [](Interpreter&, CallArgs& a) -> Value {
    fail(a.positional.empty() ? std::string("raise_exception() was called") : to_str(a.positional[0]));
  }));
  globals.set("strftime_now", Value::function("strftime_now", [](Interpreter&, CallArgs& a) {
    const std::string& fmt = need_string(arg(a, 0, "format"), "strftime_now");
    if (fmt.size() > 256) fail("strftime_now: format longer than 256 characters");
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    std::string buf(1024, '\0');
    const size_t n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &local);
    buf.resize(n);
    return Value::string(buf);
  }));
}

}  // namespace mambacpp::chat
