// 1-bit LAMB's steps over device arrays: the C core's rule (optim/onebit_lamb.h) on a CUDA stream,
// the same bits as the CPU loops — the per-element rules are optim/lamb_rules.h's and the order of
// every fp64 sum optim/tiled_sums.h's, shared with them — so the CPU core is these steps' oracle.
//
// A layer's trust ratio needs its norms, so the steps that need them take every layer at once
// (layers one after another in the flat arrays, counts[j] elements each, configs[j] and states[j]
// theirs): one sum kernel per layer (a block a tile) into the workspace, all the tiles' sums read
// back to the host with one synchronization of `stream`, finished there with the CPU's own code,
// the states updated on the host, and the passes that move p queued. Not capturable in a CUDA
// graph. momentum_step, one layer, is asynchronous. `workspace`: device memory of at least
// tiled::workspace_bytes(counts, layers) bytes, the caller's, so that no step allocates device
// memory. Errors throw onebit::Error: a state not set up (every layer checked before anything
// runs), a CUDA failure (ONEBIT_SYSTEM_ERROR, named).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "optim/onebit_lamb.h"

namespace onebit::optim::lamb::cuda {

void warmup_steps(const Config* configs, Layer* states, const std::size_t* counts, std::size_t layers,
                  std::int64_t step, float* p, float* m, float* v, float* v_fresh, const float* g, void* workspace,
                  cudaStream_t stream);
void scaling_coeffs(const float* m, const std::size_t* counts, std::size_t layers, Layer* states, void* workspace,
                    cudaStream_t stream);
void momentum_step(const Config& c, const Layer& layer, float* m, float* m_last, const float* g, std::size_t n,
                   cudaStream_t stream);
void apply_steps(const Config* configs, Layer* states, const std::size_t* counts, std::size_t layers, float* p,
                 float* m, const float* m_last, const float* v, float* v_fresh, void* workspace, cudaStream_t stream);

}  // namespace onebit::optim::lamb::cuda
