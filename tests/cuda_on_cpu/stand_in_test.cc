// The CUDA stand-in's own rules (cuda_runtime.h): what the kernels' tests on the CPU lean on. A
// launch CUDA refuses runs nothing and fails as CUDA says; a block's threads meet at
// __syncthreads; votes and shuffles move lanes' values as CUDA's do; a kernel that breaks a warp
// function's rule stops the test naming it; memory is device memory only where cudaMalloc gave it.
#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "cuda_runtime.h"

namespace {

using onebit_cuda_on_cpu::launch;

TEST(CudaStandIn, LaunchesCudaRefusesRunNothingAndFailAsInvalidConfiguration) {
  std::atomic<int> ran{0};
  const auto count = [&] { ran.fetch_add(1); };
  for (const auto& [grid, block] : std::vector<std::pair<dim3, dim3>>{
           {dim3(0), dim3(256)}, {dim3(1), dim3(0)}, {dim3(1), dim3(1025)}, {dim3(1, 65536), dim3(1)}}) {
    launch(count, grid, block);
    EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration) << grid.x << "x" << grid.y << " blocks of " << block.x;
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "read once, then cleared";
  }
  EXPECT_EQ(ran.load(), 0);
  launch(count, dim3(3), dim3(1024));
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(ran.load(), 3 * 1024);
}

// Each block sums its threads' indices through shared memory, a tree of __syncthreads.
void block_sums(unsigned* out) {
  __shared__ unsigned sums[256];
  sums[threadIdx.x] = blockIdx.x * blockDim.x + threadIdx.x;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) sums[threadIdx.x] += sums[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = sums[0];
}

TEST(CudaStandIn, BlocksThreadsMeetAtSyncthreads) {
  std::vector<unsigned> out(5);
  launch([&] { block_sums(out.data()); }, dim3(5), dim3(256));
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  for (unsigned b = 0; b < 5; ++b) EXPECT_EQ(out[b], 256 * (256 * b) + 255 * 256 / 2) << "block " << b;
}

TEST(CudaStandIn, BallotPutsLaneKInBitKAndShuffleDownReadsLaneKPlusDelta) {
  const unsigned threads = 40;  // a whole warp and one of 8 lanes
  std::vector<unsigned> ballots(threads);
  std::vector<double> shuffled(threads);
  launch(
      [&] {
        const unsigned t = threadIdx.x;
        const unsigned mask = t < 32 ? 0xffffffffu : 0xffu;
        ballots[t] = __ballot_sync(mask, t % 3 == 0);
        shuffled[t] = __shfl_down_sync(mask, 0.5 * t, 3);
      },
      dim3(1), dim3(threads));
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  unsigned first = 0, second = 0;
  for (unsigned lane = 0; lane < 32; ++lane) first |= (lane % 3 == 0 ? 1u : 0u) << lane;
  for (unsigned lane = 0; lane < 8; ++lane) second |= ((32 + lane) % 3 == 0 ? 1u : 0u) << lane;
  for (unsigned t = 0; t < threads; ++t) {
    EXPECT_EQ(ballots[t], t < 32 ? first : second) << "thread " << t;
    const unsigned lanes = t < 32 ? 32 : 8, lane = t % 32;
    EXPECT_EQ(shuffled[t], 0.5 * (lane + 3 < lanes ? t + 3 : t)) << "thread " << t << ": past the warp, its own";
  }
}

TEST(CudaStandInDeathTest, AFullMaskVoteWithALaneGoneStopsNamingIt) {
  EXPECT_DEATH(launch(
                   [] {
                     if (threadIdx.x == 5) return;
                     __ballot_sync(0xffffffffu, true);
                   },
                   dim3(1), dim3(32)),
               "lane of the mask left the kernel");
  EXPECT_DEATH(launch([] { __ballot_sync(0xffffffffu, true); }, dim3(1), dim3(16)),
               "the mask names lanes this warp does not have");
}

TEST(CudaStandIn, OnlyWhatCudaMallocGaveIsDeviceMemoryAndCopiesStayInside) {
  float* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, 16 * sizeof(float)), cudaSuccess);
  std::vector<float> host(17, 1.0f);
  cudaPointerAttributes a{};
  ASSERT_EQ(cudaPointerGetAttributes(&a, device + 15), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeDevice);
  EXPECT_EQ(a.device, 0);
  ASSERT_EQ(cudaPointerGetAttributes(&a, host.data()), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeUnregistered);
  EXPECT_EQ(cudaMemcpy(device, host.data(), 16 * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(device, host.data(), 17 * sizeof(float), cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(host.data(), device + 1, 16 * sizeof(float), cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(host.data(), host.data() + 1, sizeof(float), cudaMemcpyDeviceToHost), cudaErrorInvalidValue)
      << "host memory is not a device source";
  EXPECT_EQ(cudaFree(host.data()), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFree(device), cudaSuccess);
  ASSERT_EQ(cudaPointerGetAttributes(&a, device), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeUnregistered) << "freed";
  cudaGetLastError();
}

}  // namespace
