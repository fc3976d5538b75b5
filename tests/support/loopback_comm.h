// A communicator of `world` ranks on 127.0.0.1:port, for a rank process of run_ranks: exits the
// process (code 90, the reason on stderr) if it cannot join, since nothing after that can run.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#include "onebit/onebit.h"

namespace onebit::testing {

inline onebit_comm_t join_loopback(int rank, int world, int port) {
  onebit_comm_t comm = nullptr;
  const std::string root = "127.0.0.1:" + std::to_string(port);
  if (onebit_comm_init(&comm, rank, world, root.c_str()) != ONEBIT_SUCCESS) {
    std::fprintf(stderr, "rank %d: init failed: %s\n", rank, onebit_last_error());
    std::_Exit(90);
  }
  return comm;
}

}  // namespace onebit::testing
