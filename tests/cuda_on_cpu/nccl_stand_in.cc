// A stand-in for NCCL, for the NCCL door and its device path (plugin/preload/nccl_interposer.cc,
// engine/cuda_allreduce.cc) on the CUDA stand-in: the ranks of a communicator are threads of one
// process, NCCL's real header (nccl.h) declares what this library defines, and the door finds
// these pnccl* entry points as it finds NCCL's (dlsym RTLD_NEXT, transport/nccl/nccl_api.cc).
//
// What it models: a group's sends and receives are matched per peer in posting order, as NCCL
// matches them; a group runs at its outermost ncclGroupEnd, its sends first (they never block:
// copied into the peer's mailbox), then its receives, each waiting for its message, then its
// allreduces. pncclAllReduce, what the door forwards, is exact: float32 sum or max in rank order.
// A receive whose message does not come within 60 s, or comes with another size, stops the test
// naming both ranks (NCCL would hang, or fail). Streams are not modelled: everything has finished
// when a call returns, as on the CUDA stand-in.
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
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

struct World {
  int size;
  std::mutex mutex;
  std::condition_variable posted;
  std::map<std::pair<int, int>, std::deque<std::vector<unsigned char>>> mail;  // (from, to): messages in order
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

void post(const Transfer& t) {
  World& world = *t.comm->world;
  const auto* bytes = static_cast<const unsigned char*>(t.buffer);
  {
    std::lock_guard lock(world.mutex);
    world.mail[{t.comm->rank, t.peer}].emplace_back(bytes, bytes + t.bytes);
  }
  world.posted.notify_all();
}

void take(const Transfer& t) {
  World& world = *t.comm->world;
  std::unique_lock lock(world.mutex);
  auto& box = world.mail[{t.peer, t.comm->rank}];
  if (!world.posted.wait_for(lock, std::chrono::seconds(60), [&] { return !box.empty(); })) {
    std::fprintf(stderr, "nccl stand-in: rank %d waited 60 s for a message from rank %d (a hang under NCCL)\n",
                 t.comm->rank, t.peer);
    std::abort();
  }
  if (box.front().size() != t.bytes) {
    std::fprintf(stderr, "nccl stand-in: rank %d receives %zu bytes from rank %d, which sent %zu\n", t.comm->rank,
                 t.bytes, t.peer, box.front().size());
    std::abort();
  }
  if (t.bytes > 0) std::memcpy(t.buffer, box.front().data(), t.bytes);
  box.pop_front();
}

void run(const std::vector<Transfer>& transfers) {
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
  } else {
    run({t});
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

void onebit_nccl_stand_in_end_world(ncclComm_t any_rank) { delete any_rank->world; }

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
    run(transfers);
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
