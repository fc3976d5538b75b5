// Hierarchical compression (docs/design/engine.md) through the shipped C ABI: ranks are real processes on
// loopback, told their ranks per host by ONEBIT_LOCAL_SIZE as a user would, the host reduce through
// the shared-memory segment (ONEBIT_SHM=1) or the transport (0). Results are compared bit for bit
// with the fp32 oracle of the hierarchical rule and within rounding with its float64 reference.
//
// Its own binary: the ONEBIT_* parameters are read once per process, and each child here sets them
// before its first onebit call; the parent never makes a communicator.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "onebit/onebit.h"
#include "tests/support/float32_oracle.h"
#include "tests/support/float64_reference.h"
#include "tests/support/loopback_comm.h"
#include "tests/support/multiprocess.h"
#include "tests/support/rank_record.h"

namespace onebit::testing {
namespace {

std::vector<float> input(int rank, int call, std::size_t n) {
  std::mt19937 rng(static_cast<unsigned>(rank * 7919 + call * 104729 + n));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = normal(rng) + 0.1f * static_cast<float>(rank);
  return x;
}

// In a child, before its first onebit call: the environment a launcher would give it.
void environment(int local_size, int shm, int timeout_ms = 60000) {
  ::unsetenv("LOCAL_WORLD_SIZE");
  ::unsetenv("LOCAL_RANK");
  ::unsetenv("WORLD_SIZE");
  ::unsetenv("ONEBIT_WORLD_SIZE");
  ::setenv("ONEBIT_LOCAL_SIZE", std::to_string(local_size).c_str(), 1);
  ::setenv("ONEBIT_SHM", std::to_string(shm).c_str(), 1);
  ::setenv("ONEBIT_TIMEOUT_MS", std::to_string(timeout_ms).c_str(), 1);
}

struct Topology {
  int hosts, local_size, shm;  // shm -1: ONEBIT_SHM=0 on odd ranks only
  int world() const { return hosts * local_size; }
  std::string name() const {
    return std::to_string(hosts) + " hosts x " + std::to_string(local_size) +
           (shm > 0    ? " (shm)"
            : shm == 0 ? " (transport)"
                       : " (ONEBIT_SHM differs)");
  }
};

// `calls` calls of each size on every rank; every rank's output must equal the fp32 oracle's bits
// and the float64 reference within rounding.
void run_against_oracle(const Topology& t, const std::vector<std::size_t>& sizes, int calls, onebit_op_t op) {
  const int world = t.world();
  std::size_t total = 0;
  for (std::size_t n : sizes) total += n;
  SharedMemory outputs(total * calls * world * sizeof(float));
  const int port = free_port();
  auto outcomes = run_ranks(world, [&](int rank) {
    environment(t.local_size, t.shm >= 0 ? t.shm : 1 - rank % 2);
    onebit_comm_t comm = join_loopback(rank, world, port);
    int local_size = 0;
    RANK_FAILS_IF(onebit_comm_local_size(comm, &local_size) != ONEBIT_SUCCESS || local_size != t.local_size, 3);
    std::size_t offset = 0;
    for (std::size_t n : sizes) {
      std::vector<float> buffer(n);
      const std::string name = "h" + std::to_string(n);
      RANK_FAILS_IF(onebit_tag(name.c_str(), buffer.data(), n, ONEBIT_FLOAT32) != ONEBIT_SUCCESS, 2);
      for (int call = 0; call < calls; ++call) {
        const std::vector<float> x = input(rank, call, n);
        std::copy(x.begin(), x.end(), buffer.begin());
        if (onebit_allreduce(comm, buffer.data(), n, ONEBIT_FLOAT32, op) != ONEBIT_SUCCESS) {
          return RANK_FAILED(4,
                             "n=" + std::to_string(n) + " call " + std::to_string(call) + ": " + onebit_last_error());
        }
        std::copy(buffer.begin(), buffer.end(), outputs.as<float>() + ((offset * calls + call * n) * world + rank * n));
      }
      RANK_FAILS_IF(onebit_untag(buffer.data()) != ONEBIT_SUCCESS, 5);
      offset += n;
    }
    onebit_comm_destroy(comm);
    return 0;
  });
  for (int r = 0; r < world; ++r) ASSERT_EQ(outcomes[r].exit_code, 0) << "rank " << r << ", " << t.name();

  std::size_t offset = 0;
  for (std::size_t n : sizes) {
    HierarchicalOracle oracle(t.hosts, t.local_size, n);
    HierarchicalReference reference(t.hosts, t.local_size, n);
    for (int call = 0; call < calls; ++call) {
      std::vector<std::vector<float>> x;
      for (int r = 0; r < world; ++r) x.push_back(input(r, call, n));
      const std::vector<float> exact = oracle.step(x, op == ONEBIT_SUM);
      const std::vector<double> ref = reference.step(x, op == ONEBIT_SUM);
      const float* rank0 = outputs.as<float>() + (offset * calls + call * n) * world;
      for (int r = 0; r < world; ++r) {
        ASSERT_EQ(0, n == 0 ? 0 : std::memcmp(rank0 + r * n, exact.data(), n * 4))
            << t.name() << " n=" << n << " call " << call << ": rank " << r << " differs from the fp32 oracle";
      }
      std::size_t ambiguous = 0, off = 0;
      for (std::size_t i = 0; i < n; ++i) {
        if (reference.ambiguous()[i]) {
          ++ambiguous;
        } else if (std::fabs(exact[i] - ref[i]) > 1e-4 * std::fabs(ref[i]) + 1e-30) {
          ++off;
        }
      }
      EXPECT_EQ(off, 0u) << t.name() << " n=" << n << " call " << call << ": elements off the float64 reference";
      EXPECT_LE(ambiguous, n / 10000 + 1) << t.name() << " n=" << n;
    }
    offset += n;
  }
}

TEST(Hierarchical, TwoHostsOfTwoMatchTheOracleThroughSharedMemory) {
  run_against_oracle({2, 2, 1}, {1, 13, 1000, 70001}, 3, ONEBIT_AVG);
}

TEST(Hierarchical, TwoHostsOfTwoMatchTheOracleThroughTheTransport) {
  run_against_oracle({2, 2, 0}, {1, 13, 1000, 70001}, 3, ONEBIT_AVG);
}

// The shape of a cluster: 8 hosts of 8 ranks. Every host had its local rank 0 crash (SIGSEGV) or
// corrupt its heap at a tag's first call from 4 ranks per host on: the segment's set-up numbered
// its requests on past the end of their array (tests above ran 2 and 3 ranks per host).
TEST(Hierarchical, EightHostsOfEightMatchTheOracleThroughSharedMemory) {
  run_against_oracle({8, 8, 1}, {1, 13, 1000, 20001}, 2, ONEBIT_AVG);
}

TEST(Hierarchical, EightHostsOfEightMatchTheOracleThroughTheTransport) {
  run_against_oracle({8, 8, 0}, {1, 13, 1000, 20001}, 2, ONEBIT_AVG);
}

TEST(Hierarchical, RanksThatRefuseSharedMemoryMakeTheirHostUseTheTransport) {
  // Local rank 1 of each host has ONEBIT_SHM=0: its host's set-up says no-go, with a warning.
  run_against_oracle({2, 2, -1}, {13, 70001}, 2, ONEBIT_AVG);
}

TEST(Hierarchical, ThreeHostsOfTwoAndTwoHostsOfThreeSum) {
  run_against_oracle({3, 2, 1}, {7, 4099, 30000}, 2, ONEBIT_SUM);
  run_against_oracle({2, 3, 1}, {7, 4099, 30000}, 2, ONEBIT_AVG);
}

TEST(Hierarchical, BuffersOfSeveralBlocksPerRailChunk) {
  // 2^22 + 1000 elements: each rail chunk holds two blocks of 2^20, the last shard's fewer, so the
  // ranks of a host walk orders of different lengths.
  run_against_oracle({2, 2, 1}, {(std::size_t{1} << 22) + 1000}, 2, ONEBIT_AVG);
}

TEST(Hierarchical, NaNOnOneHostFailsEveryRankAndChangesNothing) {
  const Topology t{2, 2, 1};
  const int world = t.world();
  const std::size_t n = 5000;
  SharedMemory shared(world * (sizeof(Record) + n * sizeof(float)));
  auto* records = shared.as<Record>();
  auto* outputs = reinterpret_cast<float*>(records + world);
  const int port = free_port();
  auto outcomes = run_ranks(world, [&](int rank) {
    environment(t.local_size, t.shm);
    onebit_comm_t comm = join_loopback(rank, world, port);
    std::vector<float> buffer = input(rank, 0, n);
    onebit_tag("p", buffer.data(), n, ONEBIT_FLOAT32);
    RANK_FAILS_IF(onebit_allreduce(comm, buffer.data(), n, ONEBIT_FLOAT32, ONEBIT_AVG) != ONEBIT_SUCCESS, 2);
    // Call 1 with a NaN in rank 3's shard 0 (host 1): only rail 0 sees it; every rank must fail.
    std::vector<float> poisoned = input(rank, 1, n);
    if (rank == 3) poisoned[17] = NAN;
    std::copy(poisoned.begin(), poisoned.end(), buffer.begin());
    records[rank].set(onebit_allreduce(comm, buffer.data(), n, ONEBIT_FLOAT32, ONEBIT_AVG));
    RANK_FAILS_IF(std::memcmp(buffer.data(), poisoned.data(), n * 4) != 0, 3);  // untouched
    const auto clean = input(rank, 1, n);
    std::copy(clean.begin(), clean.end(), buffer.begin());
    RANK_FAILS_IF(onebit_allreduce(comm, buffer.data(), n, ONEBIT_FLOAT32, ONEBIT_AVG) != ONEBIT_SUCCESS, 4);
    std::memcpy(outputs + rank * n, buffer.data(), n * 4);
    onebit_comm_destroy(comm);
    return 0;
  });
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(outcomes[r].exit_code, 0) << "rank " << r;
    EXPECT_EQ(records[r].code, ONEBIT_NUMERIC_ERROR) << records[r].message;
    EXPECT_NE(std::string(records[r].message).find("the input of host 1 (ranks 2..3) holds NaN or Inf in shard 0"),
              std::string::npos)
        << records[r].message;
  }
  // The clean call equals the oracle's second call: the failed one changed no error state.
  HierarchicalOracle oracle(t.hosts, t.local_size, n);
  std::vector<float> exact;
  for (int call = 0; call < 2; ++call) {
    std::vector<std::vector<float>> x;
    for (int r = 0; r < world; ++r) x.push_back(input(r, call, n));
    exact = oracle.step(x, false);
  }
  for (int r = 0; r < world; ++r) EXPECT_EQ(0, std::memcmp(outputs + r * n, exact.data(), n * 4)) << "rank " << r;
}

TEST(Hierarchical, CheckpointResumesBitForBit) {
  const Topology t{2, 2, 1};
  const int world = t.world();
  const std::size_t n = 3001;
  SharedMemory shared(world * n * sizeof(float));
  auto* outputs = shared.as<float>();
  const int port = free_port();
  const int port2 = free_port();
  auto outcomes = run_ranks(world, [&](int rank) {
    environment(t.local_size, t.shm);
    std::vector<float> buffer(n), worker(n), server;
    std::size_t worker_count = 0, server_count = 0;
    {  // two calls, then a checkpoint
      onebit_comm_t comm = join_loopback(rank, world, port);
      onebit_tag("c", buffer.data(), n, ONEBIT_FLOAT32);
      for (int call = 0; call < 2; ++call) {
        const auto x = input(rank, call, n);
        std::copy(x.begin(), x.end(), buffer.begin());
        RANK_FAILS_IF(onebit_allreduce(comm, buffer.data(), n, ONEBIT_FLOAT32, ONEBIT_AVG) != ONEBIT_SUCCESS, 2);
      }
      RANK_FAILS_IF(onebit_tag_state_size("c", &worker_count, &server_count) != ONEBIT_SUCCESS || worker_count != n, 3);
      server.resize(server_count);
      RANK_FAILS_IF(onebit_tag_state_save("c", worker.data(), server.data()) != ONEBIT_SUCCESS, 4);
      onebit_untag(buffer.data());
      onebit_comm_destroy(comm);
    }
    // A new job: restore, then the third call.
    onebit_comm_t comm = join_loopback(rank, world, port2);
    onebit_tag("c", buffer.data(), n, ONEBIT_FLOAT32);
    RANK_FAILS_IF(
        onebit_tag_state_load("c", worker.data(), worker_count, server.data(), server_count) != ONEBIT_SUCCESS, 5);
    const auto x = input(rank, 2, n);
    std::copy(x.begin(), x.end(), buffer.begin());
    RANK_FAILS_IF(onebit_allreduce(comm, buffer.data(), n, ONEBIT_FLOAT32, ONEBIT_AVG) != ONEBIT_SUCCESS, 6);
    std::memcpy(outputs + rank * n, buffer.data(), n * 4);
    onebit_comm_destroy(comm);
    return 0;
  });
  for (int r = 0; r < world; ++r) ASSERT_EQ(outcomes[r].exit_code, 0) << "rank " << r;
  HierarchicalOracle oracle(t.hosts, t.local_size, n);
  std::vector<float> exact;
  for (int call = 0; call < 3; ++call) {
    std::vector<std::vector<float>> x;
    for (int r = 0; r < world; ++r) x.push_back(input(r, call, n));
    exact = oracle.step(x, false);
  }
  for (int r = 0; r < world; ++r) EXPECT_EQ(0, std::memcmp(outputs + r * n, exact.data(), n * 4)) << "rank " << r;
}

TEST(Hierarchical, RanksDisagreeingOnRanksPerHostFailNamingBoth) {
  const int world = 6;
  RankRecords records(world);
  const int port = free_port();
  auto outcomes = run_ranks(world, [&](int rank) {
    environment(rank < 3 ? 2 : 3, 1);
    onebit_comm_t comm = join_loopback(rank, world, port);
    std::vector<float> buffer(1000, 1.0f);
    onebit_tag("t", buffer.data(), buffer.size(), ONEBIT_FLOAT32);
    records[rank].set(onebit_allreduce(comm, buffer.data(), buffer.size(), ONEBIT_FLOAT32, ONEBIT_AVG));
    for (float v : buffer) {
      RANK_FAILS_IF(v != 1.0f, 2);
    }
    onebit_comm_destroy(comm);
    return 0;
  });
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(outcomes[r].exit_code, 0) << "rank " << r;
    EXPECT_EQ(records[r].code, ONEBIT_MISMATCH) << records[r].message;
    EXPECT_NE(std::string(records[r].message)
                  .find(r < 3 ? "this rank runs 2 rank(s) per host but rank 3 runs 3"
                              : "this rank runs 3 rank(s) per host but rank 0 runs 2"),
              std::string::npos)
        << records[r].message;
  }
}

