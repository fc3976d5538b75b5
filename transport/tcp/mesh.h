// The TCP mesh every onebit communicator starts from: a bootstrap at the root (bootstrap.h), then
// `sockets` authenticated connections (connection.h) between every pair of ranks. TcpTransport
// runs its data path on them; the verbs transport keeps one per peer as the channel that sets up
// its queue pairs and carries abort messages and the peer's end (transport/ibverbs).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/siphash.h"
#include "transport/tcp/bootstrap.h"
#include "transport/tcp/socket.h"

namespace onebit::transport::tcp {

struct TransportOptions {
  int sockets_per_peer = 2;
  std::chrono::milliseconds timeout{300000};
  std::string ifname;     // ONEBIT_SOCKET_IFNAME; empty: the interface that reaches the root
  Membership membership;  // who may join: identity, ONEBIT_AUTH_KEY, the rendezvous's secret (bootstrap.h)
  // ONEBIT_UNEXPECTED_MB: most bytes one peer's early messages may hold (TcpTransport).
  std::uint64_t max_unexpected_bytes = std::uint64_t{4} << 30;
  std::uint16_t transport = wire::kTransportTcp;  // what the mesh is for; every rank's must match (bootstrap)
  // Rank 0 binds the root and serves it in one go (onebit_comm_init_env), greeting every connection
  // at once: a listener at the address that stays silent is not it (exchange_with_root).
  bool root_served_at_once = false;
};

struct Mesh {
  std::uint64_t job_id = 0;
  SipKey data_key{};                     // the job's data key (bootstrap.h)
  std::vector<std::vector<Fd>> sockets;  // [peer][index], blocking; empty for this rank
};

// Rank `rank` of `size` joins the job whose root listens at `root` (rank 0 serves it) and connects
// to every other rank. Blocks until every connection is up, or throws: ONEBIT_TIMEOUT naming the
// ranks still missing, bind and resolve errors, a root's rejection.
Mesh connect_mesh(int rank, int size, const Address& root, const TransportOptions& options, int sockets);

}  // namespace onebit::transport::tcp
