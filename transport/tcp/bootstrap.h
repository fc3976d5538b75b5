// Bootstrap: every rank tells the root (a listener that rank 0 serves at ONEBIT_ROOT) where its data
// listener is; the root answers each rank, once all have arrived, with a fresh job id and every
// rank's listener. Connections that fail the exchange (garbage, wrong protocol) are logged, closed
// and ignored; ranks that disagree (world size, duplicate rank) fail the whole bootstrap with an
// error naming them, sent to every rank that arrived.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "common/siphash.h"
#include "transport/tcp/socket.h"

namespace onebit::tcp {

// Access (docs/reliability.md): the root draws a job id and a 128-bit job secret. Data connections
// prove membership with a MAC under the job's data key: the secret itself, or — when the launcher
// gives every rank ONEBIT_AUTH_KEY — a key derived from it and the secret, so that someone who
// overhears the bootstrap still cannot forge one. With ONEBIT_AUTH_KEY the bootstrap exchange is
// itself MAC'd both ways; hellos that fail the check are logged and ignored.
struct BootstrapResult {
  std::uint64_t job_id = 0;
  std::vector<Address> listeners;  // by rank
  SipKey data_key{};
};

// Rank 0's root service. Runs until every rank has its answer, or the deadline passes; errors go to
// the ranks (and reach rank 0's own caller through the reply rank 0 itself receives, as every rank's do).
void serve_root(Fd listener, int size, int sockets_per_peer, Deadline deadline, const std::optional<SipKey>& auth);

// Every rank's side. `data_listener` is bound here: to ifname's address, or to the local address of
// the connection that reaches the root.
BootstrapResult exchange_with_root(int rank, int size, int sockets_per_peer, const Address& root,
                                   const std::string& ifname, Deadline deadline, const std::optional<SipKey>& auth,
                                   Fd* data_listener);

// Reads the root's reply (after the rank's hello) from `fd`: the table, or the root's error
// (thrown with its code). Checks the reply's MAC when `auth` is set. Split out for the fuzzer.
BootstrapResult read_root_reply(int fd, int size, Deadline deadline, const std::optional<SipKey>& auth);

// The data key of a job (see above).
SipKey data_key_of(std::uint64_t job_id, const std::uint64_t secret[2], const std::optional<SipKey>& auth);

}  // namespace onebit::tcp
