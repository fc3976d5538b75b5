// A stand-in for NCCL, for the NCCL door and its device path (plugin/preload/nccl_interposer.cc,
// engine/cuda_allreduce.cc) on the CUDA stand-in: the ranks of a communicator are threads of one
// process, NCCL's real header (nccl.h) declares what this library defines, and the door finds
// these pnccl* entry points as it finds NCCL's (dlsym RTLD_NEXT, transport/nccl/nccl_api.cc).
//
// What it models: a group's sends and receives are matched per peer in posting order, as NCCL
// matches them; a group runs at its outermost ncclGroupEnd, its sends first (copied into the
// peer's mailbox), then its receives, each waiting for its message, then its allreduces.
// pncclAllReduce, what the door forwards, is exact: float32 sum or max in rank order. Streams are
// not modelled: everything has finished when a call returns, as on the CUDA stand-in.
//
// What NCCL would hang on, or race on, stops the test naming the ranks (where sending first would
// otherwise hide it):
//   - a receive whose message does not come within 60 s (the patience), or comes with another size;
//   - a send outside a group that no receive takes within the patience (NCCL's send completes only when
//     its receive runs: two ranks that both send, then receive, hang);
//   - a group whose receive overlaps another of its transfers (NCCL runs them concurrently);
//   - messages no receive ever took, when the world ends.
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "transport/nccl/nccl_api.h"

struct ncclComm {
  struct World* world;
  int rank;
};

// (from, to): the messages in flight, in order, and how many were ever taken.
struct Mailbox {
  std::deque<std::vector<unsigned char>> messages;
  std::uint64_t posted = 0;
  std::uint64_t taken = 0;
};

struct World {
  int size;
  std::chrono::seconds patience{60};  // how long a rank waits for its peer before calling it a hang
  std::mutex mutex;
  std::condition_variable changed;  // a message posted or taken
  std::map<std::pair<int, int>, Mailbox> mail;
  std::vector<ncclComm> comms;
};

namespace {

std::size_t element_size(ncclDataType_t type) {
  const std::size_t bytes = onebit::transport::nccl::element_bytes(type);
  if (bytes == 0) {
    std::fprintf(stderr, "nccl stand-in: ncclDataType %d is not modelled\n", static_cast<int>(type));
    std::abort();
  }
  return bytes;
}

struct Transfer {
  bool send;
  void* buffer;
  std::size_t bytes;
  int peer;
  ncclComm_t comm;
};

// A forwarded allreduce (float32 sum or max): this rank's input to every peer, every peer's in
// rank order, reduced in rank order (every rank computes the same bits).
struct AllReduce {
  const float* send;
  float* recv;
  std::size_t count;
  ncclRedOp_t op;
  ncclComm_t comm;
};

thread_local int group_depth = 0;
thread_local std::vector<Transfer> group;
thread_local std::vector<AllReduce> group_all_reduces;  // a group's collectives, run after its transfers

// Copies the message into the peer's mailbox; returns its number there (from 1).
std::uint64_t post(const Transfer& t) {
  World& world = *t.comm->world;
  const auto* bytes = static_cast<const unsigned char*>(t.buffer);
  std::uint64_t number;
  {
    std::lock_guard lock(world.mutex);
    Mailbox& box = world.mail[{t.comm->rank, t.peer}];
    box.messages.emplace_back(bytes, bytes + t.bytes);
    number = ++box.posted;
  }
  world.changed.notify_all();
  return number;
}

// A send outside a group returns once its receive has taken it, as NCCL's completes.
void await_taken(const Transfer& t, std::uint64_t number) {
  World& world = *t.comm->world;
  std::unique_lock lock(world.mutex);
  const Mailbox& box = world.mail[{t.comm->rank, t.peer}];
  if (!world.changed.wait_for(lock, world.patience, [&] { return box.taken >= number; })) {
    std::fprintf(stderr,
                 "nccl stand-in: rank %d's send to rank %d outside a group was not received within %lld s (NCCL's "
                 "send waits for its receive: a hang under NCCL; group the sends with their receives)\n",
                 t.comm->rank, t.peer, static_cast<long long>(world.patience.count()));
    std::abort();
  }
}

void take(const Transfer& t) {
  World& world = *t.comm->world;
  {
    std::unique_lock lock(world.mutex);
    Mailbox& box = world.mail[{t.peer, t.comm->rank}];
    if (!world.changed.wait_for(lock, world.patience, [&] { return !box.messages.empty(); })) {
      std::fprintf(stderr, "nccl stand-in: rank %d waited %lld s for a message from rank %d (a hang under NCCL)\n",
                   t.comm->rank, static_cast<long long>(world.patience.count()), t.peer);
      std::abort();
    }
    if (box.messages.front().size() != t.bytes) {
      std::fprintf(stderr, "nccl stand-in: rank %d receives %zu bytes from rank %d, which sent %zu\n", t.comm->rank,
                   t.bytes, t.peer, box.messages.front().size());
      std::abort();
    }
    if (t.bytes > 0) std::memcpy(t.buffer, box.messages.front().data(), t.bytes);
    box.messages.pop_front();
    ++box.taken;
  }
  world.changed.notify_all();
}

bool overlap(const Transfer& a, const Transfer& b) {
  const auto* a0 = static_cast<const unsigned char*>(a.buffer);
  const auto* b0 = static_cast<const unsigned char*>(b.buffer);
  return a.bytes > 0 && b.bytes > 0 && a0 < b0 + b.bytes && b0 < a0 + a.bytes;
}

// NCCL runs a group's transfers concurrently: a receive must not share bytes with another of them.
void check_apart(const std::vector<Transfer>& transfers) {
  for (std::size_t i = 0; i < transfers.size(); ++i) {
    for (std::size_t j = 0; j < transfers.size(); ++j) {
      const Transfer &a = transfers[i], &b = transfers[j];
      if (i == j || a.send || !overlap(a, b)) continue;
      std::fprintf(stderr,
                   "nccl stand-in: rank %d's group receives %zu bytes from rank %d into memory that its %s %s rank "
                   "%d (%zu bytes) also uses (NCCL runs a group's transfers concurrently: a race)\n",
                   a.comm->rank, a.bytes, a.peer, b.send ? "send" : "receive", b.send ? "to" : "from", b.peer, b.bytes);
      std::abort();
    }
  }
}

void run_group(const std::vector<Transfer>& transfers) {
  check_apart(transfers);
  for (const Transfer& t : transfers) {
    if (t.send) post(t);
  }
  for (const Transfer& t : transfers) {
    if (!t.send) take(t);
  }
}

void all_reduce(const AllReduce& c) {
  const int size = c.comm->world->size, me = c.comm->rank;
  for (int p = 0; p < size; ++p) {
    if (p != me) post(Transfer{true, const_cast<float*>(c.send), c.count * 4, p, c.comm});
  }
  std::vector<std::vector<float>> inputs(size, std::vector<float>(c.count));
  for (int p = 0; p < size; ++p) {
    if (p == me) {
      std::copy(c.send, c.send + c.count, inputs[p].begin());
    } else {
      take(Transfer{false, inputs[p].data(), c.count * 4, p, c.comm});
    }
  }
  for (std::size_t i = 0; i < c.count; ++i) {
    float out = inputs[0][i];
    for (int p = 1; p < size; ++p) out = c.op == ncclMax ? std::max(out, inputs[p][i]) : out + inputs[p][i];
    c.recv[i] = out;
  }
}

ncclResult_t enqueue(Transfer t, std::size_t count, ncclDataType_t type) {
  if (t.comm == nullptr || t.peer < 0 || t.peer >= t.comm->world->size || (t.buffer == nullptr && count > 0)) {
    return ncclInvalidArgument;
  }
  t.bytes = count * element_size(type);
  if (group_depth > 0) {
    group.push_back(t);
  } else if (t.send) {
    await_taken(t, post(t));
  } else {
    take(t);
  }
  return ncclSuccess;
}

}  // namespace

