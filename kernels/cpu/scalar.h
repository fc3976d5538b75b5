// The scalar kernels over an element range [begin, end) of a call (begin a multiple of 8), for the
// SIMD sets: they finish heads and tails (fewer elements than a vector) with these, so the two
// always agree there. Indices are absolute: element i is x[i], bit i of bits, and so on.
#pragma once

#include "kernels/cpu/cpu_kernels.h"

namespace onebit::kernels {

double scalar_worker_range(const void* x, Dtype dtype, const float* e_prev, float a_prev, float* e_next,
                           std::uint8_t* bits, std::size_t begin, std::size_t end);
double scalar_mean_worker_range(const float* const* x, int sources, const float* e_prev, float a_prev, float* e_next,
                                std::uint8_t* bits, std::size_t begin, std::size_t end);
double scalar_norm_range(const void* x, Dtype dtype, const float* e_prev, float a_prev, std::size_t begin,
                         std::size_t end);
double scalar_server_range(const std::uint8_t* const* bits, const float* scales, int ranks, const float* s_prev,
                           float b_prev, float* s_next, std::uint8_t* bits_out, std::size_t begin, std::size_t end);
void scalar_unpack_range(const std::uint8_t* bits, float scale, void* out, Dtype dtype, std::size_t begin,
                         std::size_t end);
void scalar_unpack_accumulate_range(const std::uint8_t* bits, float scale, float* out, std::size_t begin,
                                    std::size_t end);

// The kernel sets compiled with their instruction sets; defined only when the build has them.
const CpuKernels& avx2_kernels();
const CpuKernels& avx512_kernels();

}  // namespace onebit::kernels
