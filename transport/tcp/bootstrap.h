// Bootstrap: every rank tells the root (a listener that rank 0 serves at ONEBIT_ROOT) where its data
// listener is; the root answers each rank, once all have arrived, with a fresh job id and every
// rank's listener. Connections that fail the exchange (garbage, wrong protocol) are logged, closed
// and ignored; ranks that disagree (world size, duplicate rank) fail the whole bootstrap with an
// error naming them, sent to every rank that arrived.
#pragma once

#include <cstdint>
#include <vector>

#include "transport/tcp/socket.h"

namespace onebit::tcp {

struct BootstrapResult {
  std::uint64_t job_id = 0;
  std::vector<Address> listeners;  // by rank
};

// Rank 0's root service. Runs until every rank has its answer, or the deadline passes; errors go to
// the ranks (and are rethrown to the caller of join_root via the reply rank 0 itself receives).
void serve_root(Fd listener, int size, int sockets_per_peer, Deadline deadline);

// Every rank's side. `data_listener` is bound here: to ifname's address, or to the local address of
// the connection that reaches the root.
BootstrapResult exchange_with_root(int rank, int size, int sockets_per_peer, const Address& root,
                                   const std::string& ifname, Deadline deadline, Fd* data_listener);

}  // namespace onebit::tcp