extern "C" {

// The test's own entries: `size` communicators of one new world, rank r in comms[r]; and the end
// of that world (its comms gone with it), once no rank uses it.
ncclResult_t onebit_nccl_stand_in_world(int size, ncclComm_t* comms) {
  if (size < 1 || comms == nullptr) return ncclInvalidArgument;
  auto* world = new World;
  world->size = size;
  world->comms.resize(size);
  for (int r = 0; r < size; ++r) {
    world->comms[r] = ncclComm{world, r};
    comms[r] = &world->comms[r];
  }
  return ncclSuccess;
}

// How long the ranks of any_rank's world wait for a peer (60 s unless a test asks for less).
void onebit_nccl_stand_in_set_patience(ncclComm_t any_rank, int seconds) {
  any_rank->world->patience = std::chrono::seconds(seconds);
}

// A message still in a mailbox is one no receive took: NCCL's sender would never have completed.
void onebit_nccl_stand_in_end_world(ncclComm_t any_rank) {
  World* world = any_rank->world;
  for (const auto& [ranks, box] : world->mail) {
    if (box.messages.empty()) continue;
    std::fprintf(stderr,
                 "nccl stand-in: rank %d sent %zu message(s) to rank %d that no receive took before the world ended "
                 "(a hang under NCCL)\n",
                 ranks.first, box.messages.size(), ranks.second);
    std::abort();
  }
  delete world;
}

ncclResult_t pncclSend(const void* buffer, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t) {
  return enqueue(Transfer{true, const_cast<void*>(buffer), 0, peer, comm}, count, type);
}

ncclResult_t pncclRecv(void* buffer, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t) {
  return enqueue(Transfer{false, buffer, 0, peer, comm}, count, type);
}

ncclResult_t pncclGroupStart() {
  ++group_depth;
  return ncclSuccess;
}

ncclResult_t pncclGroupEnd() {
  if (group_depth == 0) return ncclInvalidUsage;
  if (--group_depth == 0) {
    const std::vector<Transfer> transfers = std::move(group);
    const std::vector<AllReduce> all_reduces = std::move(group_all_reduces);
    group.clear();
    group_all_reduces.clear();
    run_group(transfers);
    for (const AllReduce& c : all_reduces) all_reduce(c);
  }
  return ncclSuccess;
}

ncclResult_t pncclCommCount(const ncclComm_t comm, int* count) {
  if (comm == nullptr || count == nullptr) return ncclInvalidArgument;
  *count = comm->world->size;
  return ncclSuccess;
}

ncclResult_t pncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (comm == nullptr || rank == nullptr) return ncclInvalidArgument;
  *rank = comm->rank;
  return ncclSuccess;
}

// What the door forwards: float32 sums and maxima only (anything else is refused, as a test's
// mistake).
ncclResult_t pncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                            ncclComm_t comm, cudaStream_t) {
  if (comm == nullptr || type != ncclFloat32 || (op != ncclSum && op != ncclMax) ||
      (count > 0 && (send == nullptr || recv == nullptr))) {
    return ncclInvalidArgument;
  }
  const AllReduce c{static_cast<const float*>(send), static_cast<float*>(recv), count, op, comm};
  if (group_depth > 0) {
    group_all_reduces.push_back(c);
  } else {
    all_reduce(c);
  }
  return ncclSuccess;
}

}  // extern "C"
