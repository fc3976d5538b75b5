#include "kernels/cuda/cuda_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace onebit::kernels::cuda {
namespace {

constexpr int kThreads = 256;  // 8 warps

// Where a pass reads its stored errors and writes the new ones: two fixed buffers (the pointer
// entry points, tested against the scalar oracle) or a pair chosen by a parity in device memory
// (ErrorBuffers, the engine's). Every thread reads the parity once, at the kernel's start.
struct FixedPair {
  const float* prev_;
  float* next_;
  __device__ const float* prev() const { return prev_; }
  __device__ float* next() const { return next_; }
};
struct ParityPair {
  ErrorBuffers e;
  __device__ const float* prev() const { return e.buffer[*e.parity]; }
  __device__ float* next() const { return e.buffer[1 - *e.parity]; }
};
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

template <typename Pair>
__global__ void worker_kernel(const void* x, Dtype dtype, Pair e, const float* a_prev, std::uint8_t* bits,
                              std::size_t n, double* partial) {
  const float* e_prev = e.prev();
  float* e_next = e.next();
  const float a = *a_prev;
  signs_and_squares(n, bits, partial, [&](std::size_t i) {
    const float y = __fadd_rn(load(x, dtype, i), true_error(e_prev[i], a));
    e_next[i] = y;
    return y;
  });
}

template <typename Pair>
__global__ void server_kernel(const std::uint8_t* const* bits, const float* scales, int ranks, float inv_ranks, Pair s,
                              const float* b_prev, std::uint8_t* bits_out, std::size_t n, double* partial) {
  const float* s_prev = s.prev();
  float* s_next = s.next();
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

// What a revert needs besides the two error pairs (Revert's and ParityRevert's common part).
struct RevertScales {
  const float* saved_scales;
  float* worker_scale;
  float* server_scale;
  int* verdict;
  unsigned* failures;
  const int* settings_differ;  // may be null
  unsigned* mismatches;        // with settings_differ
};

// One thread: decides, and restores the two scales (which the copy kernel does not read).
__global__ void verdict_kernel(const float* worker_scales, const float* server_scales, int ranks, RevertScales r) {
  bool finite = true;
  for (int p = 0; p < ranks; ++p) finite = finite && isfinite(worker_scales[p]) && isfinite(server_scales[p]);
  *r.verdict = finite ? 0 : 1;
  if (!finite) {
    *r.worker_scale = r.saved_scales[0];
    *r.server_scale = r.saved_scales[1];
    // Mapped host memory; one thread, ordered on the stream: no atomic needed.
    if (r.settings_differ != nullptr && *r.settings_differ != 0) {
      *r.mismatches += 1;
    } else {
      *r.failures += 1;
    }
  }
}

__global__ void store_digest_kernel(std::uint64_t* slot, std::uint64_t digest) { *slot = digest; }

__global__ void settings_kernel(const std::uint64_t* digests, int ranks, float* worker_scales, int* differ) {
  bool same = true;
  for (int p = 1; p < ranks; ++p) same = same && digests[p] == digests[0];
  *differ = same ? 0 : 1;
  if (!same) {
    for (int p = 0; p < ranks; ++p) worker_scales[p] = nanf("");
  }
}

template <typename Pair>
__global__ void revert_kernel(const int* verdict, Pair e, std::size_t n, Pair s, std::size_t server_n) {
  if (*verdict == 0) return;
  const float* e_prev = e.prev();
  float* e_next = e.next();
  const float* s_prev = s.prev();
  float* s_next = s.next();
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    e_next[i] = e_prev[i];
  }
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < server_n; i += stride) {
    s_next[i] = s_prev[i];
  }
}

template <typename Pair>
cudaError_t launch_revert(const float* worker_scales, const float* server_scales, int ranks, RevertScales scales,
                          Pair e, std::size_t n, Pair s, std::size_t server_n, cudaStream_t stream) {
  verdict_kernel<<<1, 1, 0, stream>>>(worker_scales, server_scales, ranks, scales);
  revert_kernel<<<blocks_for(n > server_n ? n : server_n), kThreads, 0, stream>>>(scales.verdict, e, n, s, server_n);
  return cudaGetLastError();
}

// One thread, the call's last kernel: what it wrote becomes current; the call is counted.
__global__ void finish_call_kernel(int* parity, unsigned long long* completed) {
  *parity = 1 - *parity;
  *completed += 1;  // mapped host memory: a plain store, as an atomic there needs the host's support
}

template <typename Pair>
cudaError_t launch_worker(const void* x, Dtype dtype, Pair e, const float* a_prev, std::uint8_t* bits, std::size_t n,
                          Reduction out, void* workspace, cudaStream_t stream) {
  const int blocks = blocks_for(n);
  auto* partial = static_cast<double*>(workspace);
  worker_kernel<<<blocks, kThreads, 0, stream>>>(x, dtype, e, a_prev, bits, n, partial);
  finish_kernel<<<1, kThreads, 0, stream>>>(partial, blocks, n, out);
  return cudaGetLastError();
}

