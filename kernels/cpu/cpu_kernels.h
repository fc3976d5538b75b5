// The CPU compression kernels of docs/algorithm.md, one chunk at a time.
//
// Contracts shared by every kernel set (scalar, avx2, avx512):
//  - Bits are packed LSB-first: element i of a call is bit (i % 8) of bits[i / 8]; bit 1 means +1.
//    The pad bits of the last byte are 0. sign(v) = +1 for v >= 0, including -0.0.
//  - Any n, any pointer alignment. A pipeline calls a kernel per chunk; chunks start at multiples
//    of 8 elements, so a chunk's bits start on a byte.
//  - The error buffers hold the one-pass form of docs/algorithm.md: a stored value `stored` of the
//    previous call and the scale `scale` that call sent; the true error is
//    stored − scale·sign(stored). Zeros and scale 0 are the initial (zero) error. A kernel reads the
//    previous stored value and writes the new one to a *separate* output, so the caller can keep the
//    old state when the call fails (non-finite scale, a dead peer) — commit by swapping buffers.
//    In-place (next == prev) is allowed and works: each element is read before it is written.
//  - Sums of squares are accumulated in fp64, in blocks of kSumBlock elements whose partial sums
//    are added to an fp64 total. The relative error is about (kSumBlock + n / kSumBlock)·2^-53,
//    3e-11 at n = 10^9, and the sum is only finite if every input and error element is finite —
//    so a non-finite result is how a kernel reports NaN/Inf in its input.
//  - Elementwise outputs (stored values, bits, unpacked values) are bit-identical across kernel
//    sets: each is one IEEE operation in a fixed order (kernels build with -ffp-contract=off).
//    Only the fp64 sums differ, by reassociation, within the bound above.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace onebit::kernels {

enum class Dtype : std::uint8_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

constexpr std::size_t dtype_size(Dtype dtype) { return dtype == Dtype::kFloat32 ? 4 : 2; }
const char* dtype_name(Dtype dtype);

// Bytes that hold the sign bits of n elements.
constexpr std::size_t packed_bytes(std::size_t n) { return (n + 7) / 8; }

constexpr std::size_t kSumBlock = 4096;

// The scale of docs/algorithm.md: ||v||_2 / sqrt(n), from Σ v². 0 for n = 0.
inline float scale_from_sum_squares(double sum_squares, std::size_t n) {
  return n == 0 ? 0.0f : static_cast<float>(std::sqrt(sum_squares / static_cast<double>(n)));
}

struct CpuKernels {
  const char* name;  // "scalar", "avx2", "avx512"

  // Worker stage: y = x + e with e = e_prev − a_prev·sign(e_prev); writes y to e_next and the sign
  // bits of y to bits. x has the given dtype (fp16/bf16 converted exactly to fp32). Returns Σ y².
  double (*worker_pass)(const void* x, Dtype dtype, const float* e_prev, float a_prev, float* e_next,
                        std::uint8_t* bits, std::size_t n);

  // Σ (x + e)², e as in worker_pass; writes nothing. For a two-pass caller and for checks.
  double (*norm_pass)(const void* x, Dtype dtype, const float* e_prev, float a_prev, std::size_t n);

  // Server stage over one chunk: z = (Σ_r ±scales[r]) · (1/ranks) + s, summed in rank order, where
  // ±scales[r] takes its sign from bits[r] and s = s_prev − b_prev·sign(s_prev). Writes z to s_next
  // and its sign bits to bits_out. Returns Σ z².
  double (*server_pass)(const std::uint8_t* const* bits, const float* scales, int ranks, const float* s_prev,
                        float b_prev, float* s_next, std::uint8_t* bits_out, std::size_t n);

  // out[i] = bit i ? scale : −scale, written in dtype (fp16/bf16 rounded to nearest even).
  void (*unpack)(const std::uint8_t* bits, float scale, void* out, Dtype dtype, std::size_t n);

  // out[i] += bit i ? scale : −scale (fp32).
  void (*unpack_accumulate)(const std::uint8_t* bits, float scale, float* out, std::size_t n);
  // worker_pass on the mean of `sources` fp32 inputs (the hierarchical host mean), without writing
  // it: x[i] = ((x[0][i] + x[1][i]) + … + x[sources−1][i]) / sources, added left to right (x[0][i]
  // / 1 for one source), each one IEEE operation; then exactly worker_pass's y, bits and Σ y².
  double (*mean_worker_pass)(const float* const* x, int sources, const float* e_prev, float a_prev, float* e_next,
                             std::uint8_t* bits, std::size_t n);
};

// The scalar kernels: the oracle every other set is tested against. Always available.
const CpuKernels& scalar_kernels();

// Whether this CPU runs a kernel set, by name ("scalar", "avx2", "avx512"); false for unknown names
// and for sets this build did not compile.
bool cpu_runs(const std::string& name);

// The kernel set with this name; "" picks the best this CPU runs. Throws onebit::Error
// (ONEBIT_INVALID_ARGUMENT) naming the set and what the CPU lacks when it cannot run here.
const CpuKernels& select_cpu_kernels(const std::string& name);

// The kernel set in force: select_cpu_kernels(ONEBIT_SIMD), chosen once and logged at INFO.
const CpuKernels& cpu_kernels();

// The CPU's model as its maker names it (CPUID's brand string), for benchmarks and logs: every
// figure names the CPU it ran on. "unknown CPU" where CPUID has none.
std::string cpu_model();

// Every set this CPU runs, scalar first.
std::vector<const CpuKernels*> runnable_cpu_kernels();

// The true error of a one-pass stored value: out[i] = stored[i] − scale·sign(stored[i]).
// For checkpoints, which save the error itself.
void materialize_error(const float* stored, float scale, float* out, std::size_t n);

}  // namespace onebit::kernels