TEST(Hierarchical, LocalSizeThatDoesNotDivideTheWorldIsRefused) {
  const int world = 4;
  SharedMemory shared(world * sizeof(Record) + world * sizeof(int));
  auto* records = shared.as<Record>();
  auto* inherited = reinterpret_cast<int*>(records + world);
  const int port = free_port();
  const int port2 = free_port();
  auto outcomes = run_ranks(world, [&](int rank) {
    environment(3, 1);
    onebit_comm_t comm = nullptr;
    const std::string root = "127.0.0.1:" + std::to_string(port);
    records[rank].set(onebit_comm_init(&comm, rank, world, root.c_str()));
    RANK_FAILS_IF(comm != nullptr, 2);
    return 0;
  });
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(outcomes[r].exit_code, 0) << "rank " << r;
    EXPECT_EQ(records[r].code, ONEBIT_INVALID_ARGUMENT) << records[r].message;
    EXPECT_NE(std::string(records[r].message).find("ONEBIT_LOCAL_SIZE=3 does not divide the 4 ranks"),
              std::string::npos)
        << records[r].message;
  }
  // torchrun's LOCAL_WORLD_SIZE, which the user did not set for onebit: a warning and flat.
  outcomes = run_ranks(world, [&](int rank) {
    environment(2, 1);
    ::unsetenv("ONEBIT_LOCAL_SIZE");
    ::setenv("LOCAL_WORLD_SIZE", "3", 1);
    onebit_comm_t comm = join_loopback(rank, world, port2);
    RANK_FAILS_IF(onebit_comm_local_size(comm, &inherited[rank]) != ONEBIT_SUCCESS, 2);
    onebit_comm_destroy(comm);
    return 0;
  });
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(outcomes[r].exit_code, 0) << "rank " << r;
    EXPECT_EQ(inherited[r], 1) << "rank " << r;
  }
}