template <typename Pair>
cudaError_t launch_server(const std::uint8_t* const* bits, const float* scales, int ranks, float inv_ranks, Pair s,
                          const float* b_prev, std::uint8_t* bits_out, std::size_t n, Reduction out, void* workspace,
                          cudaStream_t stream) {
  const int blocks = blocks_for(n);
  auto* partial = static_cast<double*>(workspace);
  server_kernel<<<blocks, kThreads, 0, stream>>>(bits, scales, ranks, inv_ranks, s, b_prev, bits_out, n, partial);
  finish_kernel<<<1, kThreads, 0, stream>>>(partial, blocks, n, out);
  return cudaGetLastError();
}

}  // namespace

cudaError_t revert_unless_finite(const float* worker_scales, const float* server_scales, int ranks,
                                 const Revert& revert, cudaStream_t stream) {
  const RevertScales scales{
      revert.saved_scales, revert.worker_scale, revert.server_scale, revert.verdict, revert.failures, nullptr, nullptr};
  return launch_revert(worker_scales, server_scales, ranks, scales, FixedPair{revert.e_prev, revert.e_next}, revert.n,
                       FixedPair{revert.s_prev, revert.s_next}, revert.server_n, stream);
}

cudaError_t revert_unless_finite(const float* worker_scales, const float* server_scales, int ranks,
                                 const ParityRevert& revert, cudaStream_t stream) {
  const RevertScales scales{revert.saved_scales, revert.worker_scale,    revert.server_scale, revert.verdict,
                            revert.failures,     revert.settings_differ, revert.mismatches};
  return launch_revert(worker_scales, server_scales, ranks, scales, ParityPair{revert.worker}, revert.n,
                       ParityPair{revert.server}, revert.server_n, stream);
}

cudaError_t store_digest(std::uint64_t* slot, std::uint64_t digest, cudaStream_t stream) {
  store_digest_kernel<<<1, 1, 0, stream>>>(slot, digest);
  return cudaGetLastError();
}

cudaError_t poison_unless_settings_agree(const std::uint64_t* digests, int ranks, float* worker_scales, int* differ,
                                         cudaStream_t stream) {
  settings_kernel<<<1, 1, 0, stream>>>(digests, ranks, worker_scales, differ);
  return cudaGetLastError();
}

cudaError_t finish_call(int* parity, unsigned long long* completed, cudaStream_t stream) {
  finish_call_kernel<<<1, 1, 0, stream>>>(parity, completed);
  return cudaGetLastError();
}

std::size_t workspace_bytes(std::size_t n) { return static_cast<std::size_t>(blocks_for(n)) * sizeof(double); }

cudaError_t worker_pass(const void* x, Dtype dtype, const float* e_prev, const float* a_prev, float* e_next,
                        std::uint8_t* bits, std::size_t n, Reduction out, void* workspace, cudaStream_t stream) {
  return launch_worker(x, dtype, FixedPair{e_prev, e_next}, a_prev, bits, n, out, workspace, stream);
}

cudaError_t worker_pass(const void* x, Dtype dtype, const ErrorBuffers& e, const float* a_prev, std::uint8_t* bits,
                        std::size_t n, Reduction out, void* workspace, cudaStream_t stream) {
  return launch_worker(x, dtype, ParityPair{e}, a_prev, bits, n, out, workspace, stream);
}

cudaError_t server_pass(const std::uint8_t* const* bits, const float* scales, int ranks, float inv_ranks,
                        const float* s_prev, const float* b_prev, float* s_next, std::uint8_t* bits_out, std::size_t n,
                        Reduction out, void* workspace, cudaStream_t stream) {
  return launch_server(bits, scales, ranks, inv_ranks, FixedPair{s_prev, s_next}, b_prev, bits_out, n, out, workspace,
                       stream);
}

cudaError_t server_pass(const std::uint8_t* const* bits, const float* scales, int ranks, float inv_ranks,
                        const ErrorBuffers& s, const float* b_prev, std::uint8_t* bits_out, std::size_t n,
                        Reduction out, void* workspace, cudaStream_t stream) {
  return launch_server(bits, scales, ranks, inv_ranks, ParityPair{s}, b_prev, bits_out, n, out, workspace, stream);
}

cudaError_t unpack(const std::uint8_t* bits, const float* scale, float factor, void* out, Dtype dtype, std::size_t n,
                   cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  unpack_kernel<<<blocks_for(n), kThreads, 0, stream>>>(bits, scale, factor, out, dtype, n);
  return cudaGetLastError();
}

}  // namespace onebit::kernels::cuda
