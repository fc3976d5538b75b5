// onebit-cuda-bench: each CUDA kernel's memory traffic per second against a device-to-device copy,
// measured side by side on the same GPU (issue 6's goal: ≥ 0.8 of the copy's rate).
//
//   build/release/tools/onebit-cuda-bench [elements, default 64 Mi] [ranks, default 4]
//
// Bytes counted per kernel: worker reads x and e_prev, writes e_next and the bits; server reads
// `ranks` bit arrays and s_prev, writes s_next and its bits; unpack reads bits, writes the output.
// A copy of B bytes moves 2B (read + write).
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/cuda/cuda_kernels.h"

namespace {

#define CHECK(call)                                                                             \
  do {                                                                                          \
    cudaError_t e = (call);                                                                     \
    if (e != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e)); \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)

template <typename F>
double seconds_per_call(F&& launch, int reps) {
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  launch();  // warm-up
  CHECK(cudaEventRecord(start));
  for (int i = 0; i < reps; ++i) launch();
  CHECK(cudaEventRecord(stop));
  CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, start, stop));
  return ms / 1e3 / reps;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace onebit::kernels;
  const std::size_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : (std::size_t{64} << 20);
  const int ranks = argc > 2 ? std::atoi(argv[2]) : 4;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("onebit-cuda-bench: no CUDA device; nothing measured\n");
    return 77;
  }
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  const int reps = 20;
  float *x, *e_prev, *e_next, *s_prev, *s_next, *scales, *scale;
  double* sum;
  std::uint8_t *bits, *bits_out, *workspace, *copy_src, *copy_dst;
  const std::size_t chunk = n / ranks;
  CHECK(cudaMalloc(&x, n * 4));
  CHECK(cudaMalloc(&e_prev, n * 4));
  CHECK(cudaMalloc(&e_next, n * 4));
  CHECK(cudaMalloc(&s_prev, chunk * 4));
  CHECK(cudaMalloc(&s_next, chunk * 4));
  CHECK(cudaMalloc(&scales, ranks * 4));
  CHECK(cudaMalloc(&scale, 4));
  CHECK(cudaMalloc(&sum, 8));
  CHECK(cudaMalloc(&bits, packed_bytes(n) + 64));
  CHECK(cudaMalloc(&bits_out, packed_bytes(chunk) + 64));
  CHECK(cudaMalloc(&workspace, cuda::workspace_bytes(n)));
  CHECK(cudaMalloc(&copy_src, n * 4));
  CHECK(cudaMalloc(&copy_dst, n * 4));
  CHECK(cudaMemset(x, 0, n * 4));
  CHECK(cudaMemset(e_prev, 0, n * 4));
  CHECK(cudaMemset(s_prev, 0, chunk * 4));
  CHECK(cudaMemset(scales, 0, ranks * 4));
  CHECK(cudaMemset(scale, 0, 4));
  std::vector<const std::uint8_t*> rank_bits(ranks);
  for (int r = 0; r < ranks; ++r) rank_bits[r] = bits + r * packed_bytes(chunk);
  const std::uint8_t** device_rank_bits;
  CHECK(cudaMalloc(&device_rank_bits, ranks * sizeof(void*)));
  CHECK(cudaMemcpy(device_rank_bits, rank_bits.data(), ranks * sizeof(void*), cudaMemcpyHostToDevice));
  const cuda::Reduction out{sum, scale};

  const double copy_s =
      seconds_per_call([&] { CHECK(cudaMemcpyAsync(copy_dst, copy_src, n * 4, cudaMemcpyDeviceToDevice)); }, reps);
  const double copy_rate = 2.0 * n * 4 / copy_s;
  struct Row {
    const char* name;
    double bytes, seconds;
  };
  std::vector<Row> rows;
  for (Dtype dtype : {Dtype::kFloat32, Dtype::kFloat16, Dtype::kBFloat16}) {
    const double s = seconds_per_call(
        [&] { CHECK(cuda::worker_pass(x, dtype, e_prev, scale, e_next, bits, n, out, workspace, nullptr)); }, reps);
    rows.push_back({dtype == Dtype::kFloat32   ? "worker fp32"
                    : dtype == Dtype::kFloat16 ? "worker fp16"
                                               : "worker bf16",
                    n * (dtype_size(dtype) + 8.0 + 0.125), s});
  }
  const double server_s = seconds_per_call(
      [&] {
        CHECK(cuda::server_pass(device_rank_bits, scales, ranks, 1.0f / ranks, s_prev, scale, s_next, bits_out, chunk,
                                out, workspace, nullptr));
      },
      reps);
  rows.push_back({"server (one chunk)", chunk * (ranks * 0.125 + 8.0 + 0.125), server_s});
  for (Dtype dtype : {Dtype::kFloat32, Dtype::kFloat16}) {
    const double s = seconds_per_call([&] { CHECK(cuda::unpack(bits, scale, 4.0f, e_next, dtype, n, nullptr)); }, reps);
    rows.push_back({dtype == Dtype::kFloat32 ? "unpack fp32" : "unpack fp16", n * (0.125 + dtype_size(dtype)), s});
  }
  std::printf("# onebit-cuda-bench on %s: %zu elements, %d ranks; device-to-device copy %.1f GB/s (read + write)\n",
              prop.name, n, ranks, copy_rate / 1e9);
  std::printf("# %-20s %10s %10s %12s\n", "kernel", "time(us)", "GB/s", "÷ copy rate");
  for (const Row& r : rows) {
    const double rate = r.bytes / r.seconds;
    std::printf("  %-20s %10.1f %10.1f %12.2f\n", r.name, r.seconds * 1e6, rate / 1e9, rate / copy_rate);
  }
  return 0;
}
