// A rank process's result for error tests: the code and the message of its call, written into
// memory shared with the parent (RankRecords) so the parent can check what each rank saw.
#pragma once

#include <cstdio>

#include "onebit/onebit.h"
#include "tests/support/multiprocess.h"

namespace onebit::testing {

struct Record {
  int code;
  char message[1024];
  void set(onebit_result_t result) {
    code = result;
    std::snprintf(message, sizeof(message), "%s", onebit_last_error());
  }
};

// One Record per rank, in memory the rank processes share with the test (made before they fork).
class RankRecords {
 public:
  explicit RankRecords(int ranks) : shared_(static_cast<std::size_t>(ranks) * sizeof(Record)) {}
  Record& operator[](int rank) { return shared_.as<Record>()[rank]; }
  Record* operator->() { return shared_.as<Record>(); }  // rank 0's, for one-rank checks

 private:
  SharedMemory shared_;
};

}  // namespace onebit::testing
