// How optim/cuda's elementwise kernels cover their arrays: blocks of kThreads threads, enough to
// fill the device (at most 65535), each thread taking elements a grid's width apart.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace onebit::optim::cuda {

constexpr int kThreads = 256;

inline unsigned blocks_for(std::size_t n) {
  const std::size_t wanted = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(wanted < 65535 ? (wanted > 0 ? wanted : 1) : 65535);
}

}  // namespace onebit::optim::cuda

// for (i over this thread's elements of [0, n)), inside a kernel.
#define ONEBIT_GRID_STRIDE_LOOP(i, n)                                               \
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < (n); \
       i += std::size_t{gridDim.x} * blockDim.x)
