// 1-bit Adam's steps over device arrays: the C core's rule (optim/onebit_adam.h) on a CUDA stream,
// element for element the same bits as the CPU loops (optim/adam_elementwise.h says why), so the
// CPU core is these kernels' oracle. Asynchronous on `stream`, allocating nothing, capturable in
// a CUDA graph. The C ABI's onebit_adam_*_device entry points (plugin/capi) launch them.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "optim/onebit_adam.h"

namespace onebit::optim::cuda {

// warmup_step: m, v and p from the gradient averaged over ranks.
cudaError_t warmup_step(const AdamConfig& config, float* p, float* m, float* v, const float* g, std::size_t n,
                        cudaStream_t stream);

// momentum_step with the local gradient; m_before (may be null) receives m as it was.
cudaError_t momentum_step(const AdamConfig& config, float* m, float* m_before, const float* g, std::size_t n,
                          cudaStream_t stream);

// apply_step under the frozen variance, with the averaged momentum (dormant elements' m zeroed).
cudaError_t apply_step(const AdamConfig& config, float* p, float* m, const float* v, std::size_t n,
                       cudaStream_t stream);

}  // namespace onebit::optim::cuda
