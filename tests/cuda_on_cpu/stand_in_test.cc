// The CUDA stand-in's own rules (cuda_runtime.h): what the kernels' tests on the CPU lean on. A
// launch CUDA refuses runs nothing and fails as CUDA says; a block's threads meet at
// __syncthreads, and a missing one gives a wrong answer; votes and shuffles move lanes' values as
// CUDA's do, disjoint masks apart; a kernel that breaks a warp function's rule, or can make no
// progress, stops the test naming it; blocks run in a shuffled order and
// find their shared memory scribbled; memory is device memory only where cudaMalloc gave it, and
// holds 0xFF bytes until written; a capture is a stream's state that a synchronize invalidates,
// and work queued on a capturing stream stops the test.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
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
  onebit_cuda_on_cpu::shared_memory(&sums, sizeof(sums));  // as lower_launches.py adds it
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
  std::vector<double> shuffled(32);
  launch(
      [&] {
        const unsigned t = threadIdx.x;
        ballots[t] = __ballot_sync(t < 32 ? 0xffffffffu : 0xffu, t % 3 == 0);
        if (t < 32) shuffled[t] = __shfl_down_sync(0xffffffffu, 0.5 * t, 3);
      },
      dim3(1), dim3(threads));
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  unsigned first = 0, second = 0;
  for (unsigned lane = 0; lane < 32; ++lane) first |= (lane % 3 == 0 ? 1u : 0u) << lane;
  for (unsigned lane = 0; lane < 8; ++lane) second |= ((32 + lane) % 3 == 0 ? 1u : 0u) << lane;
  for (unsigned t = 0; t < threads; ++t) EXPECT_EQ(ballots[t], t < 32 ? first : second) << "thread " << t;
  for (unsigned t = 0; t < 32; ++t) {
    EXPECT_EQ(shuffled[t], 0.5 * (t + 3 < 32 ? t + 3 : t)) << "lane " << t << ": past the warp, its own";
  }
}

TEST(CudaStandIn, DisjointMasksVoteApartAndMeetAtSyncthreads) {
  std::vector<unsigned> ballots(32);
  launch(
      [&] {
        const unsigned t = threadIdx.x;
        ballots[t] = __ballot_sync(t < 16 ? 0x0000ffffu : 0xffff0000u, t % 2 == 0);
        __syncthreads();
      },
      dim3(1), dim3(32));
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  for (unsigned t = 0; t < 32; ++t) EXPECT_EQ(ballots[t], t < 16 ? 0x00005555u : 0x55550000u) << "lane " << t;
}

TEST(CudaStandIn, BlocksRunInAShuffledOrderFindingTheirSharedMemoryScribbled) {
  std::vector<unsigned> order, first_seen;
  launch(
      [&] {
        __shared__ unsigned scratch[2];
        onebit_cuda_on_cpu::shared_memory(&scratch, sizeof(scratch));
        first_seen.push_back(scratch[1]);  // one thread a block: no race
        scratch[1] = blockIdx.x;
        order.push_back(blockIdx.x);
      },
      dim3(64), dim3(1));
  ASSERT_EQ(order.size(), 64u);
  std::vector<unsigned> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  for (unsigned b = 0; b < 64; ++b) EXPECT_EQ(sorted[b], b) << "every block once";
  EXPECT_NE(order, sorted) << "not in index order";
  for (unsigned seen : first_seen) EXPECT_EQ(seen, 0xFFFFFFFFu) << "not what the block before left";
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
  EXPECT_DEATH(launch(
                   [] {
                     if (threadIdx.x >= 32) __shfl_down_sync(0xffu, 1.0f, 3);
                   },
                   dim3(1), dim3(40)),
               "reads a lane outside the mask");
}

// Each block's threads write one slot of shared memory each, then read the slot of the thread
// before them. With the __syncthreads between, every read sees that thread's write; without it,
// threads run in index order would still read every write, but the fibers are resumed in a shuffled
// order, so some thread runs before the one it reads and finds the scribble: a missing barrier is
// a wrong answer here, the same one in every run of the same tests.
void read_the_thread_before(unsigned* out, bool synchronize) {
  __shared__ unsigned slots[64];
  onebit_cuda_on_cpu::shared_memory(&slots, sizeof(slots));
  slots[threadIdx.x] = threadIdx.x;
  if (synchronize) __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = slots[threadIdx.x == 0 ? 0 : threadIdx.x - 1];
}

