// A rank process's result for error tests: the code and the message of its call, written into
// SharedMemory so the parent can check what each rank saw.
#pragma once

#include <cstdio>

#include "onebit/onebit.h"

namespace onebit::testing {

struct Record {
  int code;
  char message[1024];
  void set(onebit_result_t result) {
    code = result;
    std::snprintf(message, sizeof(message), "%s", onebit_last_error());
  }
};

}  // namespace onebit::testing
