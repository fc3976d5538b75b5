// What the tests on the NCCL stand-in (nccl_stand_in.cc) share: a world of communicators whose
// ranks are threads of the test, a body run on one thread per rank, and arrays compared by bits.
#pragma once

#include <gtest/gtest.h>
#include <nccl.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

// The stand-in's own entries: `size` communicators of a new world (rank r's in comms[r]), the end
// of that world, once no rank uses it, and how long its ranks wait for a peer.
extern "C" ncclResult_t onebit_nccl_stand_in_world(int size, ncclComm_t* comms);
extern "C" void onebit_nccl_stand_in_end_world(ncclComm_t any_rank);
extern "C" void onebit_nccl_stand_in_set_patience(ncclComm_t any_rank, int seconds);

namespace onebit::testing {

// The communicators of one stand-in world, rank r's in comms[r].
struct StandInWorld {
  std::vector<ncclComm_t> comms;
  explicit StandInWorld(int size) : comms(size) {
    EXPECT_EQ(onebit_nccl_stand_in_world(size, comms.data()), ncclSuccess);
  }
  ~StandInWorld() { onebit_nccl_stand_in_end_world(comms[0]); }
  StandInWorld(const StandInWorld&) = delete;
  StandInWorld& operator=(const StandInWorld&) = delete;
  ncclComm_t operator[](int rank) const { return comms[rank]; }
};

// body(rank) on one thread per rank; returns when all have.
inline void each_rank(int world, const std::function<void(int)>& body) {
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r) ranks.emplace_back(body, r);
  for (std::thread& rank : ranks) rank.join();
}

// The floats' bits: equal bits, not equal values (+0 and -0 differ; a NaN equals its own bits).
inline std::vector<std::uint32_t> bits_of(const std::vector<float>& values) {
  std::vector<std::uint32_t> out(values.size());
  std::memcpy(out.data(), values.data(), values.size() * sizeof(float));
  return out;
}

}  // namespace onebit::testing
