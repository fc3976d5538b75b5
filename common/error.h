// The error style inside onebit: C++ code throws onebit::Error (a result code plus a message that
// names the rank, tag and sizes involved); the C ABI catches it at the boundary and turns it into
// an onebit_result_t and the thread's last-error message. Nothing throws across extern "C".
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "onebit/onebit_types.h"

namespace onebit {

class Error : public std::runtime_error {
 public:
  Error(onebit_result_t code, std::string message) : std::runtime_error(std::move(message)), code_(code) {}
  onebit_result_t code() const noexcept { return code_; }

 private:
  onebit_result_t code_;
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}
}  // namespace detail

// Throws Error(code, concatenation of the message parts).
template <typename... Args>
[[noreturn]] void fail(onebit_result_t code, Args&&... parts) {
  throw Error(code, detail::concat(std::forward<Args>(parts)...));
}

}  // namespace onebit

// Throws Error(code, message parts) unless `cond` holds. The message names what the check is
// about (rank, tag, sizes), as every message in onebit does.
#define ONEBIT_CHECK(cond, code, ...)                 \
  do {                                                \
    if (!(cond)) ::onebit::fail((code), __VA_ARGS__); \
  } while (0)
