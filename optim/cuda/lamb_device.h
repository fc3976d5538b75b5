// 1-bit LAMB's steps over device arrays: the C core's rule (optim/onebit_lamb.h) on a CUDA stream,
// the same bits as the CPU loops — the per-element rules and the order of every fp64 sum are
// optim/lamb_rules.h's, shared with them — so the CPU core is these steps' oracle.
//
// A layer's trust ratio needs its norms, so warmup_step, scaling_coeffs and apply_step each sum on
// the device (one block a tile), read the tiles' sums back to the host, synchronizing `stream`
// once per layer (as DeepSpeed's .item() of its norms does), finish them with the CPU's own code,
// update the layer on the host and queue the pass that moves p. Not capturable in a CUDA graph.
// momentum_step is asynchronous. `workspace`: device memory of at least workspace_bytes(n) bytes
// (the tiles' sums), the caller's, so that no step allocates. Errors throw onebit::Error: a layer
// not set up (before anything runs), a CUDA failure (ONEBIT_SYSTEM_ERROR, named).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "optim/onebit_lamb.h"

namespace onebit::optim::lamb::cuda {

// The workspace a layer of n elements needs (one tile's at least).
std::size_t workspace_bytes(std::size_t n);

void warmup_step(const Config& c, Layer& layer, std::int64_t step, float* p, float* m, float* v, float* v_fresh,
                 const float* g, std::size_t n, void* workspace, cudaStream_t stream);
// The layers one after another at m, counts[j] each; workspace for the largest.
void scaling_coeffs(const float* m, const std::size_t* counts, std::size_t layers, Layer* states, void* workspace,
                    cudaStream_t stream);
void momentum_step(const Config& c, const Layer& layer, float* m, float* m_last, const float* g, std::size_t n,
                   cudaStream_t stream);
void apply_step(const Config& c, Layer& layer, float* p, float* m, const float* m_last, const float* v, float* v_fresh,
                std::size_t n, void* workspace, cudaStream_t stream);

}  // namespace onebit::optim::lamb::cuda
