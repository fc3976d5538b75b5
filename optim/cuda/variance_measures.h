// optim/variance_measures.h on device arrays: the automatic freeze's variance change and the
// dormant count, summed in tiled_sums.h's order (optim/cuda/tiled_sums.h), so the CPU core's
// measurement is their oracle, bit for bit. Each reads its answer back and synchronizes `stream`:
// not capturable in a CUDA graph (a shim measures at most once per step, as its CPU path does).
// `workspace`: device memory of at least tiled::workspace_bytes(&n, 1) bytes, the caller's, so that
// nothing allocates device memory. Errors throw onebit::Error (ONEBIT_SYSTEM_ERROR, named).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace onebit::optim::cuda {

double variance_change(const float* v, const float* v_then, std::size_t n, void* workspace, cudaStream_t stream);

std::size_t dormant_count(const float* v, std::size_t n, float eps, void* workspace, cudaStream_t stream);

}  // namespace onebit::optim::cuda
