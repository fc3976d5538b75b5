// onebit::CallError — how the header-only C++ shims (onebit_adam.hpp, zero_one_adam.hpp,
// onebit_lamb.hpp) report a failed C API call: its result code and onebit_last_error()'s message.
#ifndef ONEBIT_CALL_ERROR_HPP_
#define ONEBIT_CALL_ERROR_HPP_

#include <stdexcept>
#include <string>

#include "onebit/onebit.h"

namespace onebit {

class CallError : public std::runtime_error {
 public:
  CallError(onebit_result_t code, const std::string& message) : std::runtime_error(message), code_(code) {}
  onebit_result_t code() const { return code_; }

 private:
  onebit_result_t code_;
};

// Throws CallError with the calling thread's last error unless `result` is ONEBIT_SUCCESS.
inline void check_call(onebit_result_t result) {
  if (result != ONEBIT_SUCCESS) throw CallError(result, onebit_last_error());
}

}  // namespace onebit

#endif  // ONEBIT_CALL_ERROR_HPP_
