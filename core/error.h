// Error checking: library code throws stabletrain::Error with the operation, the
// offending value and what was expected; it never exits. Binaries catch and print one line.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace st {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

namespace detail {
inline void build(std::ostringstream&) {}
template <class A, class... R>
void build(std::ostringstream& os, const A& a, const R&... r) {
  os << a;
  build(os, r...);
}
}  // namespace detail

template <class... A>
[[noreturn]] void fail(const A&... a) {
  std::ostringstream os;
  detail::build(os, a...);
  throw Error(os.str());
}

// A write to a file that failed (a full disk, an I/O error): callers that know what is on
// disk (the trainer) add how to go on.
class WriteError : public Error {
 public:
  using Error::Error;
};

template <class... A>
[[noreturn]] void fail_write(const A&... a) {
  std::ostringstream os;
  detail::build(os, a...);
  throw WriteError(os.str());
}

}  // namespace st

// ST_CHECK(cond, "what", value, "expected ...") throws st::Error naming the failed condition.
#define ST_CHECK(cond, ...)                                                     \
  do {                                                                          \
    if (!(cond)) ::st::fail(__func__, ": ", __VA_ARGS__, " [check: " #cond "]"); \
  } while (0)
