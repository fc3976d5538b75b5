// The compressed allreduce through the shipped C ABI (libonebit.so), ranks as real processes on
// loopback, against the float64 reference: consecutive calls, sizes, SUM, untag, threads, error feedback.

#include <sched.h>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cpu/half.h"
#include "onebit/onebit.h"
#include "tests/engine/engine_jobs.h"
#include "tests/support/float32_oracle.h"
#include "tests/support/float64_reference.h"
#include "tests/support/multiprocess.h"
#include "tests/support/rank_record.h"

namespace onebit::testing {
namespace {

// ---- compressed allreduce against the reference ----

void run_against_reference(int world, const std::vector<std::size_t>& sizes, int calls, onebit_op_t op) {
  std::size_t total = 0;
  for (std::size_t n : sizes) total += n;
  SharedMemory outputs(total * calls * world * sizeof(float));
  const int port = free_port();
  auto outcomes = run_ranks(world, [&](int rank) {
    onebit_comm_t comm = join_loopback(rank, world, port);
    std::size_t offset = 0;
    for (std::size_t n : sizes) {
      std::vector<float> buffer(n);
      const std::string name = "m" + std::to_string(n);
      RANK_FAILS_IF(onebit_tag(name.c_str(), buffer.data(), n, ONEBIT_FLOAT32) != ONEBIT_SUCCESS, 2);
      for (int call = 0; call < calls; ++call) {
        const std::vector<float> x = input(rank, call, n, static_cast<unsigned>(n));
        std::copy(x.begin(), x.end(), buffer.begin());
        if (onebit_allreduce(comm, buffer.data(), n, ONEBIT_FLOAT32, op) != ONEBIT_SUCCESS) {
          return RANK_FAILED(4,
                             "n=" + std::to_string(n) + " call " + std::to_string(call) + ": " + onebit_last_error());
        }
        std::copy(buffer.begin(), buffer.end(), outputs.as<float>() + ((offset * calls + call * n) * world + rank * n));
      }
      RANK_FAILS_IF(onebit_untag(buffer.data()) != ONEBIT_SUCCESS, 5);  // before the memory is freed and reused
      offset += n;
    }
    onebit_comm_destroy(comm);
    return 0;
  });
  for (int r = 0; r < world; ++r) ASSERT_EQ(outcomes[r].exit_code, 0) << "rank " << r << " of " << world;

  std::size_t offset = 0;
  for (std::size_t n : sizes) {
    Reference reference(world, n);
    Float32Oracle oracle(world, n);
    std::size_t ambiguous = 0;
    for (int call = 0; call < calls; ++call) {
      std::vector<std::vector<float>> x;
      for (int r = 0; r < world; ++r) x.push_back(input(r, call, n, static_cast<unsigned>(n)));
      const std::vector<double> ref = reference.step(x, op == ONEBIT_SUM);
      // Bit for bit against the fp32 computation of the same algorithm (tests/support/float32_oracle.h).
      const std::vector<float> exact = oracle.step(x, op == ONEBIT_SUM);
      ASSERT_EQ(
          0, n == 0 ? 0 : std::memcmp(outputs.as<float>() + (offset * calls + call * n) * world, exact.data(), n * 4))
          << "W=" << world << " n=" << n << " call " << call << " differs from the fp32 oracle";
      const float* rank0 = outputs.as<float>() + (offset * calls + call * n) * world;
      for (int r = 0; r < world; ++r) {
        const float* out = rank0 + r * n;
        ASSERT_EQ(0, std::memcmp(out, rank0, n * 4))
            << "rank " << r << " disagrees with rank 0, W=" << world << " n=" << n;
        ambiguous = std::max(ambiguous, expect_matches(out, ref, reference.ambiguous(),
                                                       "W=" + std::to_string(world) + " n=" + std::to_string(n) +
                                                           " call " + std::to_string(call)));
      }
    }
    // The worst rank and call, not the last one.
    EXPECT_LE(ambiguous, n / 10000 + 1) << "too many sign-ambiguous elements, W=" << world << " n=" << n;
    offset += n;
  }
}

TEST(CompressedAllreduce, MatchesFloat64ReferenceOverConsecutiveCalls) {
  for (int world : {1, 2, 3, 4, 5, 8}) {
    const std::size_t edge = 8 * static_cast<std::size_t>(world) - 1;  // n < 8W: empty chunks
    run_against_reference(world, {0, 1, 7, edge, 1009, 65537, 100003}, 3, ONEBIT_AVG);
  }
}

// A job of 64 ranks, as a 64-node cluster runs it: 2016 connections formed at once, most chunks of
// a small tensor empty (n < 8W), rank 0's root met by 63 arrivals.
TEST(CompressedAllreduce, SixtyFourRanksMatchTheReference) {
  run_against_reference(64, {1, 63, 511, 4099, 20001}, 2, ONEBIT_AVG);
}

TEST(CompressedAllreduce, MatchesReferenceAt64MiElements) {
  run_against_reference(2, {std::size_t{64} << 20}, 3, ONEBIT_AVG);
}

TEST(CompressedAllreduce, SumIsWorldTimesAverage) {
  const int world = 3;
  const std::size_t n = 1001;
  SharedMemory outputs(2 * world * n * sizeof(float));
  const int port = free_port();
  auto outcomes = run_ranks(world, [&](int rank) {
    onebit_comm_t comm = join_loopback(rank, world, port);
    std::vector<float> avg = input(rank, 0, n, 5), sum = avg;
    onebit_tag("avg", avg.data(), n, ONEBIT_FLOAT32);
    onebit_tag("sum", sum.data(), n, ONEBIT_FLOAT32);
    RANK_FAILS_IF(onebit_allreduce(comm, avg.data(), n, ONEBIT_FLOAT32, ONEBIT_AVG) != ONEBIT_SUCCESS, 2);
    RANK_FAILS_IF(onebit_allreduce(comm, sum.data(), n, ONEBIT_FLOAT32, ONEBIT_SUM) != ONEBIT_SUCCESS, 3);
    std::memcpy(outputs.as<float>() + rank * 2 * n, avg.data(), n * 4);
    std::memcpy(outputs.as<float>() + rank * 2 * n + n, sum.data(), n * 4);
    onebit_comm_destroy(comm);
    return 0;
  });
  for (int r = 0; r < world; ++r) ASSERT_EQ(outcomes[r].exit_code, 0) << "rank " << r;
  for (int r = 0; r < world; ++r) {
    const float* avg = outputs.as<float>() + r * 2 * n;
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(avg[n + i], 3.0f * avg[i]) << "rank " << r << " i=" << i;
  }
}

// A tagged call too small to pay for its messages (docs/usage/optimizers.md, "How large a tagged
// call pays": below 32768 elements a peer) is said at WARN once per tag name, by rank 0 alone; a
// call large enough is not said at all.
TEST(CompressedAllreduce, ACallTooSmallToPayIsSaidOnceByRankZero) {
  const int world = 3;  // 2 peers: 65536 elements pay
  const std::size_t small = 1000, large = 65536;
  const int port = free_port();
  auto outcomes = run_ranks(world, [&](int rank) {
    onebit_comm_t comm = join_loopback(rank, world, port);
    std::vector<float> a = input(rank, 0, small, 5), b = input(rank, 1, large, 5);
    onebit_tag("small", a.data(), small, ONEBIT_FLOAT32);
    onebit_tag("large", b.data(), large, ONEBIT_FLOAT32);
    ::testing::internal::CaptureStderr();
    for (int call = 0; call < 3; ++call) {
      RANK_FAILS_IF(onebit_allreduce(comm, a.data(), small, ONEBIT_FLOAT32, ONEBIT_AVG) != ONEBIT_SUCCESS, 2);
      RANK_FAILS_IF(onebit_allreduce(comm, b.data(), large, ONEBIT_FLOAT32, ONEBIT_AVG) != ONEBIT_SUCCESS, 3);
    }
    // Untagged and tagged again (as 0/1 Adam does at its freeze): the same name, not said again.
    onebit_untag(a.data());
    onebit_tag("small", a.data(), small, ONEBIT_FLOAT32);
    RANK_FAILS_IF(onebit_allreduce(comm, a.data(), small, ONEBIT_FLOAT32, ONEBIT_AVG) != ONEBIT_SUCCESS, 9);
    const std::string log = ::testing::internal::GetCapturedStderr();
    const std::string said = "rank 0/3: tag 'small': a call of 1000 elements with 2 peers is mostly per-message cost";
    const std::size_t first = log.find(said);
    if (rank == 0) {
      if (first == std::string::npos) return RANK_FAILED(4, "rank 0 did not say the small call: " + log);
      RANK_FAILS_IF(log.find(said, first + 1) != std::string::npos, 5);  // once
      RANK_FAILS_IF(
          log.find("below 65536 elements they cost about as much as the rest of the call") == std::string::npos, 6);
    } else {
      RANK_FAILS_IF(log.find("tag 'small'") != std::string::npos, 7);  // rank 0 alone
    }
    RANK_FAILS_IF(log.find("tag 'large'") != std::string::npos, 8);
    onebit_comm_destroy(comm);
    return 0;
  });
  for (int r = 0; r < world; ++r) ASSERT_EQ(outcomes[r].exit_code, 0) << "rank " << r;
}

TEST(CompressedAllreduce, UntagResetsTheErrorState) {
  const int world = 2;
  const std::size_t n = 4099;
  SharedMemory outputs(2 * world * n * sizeof(float));
  const int port = free_port();
  auto outcomes = run_ranks(world, [&](int rank) {
    onebit_comm_t comm = join_loopback(rank, world, port);
    std::vector<float> buffer = input(rank, 0, n, 9);
    onebit_tag("w", buffer.data(), n, ONEBIT_FLOAT32);
    RANK_FAILS_IF(onebit_allreduce(comm, buffer.data(), n, ONEBIT_FLOAT32, ONEBIT_AVG) != ONEBIT_SUCCESS, 2);
    std::memcpy(outputs.as<float>() + rank * 2 * n, buffer.data(), n * 4);
    for (int call = 1; call < 3; ++call) {  // build up error state
      const auto x = input(rank, call, n, 9);
      std::copy(x.begin(), x.end(), buffer.begin());
      RANK_FAILS_IF(onebit_allreduce(comm, buffer.data(), n, ONEBIT_FLOAT32, ONEBIT_AVG) != ONEBIT_SUCCESS, 3);
    }
    RANK_FAILS_IF(onebit_untag(buffer.data()) != ONEBIT_SUCCESS, 4);
    RANK_FAILS_IF(onebit_tag("w", buffer.data(), n, ONEBIT_FLOAT32) != ONEBIT_SUCCESS, 5);
    const std::vector<float> first = input(rank, 0, n, 9);
    std::copy(first.begin(), first.end(), buffer.begin());
    RANK_FAILS_IF(onebit_allreduce(comm, buffer.data(), n, ONEBIT_FLOAT32, ONEBIT_AVG) != ONEBIT_SUCCESS, 6);
    std::memcpy(outputs.as<float>() + rank * 2 * n + n, buffer.data(), n * 4);
    onebit_comm_destroy(comm);
    return 0;
  });
  for (int r = 0; r < world; ++r) ASSERT_EQ(outcomes[r].exit_code, 0) << "rank " << r;
  for (int r = 0; r < world; ++r) {
    const float* run = outputs.as<float>() + r * 2 * n;
    EXPECT_EQ(0, std::memcmp(run, run + n, n * 4)) << "rank " << r << ": after untag the first call's result differs";
  }
}

TEST(CompressedAllreduce, ConcurrentTagsFromThreads) {
  const int world = 3, calls = 3;
  const std::size_t n = 50021;
  SharedMemory outputs(2 * calls * world * n * sizeof(float));
  const int port = free_port();
  auto outcomes = run_ranks(world, [&](int rank) {
    onebit_comm_t comm = join_loopback(rank, world, port);
    std::atomic<int> failures{0};  // both threads count into it
    auto worker = [&](int t) {
      std::vector<float> buffer(n);
      const std::string name = "thread" + std::to_string(t);
      onebit_tag(name.c_str(), buffer.data(), n, ONEBIT_FLOAT32);
      for (int call = 0; call < calls; ++call) {
        const std::vector<float> x = input(rank, call, n, 100 + t);
        std::copy(x.begin(), x.end(), buffer.begin());
        if (onebit_allreduce(comm, buffer.data(), n, ONEBIT_FLOAT32, ONEBIT_AVG) != ONEBIT_SUCCESS) ++failures;
        std::memcpy(outputs.as<float>() + ((t * calls + call) * world + rank) * n, buffer.data(), n * 4);
      }
    };
    std::thread a(worker, 0), b(worker, 1);
    a.join();
    b.join();
    onebit_comm_destroy(comm);
    return failures.load();
  });
  for (int r = 0; r < world; ++r) ASSERT_EQ(outcomes[r].exit_code, 0) << "rank " << r;
  for (int t = 0; t < 2; ++t) {
    Reference reference(world, n);
    for (int call = 0; call < calls; ++call) {
      std::vector<std::vector<float>> x;
      for (int r = 0; r < world; ++r) x.push_back(input(r, call, n, 100 + t));
      const auto ref = reference.step(x, false);
      for (int r = 0; r < world; ++r) {
        expect_matches(outputs.as<float>() + ((t * calls + call) * world + r) * n, ref, reference.ambiguous(),
                       "thread " + std::to_string(t) + " call " + std::to_string(call));
      }
    }
  }
}

TEST(CompressedAllreduce, ErrorFeedbackTracksTheTrueAverage) {
  // Σ_t output_t − Σ_t mean_t stays bounded (it is the error states), so its size relative to
  // Σ_t mean_t shrinks as calls accumulate. Inputs share a common signal so the sums grow.
  const int world = 4, calls = 60;
  const std::size_t n = 4096;
  SharedMemory outputs(calls * n * sizeof(float));
  const int port = free_port();
  auto signal_input = [&](int rank, int call) {
    std::vector<float> x = input(rank, call, n, 77);
    for (std::size_t i = 0; i < n; ++i) x[i] = 0.2f * x[i] + std::sin(0.001f * static_cast<float>(i));
    return x;
  };
  auto outcomes = run_ranks(world, [&](int rank) {
    onebit_comm_t comm = join_loopback(rank, world, port);
    std::vector<float> buffer(n);
    onebit_tag("g", buffer.data(), n, ONEBIT_FLOAT32);
    for (int call = 0; call < calls; ++call) {
      const auto x = signal_input(rank, call);
      std::copy(x.begin(), x.end(), buffer.begin());
      RANK_FAILS_IF(onebit_allreduce(comm, buffer.data(), n, ONEBIT_FLOAT32, ONEBIT_AVG) != ONEBIT_SUCCESS, 2);
      if (rank == 0) std::memcpy(outputs.as<float>() + call * n, buffer.data(), n * 4);
    }
    onebit_comm_destroy(comm);
    return 0;
  });
  for (int r = 0; r < world; ++r) ASSERT_EQ(outcomes[r].exit_code, 0) << "rank " << r;
  std::vector<double> sum_out(n, 0), sum_true(n, 0);
  std::vector<double> relative;
  for (int call = 0; call < calls; ++call) {
    for (int r = 0; r < world; ++r) {
      const auto x = signal_input(r, call);
      for (std::size_t i = 0; i < n; ++i) sum_true[i] += x[i] / world;
    }
    double diff = 0, norm = 0;
    for (std::size_t i = 0; i < n; ++i) {
      sum_out[i] += outputs.as<float>()[call * n + i];
      diff += (sum_out[i] - sum_true[i]) * (sum_out[i] - sum_true[i]);
      norm += sum_true[i] * sum_true[i];
    }
    relative.push_back(std::sqrt(diff / norm));
  }
  EXPECT_LT(relative[calls - 1], relative[4] / 4)
      << "after 5 calls " << relative[4] << ", after " << calls << " calls " << relative[calls - 1];
  EXPECT_LT(relative[calls - 1], 0.05);
}

}  // namespace
}  // namespace onebit::testing
