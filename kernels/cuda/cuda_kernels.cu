#include "kernels/cuda/cuda_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace onebit::kernels::cuda {
namespace {

constexpr int kThreads = 256;  // 8 warps
constexpr int kMaxBlocks = 4096;

int blocks_for(std::size_t n) {
  const std::size_t wanted = (n + kThreads - 1) / kThreads;
  return static_cast<int>(wanted < 1 ? 1 : (wanted > kMaxBlocks ? kMaxBlocks : wanted));
}

__device__ __forceinline__ float load(const void* x, Dtype dtype, std::size_t i) {
  switch (dtype) {
    case Dtype::kFloat16: return __half2float(static_cast<const __half*>(x)[i]);
    case Dtype::kBFloat16: return __bfloat162float(static_cast<const __nv_bfloat16*>(x)[i]);
    default: return static_cast<const float*>(x)[i];
  }
}

// stored − scale·sign(stored), as the CPU kernels compute it: one subtraction or addition.
__device__ __forceinline__ float true_error(float stored, float scale) {
  return stored >= 0.0f ? __fsub_rn(stored, scale) : __fadd_rn(stored, scale);
}

// Writes a warp's ballot word: the bytes that exist for elements [base, min(base+32, n)).
__device__ __forceinline__ void store_bits(std::uint8_t* bits, std::size_t base, std::size_t n, unsigned word) {
  const std::size_t first_byte = base / 8;
  const std::size_t bytes = (n - base >= 32) ? 4 : (n - base + 7) / 8;
  for (std::size_t b = 0; b < bytes; ++b) bits[first_byte + b] = static_cast<std::uint8_t>(word >> (8 * b));
}

// Block-wide sum of per-thread doubles into partial[blockIdx.x].
__device__ void block_sum(double value, double* partial) {
  __shared__ double warp_sums[kThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_down_sync(0xffffffffu, value, offset);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = value;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int w = 0; w < kThreads / 32; ++w) total += warp_sums[w];
    partial[blockIdx.x] = total;
  }
}

// The loop both reducing kernels share: value(i) computes and stores element i's new value; its
// sign bit goes to bits, its square to the block's partial sum. Every thread of a warp runs the
// same number of iterations (the bound is rounded up to whole warps), so __ballot_sync always sees
// the full warp; lanes past n contribute a 0 bit.
template <typename Value>
__device__ void signs_and_squares(std::size_t n, std::uint8_t* bits, double* partial, Value value) {
  double squares = 0.0;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t rounded = (n + 31) / 32 * 32;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < rounded; i += stride) {
    bool positive = false;
    if (i < n) {
      const float v = value(i);
      positive = v >= 0.0f;
      squares += static_cast<double>(v) * static_cast<double>(v);
    }
    const unsigned word = __ballot_sync(0xffffffffu, positive);
    if (threadIdx.x % 32 == 0) store_bits(bits, i, n, word);
  }
  block_sum(squares, partial);
}

__global__ void worker_kernel(const void* x, Dtype dtype, const float* e_prev, const float* a_prev, float* e_next,
                              std::uint8_t* bits, std::size_t n, double* partial) {
  const float a = *a_prev;
  signs_and_squares(n, bits, partial, [&](std::size_t i) {
    const float y = __fadd_rn(load(x, dtype, i), true_error(e_prev[i], a));
    e_next[i] = y;
    return y;
  });
}

__global__ void server_kernel(const std::uint8_t* const* bits, const float* scales, int ranks, float inv_ranks,
                              const float* s_prev, const float* b_prev, float* s_next, std::uint8_t* bits_out,
                              std::size_t n, double* partial) {
  const float b = *b_prev;
  signs_and_squares(n, bits_out, partial, [&](std::size_t i) {
    float sum = 0.0f;
    for (int r = 0; r < ranks; ++r) {
      const bool plus = (bits[r][i / 8] >> (i % 8)) & 1u;
      sum = __fadd_rn(sum, plus ? scales[r] : -scales[r]);
    }
    const float z = __fadd_rn(__fmul_rn(sum, inv_ranks), true_error(s_prev[i], b));
    s_next[i] = z;
    return z;
  });
}

