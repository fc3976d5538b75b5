// The NCCL door's device path (engine/cuda_allreduce.cc: the CUDA kernels, the exchanges through
// transport/nccl, the error parity on the device, the revert, the checkpoint) on the CUDA and NCCL
// stand-ins, W ranks as threads of this process: every rank's output of every call bit for bit
// the float32 oracle's (tests/support/float32_oracle.h), as the CPU engine's are. What a GPU adds
// (NCCL's real transfers, streams, graph capture) is tools/gpu/nccl_job_check.py's.
#include <gtest/gtest.h>
#include <nccl.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "cuda_runtime.h"
#include "engine/cuda_allreduce.h"
#include "engine/tag_registry.h"
#include "kernels/cpu/half.h"
#include "tests/cuda_on_cpu/ranks_as_threads.h"
#include "tests/support/float32_oracle.h"

namespace onebit {
namespace {

using kernels::Dtype;
using testing::bits_of;
using testing::each_rank;

// Inputs of `steps` calls: [step][rank][element], normal values (as the dtype holds them).
std::vector<std::vector<std::vector<float>>> inputs(int steps, int world, std::size_t n, Dtype dtype) {
  std::mt19937 rng(static_cast<unsigned>(7 * n + world));
  std::normal_distribution<float> normal;
  std::vector<std::vector<std::vector<float>>> x(steps, std::vector<std::vector<float>>(world, std::vector<float>(n)));
  for (auto& step : x) {
    for (auto& rank : step) {
      for (float& v : rank) {
        v = normal(rng);
        if (dtype == Dtype::kFloat16) v = kernels::half_to_float(kernels::float_to_half(v));
      }
    }
  }
  return x;
}

// One rank's tag and device buffers; calls run on the stand-in's default stream.
struct RankCalls {
  Tag tag;
  ncclComm_t comm;
  std::uint64_t comm_id;
  Dtype dtype;
  std::size_t n;
  bool in_place;
  void* send = nullptr;
  void* recv = nullptr;

  RankCalls(const char* name, ncclComm_t comm_, std::uint64_t id, std::size_t n_, Dtype dtype_, bool in_place_)
      : comm(comm_), comm_id(id), dtype(dtype_), n(n_), in_place(in_place_) {
    tag.name = name;
    tag.count = n;
    tag.dtype = dtype;
    const std::size_t bytes = std::max<std::size_t>(1, n) * kernels::dtype_size(dtype);
    EXPECT_EQ(cudaMalloc(&send, bytes), cudaSuccess);
    recv = send;
    if (!in_place) {
      EXPECT_EQ(cudaMalloc(&recv, bytes), cudaSuccess);
    }
  }
  ~RankCalls() {
    cudaFree(send);
    if (!in_place) cudaFree(recv);
  }

