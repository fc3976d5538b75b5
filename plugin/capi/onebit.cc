// The C ABI of include/onebit/onebit.h.
#include "onebit/onebit.h"

#include "kernels/cpu/cpu_kernels.h"
#include "plugin/capi/abi_guard.h"

namespace onebit {

std::string& thread_last_error() {
  thread_local std::string message;
  return message;
}

}  // namespace onebit

extern "C" {

int onebit_version(void) { return ONEBIT_VERSION_CODE; }

const char* onebit_result_string(onebit_result_t result) {
  switch (result) {
    case ONEBIT_SUCCESS: return "ONEBIT_SUCCESS";
    case ONEBIT_INVALID_ARGUMENT: return "ONEBIT_INVALID_ARGUMENT";
    case ONEBIT_SYSTEM_ERROR: return "ONEBIT_SYSTEM_ERROR";
    case ONEBIT_TIMEOUT: return "ONEBIT_TIMEOUT";
    case ONEBIT_REMOTE_ERROR: return "ONEBIT_REMOTE_ERROR";
    case ONEBIT_MISMATCH: return "ONEBIT_MISMATCH";
    case ONEBIT_NUMERIC_ERROR: return "ONEBIT_NUMERIC_ERROR";
    case ONEBIT_INTERNAL_ERROR: return "ONEBIT_INTERNAL_ERROR";
  }
  return "ONEBIT_UNKNOWN_RESULT";
}

const char* onebit_last_error(void) { return onebit::thread_last_error().c_str(); }

onebit_result_t onebit_cpu_kernels(const char** name) {
  return onebit::abi_guard("onebit_cpu_kernels", [&] {
    ONEBIT_CHECK(name != nullptr, ONEBIT_INVALID_ARGUMENT, "name is NULL");
    *name = onebit::kernels::cpu_kernels().name;
  });
}

}  // extern "C"
