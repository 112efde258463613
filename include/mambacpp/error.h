// Errors that cross the library boundary. Every user-facing failure (bad file, bad shape, bad option) is thrown
// as mambacpp::Error with a message that names what was wrong, what was expected and what was found.
// Library code never exits the process: the CLI, a server or bindings decide what to do with the error.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace mambacpp {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

namespace detail {
inline void append_all(std::ostringstream&) {}
template <class T, class... Rest>
void append_all(std::ostringstream& os, const T& first, const Rest&... rest) {
  os << first;
  append_all(os, rest...);
}
}  // namespace detail

// Builds a message from pieces and throws it: fail("tensor ", name, ": expected ", a, ", found ", b).
template <class... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  std::ostringstream os;
  detail::append_all(os, parts...);
  throw Error(os.str());
}

}  // namespace mambacpp

// Internal invariant (a bug in mambacpp if it fires), reported with file and line; still an exception so that a
// server survives it.
#define MAMBACPP_ASSERT(cond)                                                                  \
  do {                                                                                         \
    if (!(cond)) ::mambacpp::fail("internal error: ", #cond, " (", __FILE__, ":", __LINE__, ")"); \
  } while (0)
