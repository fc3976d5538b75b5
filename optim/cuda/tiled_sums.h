// optim/tiled_sums.h's order on the device: a block sums one tile of term(i) — thread j is lane j
// over its rounds, then the halving tree in shared memory — and the host finishes the tiles' sums
// with tiled::total, the CPU's own code. So a sum here has the CPU core's bits.
//
// ranges_sums queues one kernel per range into the caller's workspace (device memory of at least
// tiled::workspace_bytes(counts, ranges) bytes, aligned for Sums), reads every tile's sums back at
// once and synchronizes `stream` once: not capturable in a CUDA graph. Errors throw onebit::Error
// (ONEBIT_SYSTEM_ERROR, naming `what`).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "common/error.h"
#include "optim/tiled_sums.h"

namespace onebit::optim::tiled::cuda {

template <typename Term>
__global__ void tiles_kernel(std::size_t n, Sums* tiles, Term term) {
  __shared__ Sums lanes[kLanes];
  const int j = threadIdx.x;
  Sums lane{0.0, 0.0, 0.0f};
  for (int r = 0; r < kRounds; ++r) {
    const std::size_t i = blockIdx.x * kTile + std::size_t(r) * kLanes + j;
    if (i < n) lane = combine(lane, term(i));
  }
  lanes[j] = lane;
  __syncthreads();
  for (int s = kLanes / 2; s > 0; s /= 2) {
    if (j < s) lanes[j] = combine(lanes[j], lanes[j + s]);
    __syncthreads();
  }
  if (j == 0) tiles[blockIdx.x] = lanes[0];
}

inline void check_cuda(cudaError_t status, const char* what, const char* doing) {
  ONEBIT_CHECK(status == cudaSuccess, ONEBIT_SYSTEM_ERROR, what, " on the device: ", doing, ": ",
               cudaGetErrorString(status));
}

// The sums of ranges one after another in the flat arrays, counts[j] elements each: range j's
// terms are term_of(j, its offset), a functor of the element's index within the range.
template <typename TermOf>
std::vector<Sums> ranges_sums(const std::size_t* counts, std::size_t ranges, const TermOf& term_of, void* workspace,
                              cudaStream_t stream, const char* what) {
  auto* on_device = static_cast<Sums*>(workspace);
  std::vector<std::size_t> first(ranges + 1, 0);  // range j's tiles are [first[j], first[j + 1])
  std::size_t offset = 0;
  for (std::size_t j = 0; j < ranges; ++j) {
    const std::size_t tiles = tiles_of(counts[j]);
    if (tiles > 0) {
      tiles_kernel<<<static_cast<unsigned>(tiles), kLanes, 0, stream>>>(counts[j], on_device + first[j],
                                                                        term_of(j, offset));
      check_cuda(cudaGetLastError(), what, "the sums' kernel did not launch");
    }
    first[j + 1] = first[j] + tiles;
    offset += counts[j];
  }
  std::vector<Sums> on_host(first[ranges]);
  if (!on_host.empty()) {
    check_cuda(
        cudaMemcpyAsync(on_host.data(), on_device, on_host.size() * sizeof(Sums), cudaMemcpyDeviceToHost, stream), what,
        "reading the sums back");
    check_cuda(cudaStreamSynchronize(stream), what, "waiting for the sums");
  }
  std::vector<Sums> totals(ranges);
  for (std::size_t j = 0; j < ranges; ++j) {
    totals[j] = total(std::vector<Sums>(on_host.begin() + first[j], on_host.begin() + first[j + 1]));
  }
  return totals;
}

}  // namespace onebit::optim::tiled::cuda