TEST(CudaStandIn, AMissingSyncthreadsReadsWhatIsNotYetWritten) {
  for (bool synchronize : {true, false}) {
    std::vector<unsigned> out(8 * 64);
    launch([&] { read_the_thread_before(out.data(), synchronize); }, dim3(8), dim3(64));
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    unsigned scribbled = 0;
    for (unsigned i = 0; i < out.size(); ++i) {
      const unsigned t = i % 64;
      if (synchronize) {
        EXPECT_EQ(out[i], t == 0 ? 0 : t - 1) << "thread " << t << " of block " << i / 64;
      }
      scribbled += out[i] == 0xFFFFFFFFu;
    }
    if (!synchronize) {
      EXPECT_GT(scribbled, 0u) << "every thread ran after the one before it: no shuffled order";
    }
  }
}

// Half a warp waits at __syncthreads while the other half votes with the whole warp: neither can
// go on. A GPU hangs; the stand-in stops at once, naming the block and who waits where.
TEST(CudaStandInDeathTest, ABlockThatCanMakeNoProgressStopsNamingIt) {
  EXPECT_DEATH(launch(
                   [] {
                     if (threadIdx.x < 16) {
                       __syncthreads();
                     } else {
                       __ballot_sync(0xffffffffu, true);
                     }
                   },
                   dim3(3), dim3(32)),
               "block \\([0-2],0,0\\) can make no progress \\(a GPU would hang\\): 16 threads wait at "
               "__syncthreads, 16 in a vote or shuffle");
}

TEST(CudaStandIn, OnlyWhatCudaMallocGaveIsDeviceMemoryAndCopiesStayInside) {
  float* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, 16 * sizeof(float)), cudaSuccess);
  std::uint32_t fresh[16];
  std::memcpy(fresh, device, sizeof(fresh));
  for (std::uint32_t word : fresh) EXPECT_EQ(word, 0xFFFFFFFFu) << "fresh device memory is not zeroed";
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

// A capture is a stream's state (no graph is recorded): the stream says it is capturing, a
// synchronize of it fails as CUDA's and invalidates the capture, whose end then says so; the legacy
// stream cannot capture, and a stream cannot capture twice at once.
TEST(CudaStandIn, ACaptureIsAStreamStateThatASynchronizeInvalidates) {
  cudaStream_t stream = nullptr, other = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  ASSERT_EQ(cudaStreamCreate(&other), cudaSuccess);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusActive;
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeGlobal), cudaErrorStreamCaptureUnsupported);
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaErrorIllegalState);
  ASSERT_EQ(cudaStreamIsCapturing(stream, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusActive);
  ASSERT_EQ(cudaStreamIsCapturing(other, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusNone);
  EXPECT_EQ(cudaStreamSynchronize(other), cudaSuccess);
  EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess) << "nothing synchronized the capturing stream";
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaErrorStreamCaptureUnsupported);
  ASSERT_EQ(cudaStreamIsCapturing(stream, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusInvalidated);
  EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaErrorIllegalState) << "ended already";
  ASSERT_EQ(cudaStreamIsCapturing(stream, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusNone);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  (void)cudaGetLastError();
  cudaStreamDestroy(stream);
  cudaStreamDestroy(other);
}

TEST(CudaStandInDeathTest, WorkQueuedOnACapturingStreamStopsTheTest) {
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_DEATH(launch([] {}, dim3(1), dim3(32), 0, stream), "a kernel launch on a stream capturing a CUDA graph");
  char byte = 0;
  EXPECT_DEATH(cudaMemcpyAsync(&byte, &byte, 1, cudaMemcpyHostToHost, stream), "cudaMemcpyAsync on a stream capturing");
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaStreamDestroy(stream);
}
