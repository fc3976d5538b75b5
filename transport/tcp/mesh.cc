#include "transport/tcp/mesh.h"

#include <algorithm>
#include <string>
#include <thread>

#include "common/error.h"
#include "common/log.h"
#include "transport/tcp/bootstrap.h"
#include "transport/tcp/connection.h"
#include "transport/tcp/file_limit.h"
#include "transport/tcp/root_listener.h"

namespace onebit::transport::tcp {
namespace {

// Set-up's own descriptors besides the peers': the data and root listeners, the connection to the
// root, the transport's epoll and eventfd, and a few to spare.
constexpr std::size_t kSetupDescriptors = 8;

// At most what a rank holds at once: its sockets to the others, or — rank 0, while it serves the
// bootstrap — the root's end of every rank's connection and its own end of its own, closed before
// the mesh forms.
std::size_t descriptors_needed(int rank, int size, int sockets) {
  const std::size_t mesh = static_cast<std::size_t>(size - 1) * static_cast<std::size_t>(sockets);
  const std::size_t root = rank == 0 ? static_cast<std::size_t>(size) + 1 : 0;
  return std::max(mesh, root) + kSetupDescriptors;
}

std::string descriptor_user(int rank, int size, int sockets) {
  return "rank " + std::to_string(rank) + " of " + std::to_string(size) + " (" + std::to_string(sockets) +
         " socket(s) to each of " + std::to_string(size - 1) + " peers" +
         (rank == 0 ? "; as the bootstrap root, one connection from each rank" : "") + ")";
}

// The listener rank 0 serves the root on: the one opened for it ahead (root_listener.h), taken by
// connect_mesh before anything can fail (so that no failure leaves it held), else one bound here.
HeldRoot root_listener(const Address& root, HeldRoot held) {
  return held ? std::move(held) : HeldRoot{listen_on(root, 1024), {}};
}

// Room for this rank's descriptors, or an error — which every rank learns at once: rank 0 short of
// them still serves the root, answering every rank with its reason; another rank tells the root,
// which fails the bootstrap for all. (Alone, the first left the others waiting for a root that
// never answered, the others left the root and their peers waiting, until the timeout.)
void make_room_or_refuse(int rank, int size, int sockets, const Address& root, const TransportOptions& options,
                         Deadline deadline, const Credentials& credentials, HeldRoot* held) {
  try {
    make_room_for_descriptors(descriptors_needed(rank, size, sockets), descriptor_user(rank, size, sockets));
  } catch (const Error& error) {
    ONEBIT_LOG(WARN, error.what(), "; telling the other ranks, then failing");
    try {
      if (rank == 0) {
        refuse_at_root(root_listener(root, std::move(*held)), size, deadline, credentials, error.code(), error.what());
      } else {
        Fd unused;
        exchange_with_root(rank, size, sockets, options.transport, root, options.ifname, deadline, credentials, &unused,
                           wire::kShortOfDescriptors, options.root_served_at_once);
      }
    } catch (const Error& telling) {
      // Expected of a rank that is not 0: the root's answer, the bootstrap failed naming this rank.
      ONEBIT_LOG(INFO, "rank ", rank, ": ", telling.what());
    }
    throw;
  }
}

// Rank 0 serves the root, on a thread of its own, on the listener opened for it ahead
// (root_listener.h) or else on one bound here before anyone connects, so a port in use is an
// immediate error on rank 0 rather than a timeout everywhere.
std::thread serve_root_in_background(const Address& root, HeldRoot held, int size, int sockets, std::uint16_t transport,
                                     Deadline deadline, const Credentials& credentials) {
  HeldRoot listener = root_listener(root, std::move(held));
  return std::thread([listener = std::move(listener), size, sockets, transport, deadline, &credentials]() mutable {
    try {
      serve_root(std::move(listener), size, sockets, transport, deadline, credentials);
    } catch (const std::exception& error) {  // nothing may escape a thread (std::terminate); the ranks time out
      ONEBIT_LOG(WARN, "bootstrap root: ", error.what());
    }
  });
}

// Higher ranks connect to lower ones. A connect completes in the listener's backlog, so every rank
// can first connect and then accept without waiting on anyone.
void connect_to_lower_ranks(int rank, int sockets, const BootstrapResult& table, Deadline deadline, Mesh* mesh) {
  for (int peer = 0; peer < rank; ++peer) {
    for (int s = 0; s < sockets; ++s) {
      wire::Hello hello;
      hello.socket_index = static_cast<std::uint16_t>(s);
      hello.sockets_per_peer = static_cast<std::uint16_t>(sockets);
      hello.job_id = mesh->job_id;
      hello.from_rank = static_cast<std::uint32_t>(rank);
      hello.to_rank = static_cast<std::uint32_t>(peer);
      mesh->sockets[peer].push_back(
          connect(table.listeners[peer], hello, mesh->data_key, deadline, "rank " + std::to_string(peer)));
    }
  }
}

// Every socket of every higher rank, each checked to be of this job, for this rank, and new.
void accept_from_higher_ranks(int rank, int size, int sockets, Listener& listener, Deadline deadline,
                              std::chrono::milliseconds timeout, Mesh* mesh) {
  for (int peer = rank + 1; peer < size; ++peer) mesh->sockets[peer].resize(sockets);
  auto check = [&](const wire::Hello& hello, const std::string& who) {
    ONEBIT_CHECK(hello.job_id == mesh->job_id, ONEBIT_REMOTE_ERROR, who, " belongs to another job (job id ", std::hex,
                 hello.job_id, ", this job is ", mesh->job_id, ")");
    ONEBIT_CHECK(hello.to_rank == static_cast<std::uint32_t>(rank), ONEBIT_REMOTE_ERROR, who, " is meant for rank ",
                 hello.to_rank);
    ONEBIT_CHECK(
        hello.from_rank > static_cast<std::uint32_t>(rank) && hello.from_rank < static_cast<std::uint32_t>(size),
        ONEBIT_REMOTE_ERROR, who, " claims to be rank ", hello.from_rank);
    ONEBIT_CHECK(hello.sockets_per_peer == sockets && hello.socket_index < sockets, ONEBIT_REMOTE_ERROR, who,
                 " has socket ", hello.socket_index, " of ", hello.sockets_per_peer, "; expected ", sockets);
    const int peer = static_cast<int>(hello.from_rank);
    ONEBIT_CHECK(!mesh->sockets[peer][hello.socket_index], ONEBIT_REMOTE_ERROR, who, " duplicates socket ",
                 hello.socket_index, " of rank ", peer);
  };
  for (int expected = (size - 1 - rank) * sockets; expected > 0; --expected) {
    auto accepted = listener.accept(deadline, mesh->data_key, check, "rank " + std::to_string(rank));
    if (!accepted) {
      std::string missing;
      for (int peer = rank + 1; peer < size; ++peer) {
        int have = 0;
        for (auto& s : mesh->sockets[peer]) have += s ? 1 : 0;
        if (have < sockets) missing += (missing.empty() ? "" : ", ") + std::to_string(peer);
      }
      ::onebit::fail(ONEBIT_TIMEOUT, "rank ", rank, ": timed out after ", timeout.count(),
                     " ms waiting for connections from rank(s) ", missing);
    }
    mesh->sockets[accepted->hello.from_rank][accepted->hello.socket_index] = std::move(accepted->fd);
  }
}

}  // namespace

Mesh connect_mesh(int rank, int size, const Address& root, const TransportOptions& options, int sockets) {
  HeldRoot held = rank == 0 ? take_root_listener(root) : HeldRoot{};
  ONEBIT_CHECK(sockets >= 1 && sockets <= 64, ONEBIT_INVALID_ARGUMENT, "ONEBIT_SOCKETS_PER_PEER=", sockets,
               " must be in 1..64");
  const Deadline deadline = Clock::now() + options.timeout;
  const Credentials credentials(options.membership);
  make_room_or_refuse(rank, size, sockets, root, options, deadline, credentials, &held);
  std::thread root_service;
  if (rank == 0) {
    root_service =
        serve_root_in_background(root, std::move(held), size, sockets, options.transport, deadline, credentials);
  }
  BootstrapResult table;
  Fd data_listener;
  try {
    table = exchange_with_root(rank, size, sockets, options.transport, root, options.ifname, deadline, credentials,
                               &data_listener, 0, options.root_served_at_once);
  } catch (...) {
    if (root_service.joinable()) root_service.join();
    throw;
  }
  if (root_service.joinable()) root_service.join();
  Mesh mesh;
  mesh.sockets.resize(size);
  mesh.job_id = table.job_id;
  mesh.data_key = table.data_key;
  Listener listener(std::move(data_listener));
  ONEBIT_LOG(INFO, "rank ", rank, "/", size, ": job ", std::hex, mesh.job_id, std::dec, ", data listener ",
             listener.handle().to_string());
  connect_to_lower_ranks(rank, sockets, table, deadline, &mesh);
  accept_from_higher_ranks(rank, size, sockets, listener, deadline, options.timeout, &mesh);
  return mesh;
}

}  // namespace onebit::transport::tcp