TEST(Hierarchical, KilledLocalPeerFailsTheSurvivorsNamingIt) {
  const Topology t{2, 2, 1};
  const int world = t.world();
  SharedMemory shared(world * sizeof(Record) + sizeof(std::atomic<int>));
  auto* records = shared.as<Record>();
  auto* finished_first = new (records + world) std::atomic<int>(0);
  const int port = free_port();
  auto outcomes = run_ranks(
      world,
      [&](int rank) {
        environment(t.local_size, t.shm, 30000);
        onebit_comm_t comm = join_loopback(rank, world, port);
        std::vector<float> buffer(200000, 1.0f);
        onebit_tag("k", buffer.data(), buffer.size(), ONEBIT_FLOAT32);
        // One good call sets up the host's segment; then rank 1 dies as a crashed trainer does.
        RANK_FAILS_IF(
            onebit_allreduce(comm, buffer.data(), buffer.size(), ONEBIT_FLOAT32, ONEBIT_AVG) != ONEBIT_SUCCESS, 2);
        // Once every rank has finished that call (else a slower one fails it instead of the next).
        finished_first->fetch_add(1);
        if (rank == 1) {
          while (finished_first->load() < world) std::this_thread::yield();
          ::raise(SIGKILL);
        }
        records[rank].set(onebit_allreduce(comm, buffer.data(), buffer.size(), ONEBIT_FLOAT32, ONEBIT_AVG));
        return onebit_comm_destroy(comm) == ONEBIT_SUCCESS ? 0 : 5;
      },
      std::chrono::seconds(25));  // under the 30 s timeout: a survivor must not wait it out
  EXPECT_EQ(outcomes[1].exit_code, 128 + SIGKILL);
  for (int r : {0, 2, 3}) {
    ASSERT_EQ(outcomes[r].exit_code, 0) << "rank " << r;
    EXPECT_EQ(records[r].code, ONEBIT_REMOTE_ERROR) << "rank " << r << ": " << records[r].message;
  }
  // Rank 1's host peer waits on shared memory for it: it must name it.
  EXPECT_NE(std::string(records[0].message).find("rank 1"), std::string::npos) << records[0].message;
}

}  // namespace
}  // namespace onebit::testing