// One block: the partial sums in block order, then the scale.
__global__ void finish_kernel(const double* partial, int blocks, std::size_t n, Reduction out) {
  __shared__ double sums[kThreads];
  double mine = 0.0;
  for (int b = threadIdx.x; b < blocks; b += blockDim.x) mine += partial[b];
  sums[threadIdx.x] = mine;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int t = 0; t < kThreads; ++t) total += sums[t];
    *out.sum_squares = total;
    *out.scale = n == 0 ? 0.0f : static_cast<float>(sqrt(total / static_cast<double>(n)));
  }
}

__global__ void unpack_kernel(const std::uint8_t* bits, const float* scale, float factor, void* out, Dtype dtype,
                              std::size_t n) {
  const float s = __fmul_rn(*scale, factor);
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const bool plus = (bits[i / 8] >> (i % 8)) & 1u;
    const float v = plus ? s : -s;
    switch (dtype) {
      case Dtype::kFloat16: static_cast<__half*>(out)[i] = __float2half_rn(v); break;
      case Dtype::kBFloat16: static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(v); break;
      default: static_cast<float*>(out)[i] = v;
    }
  }
}

// One thread: decides, and restores the two scales (which the copy kernel does not read).
__global__ void verdict_kernel(const float* worker_scales, const float* server_scales, int ranks, Revert r) {
  bool finite = true;
  for (int p = 0; p < ranks; ++p) finite = finite && isfinite(worker_scales[p]) && isfinite(server_scales[p]);
  *r.verdict = finite ? 0 : 1;
  if (!finite) {
    *r.worker_scale = r.saved_scales[0];
    *r.server_scale = r.saved_scales[1];
    atomicAdd(r.failures, 1u);
  }
}

__global__ void revert_kernel(Revert r) {
  if (*r.verdict == 0) return;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < r.n; i += stride) {
    r.e_next[i] = r.e_prev[i];
  }
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < r.server_n; i += stride) {
    r.s_next[i] = r.s_prev[i];
  }
}

}  // namespace

cudaError_t revert_unless_finite(const float* worker_scales, const float* server_scales, int ranks,
                                 const Revert& revert, cudaStream_t stream) {
  verdict_kernel<<<1, 1, 0, stream>>>(worker_scales, server_scales, ranks, revert);
  revert_kernel<<<blocks_for(revert.n > revert.server_n ? revert.n : revert.server_n), kThreads, 0, stream>>>(revert);
  return cudaGetLastError();
}

std::size_t workspace_bytes(std::size_t n) { return static_cast<std::size_t>(blocks_for(n)) * sizeof(double); }

cudaError_t worker_pass(const void* x, Dtype dtype, const float* e_prev, const float* a_prev, float* e_next,
                        std::uint8_t* bits, std::size_t n, Reduction out, void* workspace, cudaStream_t stream) {
  const int blocks = blocks_for(n);
  auto* partial = static_cast<double*>(workspace);
  worker_kernel<<<blocks, kThreads, 0, stream>>>(x, dtype, e_prev, a_prev, e_next, bits, n, partial);
  finish_kernel<<<1, kThreads, 0, stream>>>(partial, blocks, n, out);
  return cudaGetLastError();
}

cudaError_t server_pass(const std::uint8_t* const* bits, const float* scales, int ranks, float inv_ranks,
                        const float* s_prev, const float* b_prev, float* s_next, std::uint8_t* bits_out, std::size_t n,
                        Reduction out, void* workspace, cudaStream_t stream) {
  const int blocks = blocks_for(n);
  auto* partial = static_cast<double*>(workspace);
  server_kernel<<<blocks, kThreads, 0, stream>>>(bits, scales, ranks, inv_ranks, s_prev, b_prev, s_next, bits_out, n,
                                                 partial);
  finish_kernel<<<1, kThreads, 0, stream>>>(partial, blocks, n, out);
  return cudaGetLastError();
}

cudaError_t unpack(const std::uint8_t* bits, const float* scale, float factor, void* out, Dtype dtype, std::size_t n,
                   cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  unpack_kernel<<<blocks_for(n), kThreads, 0, stream>>>(bits, scale, factor, out, dtype, n);
  return cudaGetLastError();
}

}  // namespace onebit::kernels::cuda