  // One call with input x on `stream`; returns this rank's output, as floats.
  std::vector<float> call(const std::vector<float>& x, bool sum, cudaStream_t stream = nullptr) {
    std::vector<std::uint8_t> bytes(n * kernels::dtype_size(dtype));
    for (std::size_t i = 0; i < n; ++i) {
      if (dtype == Dtype::kFloat16) {
        const std::uint16_t h = kernels::float_to_half(x[i]);
        std::memcpy(bytes.data() + 2 * i, &h, 2);
      } else {
        std::memcpy(bytes.data() + 4 * i, &x[i], 4);
      }
    }
    EXPECT_EQ(cudaMemcpy(send, bytes.data(), bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
    cuda_compressed_allreduce(tag, CudaAllreduceCall{send, recv, n, dtype, sum, comm, comm_id, stream});
    EXPECT_EQ(cudaMemcpy(bytes.data(), recv, bytes.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    std::vector<float> out(n);
    for (std::size_t i = 0; i < n; ++i) {
      if (dtype == Dtype::kFloat16) {
        std::uint16_t h;
        std::memcpy(&h, bytes.data() + 2 * i, 2);
        out[i] = kernels::half_to_float(h);
      } else {
        std::memcpy(&out[i], bytes.data() + 4 * i, 4);
      }
    }
    return out;
  }

  std::uint64_t completed_on_device() const { return tag.device_states.begin()->second->completed_calls(); }
};

std::vector<float> as_dtype(std::vector<float> v, Dtype dtype) {
  if (dtype == Dtype::kFloat16) {
    for (float& x : v) x = kernels::half_to_float(kernels::float_to_half(x));
  }
  return v;
}

TEST(CudaAllreduceOnStandIns, EveryRanksEveryCallIsTheFloat32OraclesBitForBit) {
  constexpr int kSteps = 4;
  for (Dtype dtype : {Dtype::kFloat32, Dtype::kFloat16}) {
    for (int world : {2, 3, 4}) {
      for (std::size_t n : {std::size_t{1}, std::size_t{33}, std::size_t{1000}, std::size_t{4097}}) {
        SCOPED_TRACE(::testing::Message()
                     << "dtype " << static_cast<int>(dtype) << ", " << world << " ranks, " << n << " elements");
        const auto x = inputs(kSteps, world, n, dtype);
        const testing::StandInWorld comms(world);
        std::vector<std::vector<std::vector<float>>> got(kSteps, std::vector<std::vector<float>>(world));
        std::vector<std::uint64_t> completed(world);
        each_rank(world, [&](int r) {
          RankCalls rank("momentum", comms[r], 1, n, dtype, /*in_place=*/r % 2 == 0);
          cudaStream_t other = nullptr;  // every other call from another stream: it waits for the last
          EXPECT_EQ(cudaStreamCreate(&other), cudaSuccess);
          for (int s = 0; s < kSteps; ++s) got[s][r] = rank.call(x[s][r], /*sum=*/s % 2 == 1, s % 2 ? other : nullptr);
          completed[r] = rank.completed_on_device();
          cudaStreamDestroy(other);
        });
        testing::Float32Oracle oracle(world, n);
        for (int s = 0; s < kSteps; ++s) {
          const auto expected = bits_of(as_dtype(oracle.step(x[s], s % 2 == 1), dtype));
          for (int r = 0; r < world; ++r) ASSERT_EQ(bits_of(got[s][r]), expected) << "call " << s << ", rank " << r;
        }
        for (int r = 0; r < world; ++r) EXPECT_EQ(completed[r], kSteps) << "rank " << r << ": finish_call's count";
      }
    }
  }
}

// got[s][r], rank r's output of call s (sums off), is the float32 oracle's bit for bit for every call
// but `skipped`, which is non-finite on every rank and which the oracle never sees (no state changed).
void expect_the_oracle_but_one_non_finite_call(const std::vector<std::vector<std::vector<float>>>& got,
                                               const std::vector<std::vector<std::vector<float>>>& x, int skipped) {
  const int world = static_cast<int>(x[0].size());
  testing::Float32Oracle oracle(world, x[0][0].size());
  for (std::size_t s = 0; s < x.size(); ++s) {
    if (static_cast<int>(s) == skipped) {
      for (int r = 0; r < world; ++r) {
        for (float v : got[s][r]) ASSERT_FALSE(std::isfinite(v)) << "rank " << r;
      }
      continue;
    }
    const auto expected = bits_of(oracle.step(x[s], false));
    for (int r = 0; r < world; ++r) ASSERT_EQ(bits_of(got[s][r]), expected) << "call " << s << ", rank " << r;
  }
}

TEST(CudaAllreduceOnStandIns, ACallWithANaNIsNonFiniteEverywhereAndKeepsTheState) {
  constexpr int kWorld = 3, kSteps = 4, kNaNStep = 2;
  constexpr std::size_t kN = 1000;
  auto x = inputs(kSteps, kWorld, kN, Dtype::kFloat32);
  x[kNaNStep][1][5] = std::nanf("");
  const testing::StandInWorld comms(kWorld);
  std::vector<std::vector<std::vector<float>>> got(kSteps, std::vector<std::vector<float>>(kWorld));
  each_rank(kWorld, [&](int r) {
    RankCalls rank("momentum", comms[r], 1, kN, Dtype::kFloat32, false);
    for (int s = 0; s < kSteps; ++s) got[s][r] = rank.call(x[s][r], false);
  });
  expect_the_oracle_but_one_non_finite_call(got, x, kNaNStep);
}

// Ranks whose settings differ for one call (one rank's learning rate stepped alone): that call's
// output is non-finite on every rank and no state changes — the calls after it are the oracle's
// that never saw it, bit for bit — and each rank's next call says why, naming its own settings,
// not a NaN. The digests travel with the worker scales (the CPU engine's travel in its heads).
TEST(CudaAllreduceOnStandIns, RanksWhoseSettingsDifferGetANonFiniteCallAndKeepTheState) {
  constexpr int kWorld = 3, kSteps = 4, kDriftStep = 2;
  constexpr std::size_t kN = 1000;
  const auto x = inputs(kSteps, kWorld, kN, Dtype::kFloat32);
  const testing::StandInWorld comms(kWorld);
  std::vector<std::vector<std::vector<float>>> got(kSteps, std::vector<std::vector<float>>(kWorld));
  ::testing::internal::CaptureStderr();
  each_rank(kWorld, [&](int r) {
    RankCalls rank("momentum", comms[r], 1, kN, Dtype::kFloat32, false);
    for (int s = 0; s < kSteps; ++s) {
      const bool drifted = s == kDriftStep && r == 1;
      rank.tag.settings = drifted ? 0xD1F7 : 0x1000 + s;
      rank.tag.settings_text = drifted ? "lr 0.002 (rank 1)" : "lr 0.001";
      got[s][r] = rank.call(x[s][r], false);
    }
  });
  const std::string log = ::testing::internal::GetCapturedStderr();
  expect_the_oracle_but_one_non_finite_call(got, x, kDriftStep);
  std::size_t said = 0;
  for (std::size_t at = log.find("1 earlier call(s) found that the settings every rank must share");
       at != std::string::npos;
       at = log.find("1 earlier call(s) found that the settings every rank must share", at + 1)) {
    ++said;
  }
  EXPECT_EQ(said, static_cast<std::size_t>(kWorld)) << log;
  EXPECT_NE(log.find("This rank's settings now: lr 0.001"), std::string::npos) << log;
  EXPECT_EQ(log.find("NaN or Inf"), std::string::npos) << log;
}

TEST(CudaAllreduceOnStandIns, ASavedStateLoadedIntoNewTagsContinuesAsIfNeverStopped) {
  constexpr int kWorld = 3, kSteps = 4, kSaveAfter = 2;
  constexpr std::size_t kN = 1001;
  const auto x = inputs(kSteps, kWorld, kN, Dtype::kFloat32);
  const testing::StandInWorld before(kWorld), after(kWorld);
  std::vector<std::vector<std::vector<float>>> got(kSteps, std::vector<std::vector<float>>(kWorld));
  each_rank(kWorld, [&](int r) {
    std::vector<float> worker(kN), server;
    {
      RankCalls rank("momentum", before[r], 1, kN, Dtype::kFloat32, false);
      for (int s = 0; s < kSaveAfter; ++s) got[s][r] = rank.call(x[s][r], false);
      std::size_t worker_count = 0, server_count = 0;
      rank.tag.saved_sizes(&worker_count, &server_count);
      server.resize(server_count);
      rank.tag.save(worker.data(), server.data());
    }
    RankCalls resumed("momentum", after[r], 2, kN, Dtype::kFloat32, false);
    resumed.tag.load(worker.data(), worker.size(), server.data(), server.size());
    for (int s = kSaveAfter; s < kSteps; ++s) got[s][r] = resumed.call(x[s][r], false);
  });
  testing::Float32Oracle oracle(kWorld, kN);
  for (int s = 0; s < kSteps; ++s) {
    const auto expected = bits_of(oracle.step(x[s], false));
    for (int r = 0; r < kWorld; ++r) ASSERT_EQ(bits_of(got[s][r]), expected) << "call " << s << ", rank " << r;
  }
}

TEST(CudaAllreduceOnStandIns, ACallOnACommunicatorBeingEndedIsRefusedMakingNoState) {
  const testing::StandInWorld comms(2);
  each_rank(2, [&](int r) {
    RankCalls rank("momentum", comms[r], 1, 64, Dtype::kFloat32, false);
    CudaAllreduceCall call{rank.send, rank.recv, 64, Dtype::kFloat32, false, comms[r], 1, nullptr};
    call.live = [](ncclComm_t, std::uint64_t) { return false; };  // the door's table: being destroyed
    try {
      cuda_compressed_allreduce(rank.tag, call);
      ADD_FAILURE() << "rank " << r << ": the call ran";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ONEBIT_INVALID_ARGUMENT);
      EXPECT_NE(std::string(error.what()).find("is being destroyed or aborted"), std::string::npos) << error.what();
    }
    EXPECT_FALSE(rank.tag.has_run()) << "no device state under the dying communicator's id";
  });
}

}  // namespace
}  // namespace onebit
