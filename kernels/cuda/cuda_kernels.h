// The CUDA compression kernels of docs/algorithm.md: the worker, server and unpack stages over device
// buffers, with the CPU kernels' contracts (kernels/cpu/cpu_kernels.h) — so the scalar CPU kernel
// is their oracle:
//  - bits LSB-first, element i is bit i % 8 of byte i / 8, bit 1 = +1, sign(−0.0) = +1, pad bits 0;
//    a warp's 32 elements give one __ballot_sync word, whose little-endian bytes are that order;
//  - elementwise outputs bit-identical to the scalar kernel: one IEEE operation each in the same
//    order, written with __fadd_rn / __fmul_rn so the compiler cannot fuse them into FMAs;
//  - Σ v² in fp64, per block then summed in block order by one more kernel (deterministic, within
//    the CPU contract's reassociation bound), and the scale sqrt(Σ/n) computed there too: the
//    scale never leaves the device, and the next kernel reads it from device memory.
// Every call is asynchronous on the caller's stream and allocates nothing: the caller gives a
// workspace of workspace_bytes(n) bytes (allocated once, before any graph capture).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/cpu_kernels.h"

namespace onebit::kernels::cuda {

// Device scratch for one call over n elements (the per-block partial sums).
std::size_t workspace_bytes(std::size_t n);

// Where a stage's reduction lands, in device memory.
struct Reduction {
  double* sum_squares;  // Σ v² of the stage's values
  float* scale;         // sqrt(Σ v² / n); 0 for n = 0
};

// A double-buffered error state whose current buffer is chosen on the device: a call reads
// buffer[*parity] and writes buffer[1 − *parity], and finish_call, the call's last kernel, makes
// what it wrote current. So a call captured in a CUDA graph replays correctly — each replay reads
// what the one before it wrote — with no host step between replays. The entry points taking
// ErrorBuffers are the pointer ones with the pair chosen there; the pointer ones are what the
// tests hold against the scalar oracle.
struct ErrorBuffers {
  float* buffer[2];
  const int* parity;
};

// y = x + (e_prev − a_prev·sign(e_prev)); e_next = y; bits = sign bits of y. a_prev is read from
// device memory (the previous call's scale, where the last call left it).
cudaError_t worker_pass(const void* x, Dtype dtype, const float* e_prev, const float* a_prev, float* e_next,
                        std::uint8_t* bits, std::size_t n, Reduction out, void* workspace, cudaStream_t stream);
cudaError_t worker_pass(const void* x, Dtype dtype, const ErrorBuffers& e, const float* a_prev, std::uint8_t* bits,
                        std::size_t n, Reduction out, void* workspace, cudaStream_t stream);

// z = (Σ_r ±scales[r])·inv_ranks + (s_prev − b_prev·sign(s_prev)), ranks summed in order from 0;
// bits is a device array of `ranks` device pointers, scales a device array of ranks floats.
// inv_ranks is 1.0f / ranks as the host computes it.
cudaError_t server_pass(const std::uint8_t* const* bits, const float* scales, int ranks, float inv_ranks,
                        const float* s_prev, const float* b_prev, float* s_next, std::uint8_t* bits_out, std::size_t n,
                        Reduction out, void* workspace, cudaStream_t stream);
cudaError_t server_pass(const std::uint8_t* const* bits, const float* scales, int ranks, float inv_ranks,
                        const ErrorBuffers& s, const float* b_prev, std::uint8_t* bits_out, std::size_t n,
                        Reduction out, void* workspace, cudaStream_t stream);

// out[i] = bit i ? s : −s with s = (*scale)·factor, in dtype (fp16/bf16 rounded to nearest even).
cudaError_t unpack(const std::uint8_t* bits, const float* scale, float factor, void* out, Dtype dtype, std::size_t n,
                   cudaStream_t stream);

// What a call replaced, for revert_unless_finite: both error buffers of this rank, and the two
// scales it owns as they were before the call (saved_scales[0] the worker's, [1] the server's).
struct Revert {
  const float* e_prev;
  float* e_next;
  std::size_t n;
  const float* s_prev;
  float* s_next;
  std::size_t server_n;
  const float* saved_scales;
  float* worker_scale;  // where the call left its worker scale (the next call's a_prev)
  float* server_scale;  // likewise b_prev
  int* verdict;         // device scratch: 1 when the call is reverted
  unsigned* failures;   // incremented on every revert (mapped host memory, read by the host later)
};

// The settings digest of this rank's call (what onebit_tag_set_step_settings last set; 0: none)
// into *slot, on the stream. A kernel argument, not a copy from host memory: a later call's digest
// cannot overtake it, and a captured graph keeps the digest of the call it captured.
cudaError_t store_digest(std::uint64_t* slot, std::uint64_t digest, cudaStream_t stream);

// After the worker exchange, before the server pass (one thread): whether every rank's digest
// (`ranks` of them, each rank's own from store_digest, exchanged with the scales) is rank 0's. When
// one is not, *differ = 1 and every worker scale becomes NaN: the server pass, the results and the
// output are then non-finite on every rank alike — every rank holds every digest —, and
// revert_unless_finite keeps the state and counts the call as a mismatch, not a failure. Else
// *differ = 0.
cudaError_t poison_unless_settings_agree(const std::uint64_t* digests, int ranks, float* worker_scales, int* differ,
                                         cudaStream_t stream);

// docs/algorithm.md's non-finite rule on the device, where the host cannot look without a sync: after a
// call's unpack, if any of the `ranks` worker scales or server scales (device arrays) is NaN or Inf —
// some rank's input held one, and every rank sees the same scales — the call must change no state:
// e_next ← e_prev, s_next ← s_prev, the owned scales back to saved_scales, ++*failures. Otherwise
// nothing. Its output is then non-finite on every rank (the scales are), like NCCL's own allreduce
// of a NaN, and the next call starts from the state before it. Two kernels: the verdict, then the
// copy, which returns at once when the verdict is "finite".
cudaError_t revert_unless_finite(const float* worker_scales, const float* server_scales, int ranks,
                                 const Revert& revert, cudaStream_t stream);

// The same over parity-chosen buffers: "prev" and "next" are buffer[*parity] and the other.
struct ParityRevert {
  ErrorBuffers worker;
  std::size_t n;
  ErrorBuffers server;
  std::size_t server_n;
  const float* saved_scales;
  float* worker_scale;
  float* server_scale;
  int* verdict;
  unsigned* failures;
  const int* settings_differ = nullptr;  // poison_unless_settings_agree's verdict, or none
  unsigned* mismatches = nullptr;        // counts the reverts it caused instead of `failures`
};
cudaError_t revert_unless_finite(const float* worker_scales, const float* server_scales, int ranks,
                                 const ParityRevert& revert, cudaStream_t stream);

// A call's last kernel (one thread): *parity = 1 − *parity, so that what the call wrote (or
// restored) is what the next call reads, and ++*completed (mapped host memory: the calls that ran
// on the device, replays of a captured graph included).
cudaError_t finish_call(int* parity, unsigned long long* completed, cudaStream_t stream);

}  // namespace onebit::kernels::cuda
