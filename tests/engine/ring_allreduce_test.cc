// The exact full-precision ring through the shipped C ABI, ranks as real processes on loopback.

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

// ---- the full-precision ring ----

TEST(RingAllreduce, ExactForIntegerInputs) {
  for (int world : {2, 3, 5, 64}) {  // 64: a cluster's world, most ring chunks of small tensors empty
    const std::vector<std::size_t> sizes = {0, 1, 7, 100003};
    const int port = free_port();
    auto outcomes = run_ranks(world, [&](int rank) {
      onebit_comm_t comm = join_loopback(rank, world, port);
      for (std::size_t n : sizes) {
        for (onebit_op_t op : {ONEBIT_SUM, ONEBIT_AVG}) {
          std::vector<float> buffer(n);
          for (std::size_t i = 0; i < n; ++i) buffer[i] = static_cast<float>((i * 31 + rank * 17) % 1000) - 500.0f;
          RANK_FAILS_IF(onebit_allreduce(comm, buffer.data(), n, ONEBIT_FLOAT32, op) != ONEBIT_SUCCESS, 2);
          for (std::size_t i = 0; i < n; ++i) {
            float sum = 0;
            for (int r = 0; r < world; ++r) sum += static_cast<float>((i * 31 + r * 17) % 1000) - 500.0f;
            const float expected = op == ONEBIT_SUM ? sum : sum / static_cast<float>(world);
            if (buffer[i] != expected) {
              return RANK_FAILED(3, "W=" + std::to_string(world) + " n=" + std::to_string(n) +
                                        " op=" + std::to_string(int(op)) + " i=" + std::to_string(i) + ": " +
                                        std::to_string(buffer[i]) + " != " + std::to_string(expected));
            }
          }
          std::vector<std::uint16_t> half(n);  // fp16: small integers are exact
          for (std::size_t i = 0; i < n; ++i) {
            const std::uint16_t values[] = {0x3C00, 0x4000, 0x4200, 0xC000};  // 1, 2, 3, -2
            half[i] = values[(i + rank) % 4];
          }
          RANK_FAILS_IF(onebit_allreduce(comm, half.data(), n, ONEBIT_FLOAT16, ONEBIT_SUM) != ONEBIT_SUCCESS, 4);
          const std::uint16_t values[] = {0x3C00, 0x4000, 0x4200, 0xC000};
          for (std::size_t i = 0; i < n; ++i) {
            float sum = 0;
            for (int r = 0; r < world; ++r) sum += kernels::half_to_float(values[(i + r) % 4]);
            if (kernels::half_to_float(half[i]) != sum) {
              return RANK_FAILED(5, "W=" + std::to_string(world) + " n=" + std::to_string(n) +
                                        " fp16 i=" + std::to_string(i) + ": " +
                                        std::to_string(kernels::half_to_float(half[i])) + " != " + std::to_string(sum));
            }
          }
        }
      }
      onebit_comm_destroy(comm);
      return 0;
    });
    for (int r = 0; r < world; ++r) EXPECT_EQ(outcomes[r].exit_code, 0) << "rank " << r << " of " << world;
  }
}

}  // namespace
}  // namespace onebit::testing
