// onebit-cuda-bench: each CUDA kernel's memory traffic per second against a device-to-device copy,
// measured side by side on the same GPU (issue 6's goal: ≥ 0.8 of the copy's rate). Inputs are random
// (normal values, random bits and positive scales), each rate is the median of kRepetitions timings
// of kLaunches launches, and each kernel's line says whether it meets the goal. Exit 0: every kernel
// does; 3: one or more does not; 77: no CUDA device.
//
//   build/release/tools/onebit-cuda-bench [elements, default 64 Mi] [ranks, default 4]
//
// Bytes counted per kernel: worker reads x and e_prev, writes e_next and the bits; server reads
// `ranks` bit arrays and s_prev, writes s_next and its bits; unpack reads bits, writes the output.
// A copy of B bytes moves 2B (read + write).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/half.h"
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

constexpr int kRepetitions = 7;
constexpr int kLaunches = 10;
constexpr double kGoal = 0.8;

// The median over kRepetitions of the mean time of kLaunches launches, after one warm-up launch.
template <typename F>
double seconds_per_call(F&& launch) {
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  launch();  // warm-up
  std::vector<double> seconds;
  for (int repetition = 0; repetition < kRepetitions; ++repetition) {
    CHECK(cudaEventRecord(start));
    for (int i = 0; i < kLaunches; ++i) launch();
    CHECK(cudaEventRecord(stop));
    CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    seconds.push_back(ms / 1e3 / kLaunches);
  }
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

// Random contents for `bytes` bytes of `device`: normal values of `dtype`, or random bytes (null).
void fill_random(void* device, std::size_t bytes, const onebit::kernels::Dtype* dtype, std::uint32_t seed) {
  using namespace onebit::kernels;
  std::mt19937 engine(seed);
  std::normal_distribution<float> normal;
  std::vector<std::uint8_t> host(bytes);
  const std::size_t size = dtype == nullptr ? 1 : dtype_size(*dtype);
  for (std::size_t i = 0; i + size <= bytes; i += size) {
    if (dtype == nullptr) {
      host[i] = static_cast<std::uint8_t>(engine());
    } else if (*dtype == Dtype::kFloat32) {
      const float v = normal(engine);
      std::memcpy(&host[i], &v, 4);
    } else {
      const std::uint16_t v =
          *dtype == Dtype::kFloat16 ? float_to_half(normal(engine)) : float_to_bfloat16(normal(engine));
      std::memcpy(&host[i], &v, 2);
    }
  }
  CHECK(cudaMemcpy(device, host.data(), bytes, cudaMemcpyHostToDevice));
}

// Device memory for the run, freed at its end.
std::vector<void*> owned;
template <typename T>
void device_alloc(T** pointer, std::size_t bytes) {
  CHECK(cudaMalloc(pointer, bytes));
  owned.push_back(const_cast<void*>(static_cast<const void*>(*pointer)));
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
  float *x, *e_prev, *e_next, *s_prev, *s_next, *scales, *scale;
  double* sum;
  std::uint8_t *bits, *bits_out, *workspace, *copy_src, *copy_dst;
  const std::size_t chunk = n / ranks;
  device_alloc(&x, n * 4);
  device_alloc(&e_prev, n * 4);
  device_alloc(&e_next, n * 4);
  device_alloc(&s_prev, chunk * 4);
  device_alloc(&s_next, chunk * 4);
  device_alloc(&scales, ranks * 4);
  device_alloc(&scale, 4);
  device_alloc(&sum, 8);
  device_alloc(&bits, packed_bytes(n) + 64);
  device_alloc(&bits_out, packed_bytes(chunk) + 64);
  device_alloc(&workspace, cuda::workspace_bytes(n));
  device_alloc(&copy_src, n * 4);
  device_alloc(&copy_dst, n * 4);
  const Dtype fp32 = Dtype::kFloat32;
  fill_random(e_prev, n * 4, &fp32, 2);
  fill_random(s_prev, chunk * 4, &fp32, 3);
  fill_random(bits, packed_bytes(n) + 64, nullptr, 4);
  fill_random(copy_src, n * 4, nullptr, 5);
  const std::vector<float> positive_scales(ranks, 0.75f);
  CHECK(cudaMemcpy(scales, positive_scales.data(), ranks * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(scale, positive_scales.data(), 4, cudaMemcpyHostToDevice));
  std::vector<const std::uint8_t*> rank_bits(ranks);
  for (int r = 0; r < ranks; ++r) rank_bits[r] = bits + r * packed_bytes(chunk);
  const std::uint8_t** device_rank_bits;
  device_alloc(&device_rank_bits, ranks * sizeof(void*));
  CHECK(cudaMemcpy(device_rank_bits, rank_bits.data(), ranks * sizeof(void*), cudaMemcpyHostToDevice));
  const cuda::Reduction out{sum, scale};

  const double copy_s =
      seconds_per_call([&] { CHECK(cudaMemcpyAsync(copy_dst, copy_src, n * 4, cudaMemcpyDeviceToDevice)); });
  const double copy_rate = 2.0 * n * 4 / copy_s;
  struct Row {
    const char* name;
    double bytes, seconds;
  };
  std::vector<Row> rows;
  for (Dtype dtype : {Dtype::kFloat32, Dtype::kFloat16, Dtype::kBFloat16}) {
    fill_random(x, n * dtype_size(dtype), &dtype, 1);  // the worker's input, as this dtype
    const double s = seconds_per_call(
        [&] { CHECK(cuda::worker_pass(x, dtype, e_prev, scale, e_next, bits, n, out, workspace, nullptr)); });
    rows.push_back({dtype == Dtype::kFloat32   ? "worker fp32"
                    : dtype == Dtype::kFloat16 ? "worker fp16"
                                               : "worker bf16",
                    n * (dtype_size(dtype) + 8.0 + 0.125), s});
  }
  const double server_s = seconds_per_call([&] {
    CHECK(cuda::server_pass(device_rank_bits, scales, ranks, 1.0f / ranks, s_prev, scale, s_next, bits_out, chunk, out,
                            workspace, nullptr));
  });
  rows.push_back({"server (one chunk)", chunk * (ranks * 0.125 + 8.0 + 0.125), server_s});
  for (Dtype dtype : {Dtype::kFloat32, Dtype::kFloat16}) {
    const double s = seconds_per_call([&] { CHECK(cuda::unpack(bits, scale, 4.0f, e_next, dtype, n, nullptr)); });
    rows.push_back({dtype == Dtype::kFloat32 ? "unpack fp32" : "unpack fp16", n * (0.125 + dtype_size(dtype)), s});
  }
  std::printf(
      "# onebit-cuda-bench on %s: %zu elements, %d ranks, random inputs, median of %d x %d launches; "
      "device-to-device copy %.1f GB/s (read + write)\n",
      prop.name, n, ranks, kRepetitions, kLaunches, copy_rate / 1e9);
  std::printf("# %-20s %10s %10s %12s\n", "kernel", "time(us)", "GB/s", "÷ copy rate");
  int below = 0;
  for (const Row& r : rows) {
    const double rate = r.bytes / r.seconds, ratio = rate / copy_rate;
    below += ratio < kGoal;
    std::printf("  %-20s %10.1f %10.1f %12.2f  %s (goal >= %.1f)\n", r.name, r.seconds * 1e6, rate / 1e9, ratio,
                ratio >= kGoal ? "pass" : "FAIL", kGoal);
  }
  for (void* p : owned) CHECK(cudaFree(p));
  return below == 0 ? 0 : 3;
}
