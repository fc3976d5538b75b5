// The NCCL stand-in's own rules (nccl_stand_in.cc): what the door's tests on the CPU lean on. A
// group's transfers match per peer in posting order and a send outside a group meets its receive;
// what NCCL would hang or race on stops the test naming the ranks — a send outside a group that
// no receive takes, a group whose receive overlaps another of its transfers, a message of another
// size, a message no receive ever took.
#include <gtest/gtest.h>
#include <nccl.h>

#include <functional>
#include <vector>

#include "ranks_as_threads.h"

namespace onebit::testing {
namespace {

TEST(NcclStandIn, AGroupsTransfersMatchPerPeerInPostingOrder) {
  StandInWorld world(2);
  std::vector<std::vector<float>> got(2);
  each_rank(2, [&](int rank) {
    const int peer = 1 - rank;
    const std::vector<float> first(3, 1.0f + rank), second(5, 10.0f + rank);
    std::vector<float> in_first(3), in_second(5), in_third(2);
    ASSERT_EQ(pncclGroupStart(), ncclSuccess);
    ASSERT_EQ(pncclRecv(in_first.data(), 3, ncclFloat32, peer, world[rank], nullptr), ncclSuccess);
    ASSERT_EQ(pncclSend(first.data(), 3, ncclFloat32, peer, world[rank], nullptr), ncclSuccess);
    ASSERT_EQ(pncclSend(second.data(), 5, ncclFloat32, peer, world[rank], nullptr), ncclSuccess);
    ASSERT_EQ(pncclRecv(in_second.data(), 5, ncclFloat32, peer, world[rank], nullptr), ncclSuccess);
    ASSERT_EQ(pncclGroupEnd(), ncclSuccess);
    // Outside a group: rank 0 sends, rank 1 receives; the send returns once received.
    const std::vector<float> third = {7.0f, 8.0f};
    if (rank == 0) {
      ASSERT_EQ(pncclSend(third.data(), 2, ncclFloat32, 1, world[0], nullptr), ncclSuccess);
    } else {
      ASSERT_EQ(pncclRecv(in_third.data(), 2, ncclFloat32, 0, world[1], nullptr), ncclSuccess);
    }
    got[rank] = in_first;
    got[rank].insert(got[rank].end(), in_second.begin(), in_second.end());
    got[rank].insert(got[rank].end(), in_third.begin(), in_third.end());
  });
  EXPECT_EQ(got[0], (std::vector<float>{2, 2, 2, 11, 11, 11, 11, 11, 0, 0}));
  EXPECT_EQ(got[1], (std::vector<float>{1, 1, 1, 10, 10, 10, 10, 10, 7, 8}));
}

// Both ranks send, then receive, outside a group: under NCCL each send waits for a receive queued
// behind the other's send.
TEST(NcclStandInDeathTest, SendsOutsideAGroupThatNoReceiveTakesAreAHang) {
  EXPECT_DEATH(
      {
        StandInWorld world(2);
        onebit_nccl_stand_in_set_patience(world[0], 1);
        each_rank(2, [&](int rank) {
          std::vector<float> out(4, 1.0f), in(4);
          pncclSend(out.data(), 4, ncclFloat32, 1 - rank, world[rank], nullptr);
          pncclRecv(in.data(), 4, ncclFloat32, 1 - rank, world[rank], nullptr);
        });
      },
      "send to rank [01] outside a group was not received within 1 s");
}

// Two ranks of a new world, each posting its transfers (over its 8 floats) in one group.
void one_group_each(const std::function<void(int rank, ncclComm_t comm, float* data)>& post) {
  StandInWorld world(2);
  each_rank(2, [&](int rank) {
    std::vector<float> data(8, 1.0f);
    pncclGroupStart();
    post(rank, world[rank], data.data());
    pncclGroupEnd();
  });
}

// An in-place exchange in one group: the receive may land before the send has read the buffer.
TEST(NcclStandInDeathTest, AGroupReceivingIntoMemoryItAlsoSendsIsARace) {
  EXPECT_DEATH(
      one_group_each([](int rank, ncclComm_t comm, float* data) {
        pncclSend(data, 8, ncclFloat32, 1 - rank, comm, nullptr);
        pncclRecv(data + 4, 4, ncclFloat32, 1 - rank, comm, nullptr);
      }),
      "group receives 16 bytes from rank [01] into memory that its send to rank [01] \\(32 bytes\\) also uses");
}

TEST(NcclStandInDeathTest, AMessageOfAnotherSizeStopsNamingBoth) {
  EXPECT_DEATH(one_group_each([](int rank, ncclComm_t comm, float* data) {
                 if (rank == 0) pncclSend(data, 4, ncclFloat32, 1, comm, nullptr);
                 if (rank == 1) pncclRecv(data, 8, ncclFloat32, 0, comm, nullptr);
               }),
               "rank 1 receives 32 bytes from rank 0, which sent 16");
}

TEST(NcclStandInDeathTest, AMessageNoReceiveTookIsAHangWhenTheWorldEnds) {
  EXPECT_DEATH(one_group_each([](int rank, ncclComm_t comm, float* data) {
                 if (rank == 0) pncclSend(data, 4, ncclFloat32, 1, comm, nullptr);
               }),
               "rank 0 sent 1 message\\(s\\) to rank 1 that no receive took before the world ended");
}

}  // namespace
}  // namespace onebit::testing
