// 0/1 Adam's steps over device arrays: the C core's rule (optim/zero_one_adam.h) on a CUDA stream,
// element for element the same bits as the CPU loops (optim/adam_elementwise.h says why), so the
// CPU core is these kernels' oracle. Asynchronous on `stream`, allocating nothing. The learning-rate
// sum lrs is the caller's host float: the kernels take its value when they are queued, and the
// host side of local_step and sync_end updates it (so a CUDA graph would bake it in: these steps
// are not for capture). The C ABI's onebit_zero_one_adam_*_device entry points launch them.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "optim/zero_one_adam.h"

namespace onebit::optim::zero_one_adam::cuda {

cudaError_t gradient_step(const Config& c, float* p, float* m, float* v, const float* g, std::size_t n,
                          bool update_variance, cudaStream_t stream);
// The kernel for p, m, u; *lrs += lr on the host once it is queued.
cudaError_t local_step(const Config& c, float* p, float* m, const float* v, float* u, float* lrs, const float* g,
                       std::size_t n, cudaStream_t stream);
cudaError_t sync_begin(const Config& c, float* u, const float* v, float lrs, std::size_t n, cudaStream_t stream);
// The kernel with lrs's value; *lrs = 0 on the host once it is queued.
cudaError_t sync_end(const Config& c, float* p, float* p_sync, float* m, float* u, const float* v, float* lrs,
                     std::size_t n, cudaStream_t stream);

}  // namespace onebit::optim::zero_one_adam::cuda
