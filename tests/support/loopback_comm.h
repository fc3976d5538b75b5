// A communicator of `world` ranks on 127.0.0.1:port, for a rank process of run_ranks: exits the
// process (code 90, the reason recorded for run_ranks) if it cannot join, since nothing after that can run.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#include "onebit/onebit.h"
#include "tests/support/multiprocess.h"

namespace onebit::testing {

// timeout_ms > 0: the communicator's timeout (ONEBIT_TIMEOUT_MS's default otherwise).
inline onebit_comm_t join_loopback(int rank, int world, int port, int timeout_ms = 0) {
  onebit_comm_t comm = nullptr;
  const std::string root = "127.0.0.1:" + std::to_string(port);
  const onebit_config_t config{timeout_ms, 0, nullptr, nullptr, nullptr, nullptr};
  const onebit_result_t joined = timeout_ms > 0 ? onebit_comm_init_config(&comm, rank, world, root.c_str(), &config)
                                                : onebit_comm_init(&comm, rank, world, root.c_str());
  if (joined != ONEBIT_SUCCESS) {
    std::_Exit(rank_failed(90, std::string("joining the loopback communicator failed: ") + onebit_last_error()));
  }
  return comm;
}

}  // namespace onebit::testing
