// The optimizers' device steps (onebit_adam_*_device, optim/cuda) against the C core on the CPU,
// their oracle: random arrays with dormant elements (v = 0), tiny variances (clipped directions),
// weight decay and odd sizes; every element of every array bit-identical after each step. Also
// the refusals: host memory where device memory is due, an m_before overlapping m, a bad config.
// Skips, saying so, where no CUDA device is present; tools/gpu-check.sh runs it on a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "onebit/onebit.h"

namespace onebit::optim {
namespace {

bool have_device() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

// A float array on the device, copied from and back to the host.
struct OnDevice {
  float* ptr = nullptr;
  std::size_t n;
  explicit OnDevice(const std::vector<float>& host) : n(host.size()) {
    EXPECT_EQ(cudaMalloc(&ptr, std::max<std::size_t>(1, n) * sizeof(float)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(ptr, host.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~OnDevice() { cudaFree(ptr); }
  std::vector<float> get() const {
    std::vector<float> host(n);
    EXPECT_EQ(cudaMemcpy(host.data(), ptr, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }
};

struct Arrays {
  std::vector<float> p, m, v, g;
};

Arrays random_arrays(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> exponent(-20.0f, 1.0f);
  Arrays a{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n), std::vector<float>(n)};
  for (std::size_t i = 0; i < n; ++i) {
    a.p[i] = normal(rng);
    a.m[i] = normal(rng) * 0.1f;
    a.v[i] = i % 7 == 0 ? 0.0f : std::pow(10.0f, exponent(rng));
    a.g[i] = normal(rng);
  }
  return a;
}

#define SKIP_WITHOUT_GPU()                                               \
  if (!have_device())                                                    \
  GTEST_SKIP() << "no CUDA device here (cudaGetDeviceCount: none); run " \
                  "tools/gpu-check.sh on a GPU machine"

TEST(OptimizerDeviceSteps, EveryAdamStepGivesTheCpuCoresBits) {
  ASSERT_EQ(onebit_device_steps(), 1);
  SKIP_WITHOUT_GPU();
  const onebit_adam_config_t c{0.003f, 0.9f, 0.999f, 1e-8f, 0.01f, 0};
  for (const std::size_t n : {std::size_t{1}, std::size_t{1000}, std::size_t{1} << 20 | 77}) {
    Arrays host = random_arrays(n, static_cast<unsigned>(n));
    OnDevice p(host.p), m(host.m), v(host.v), g(host.g), kept(std::vector<float>(n, -1.0f));
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);

    // Warmup, then a compression-stage step (momentum, keeping the old one; then the update).
    ASSERT_EQ(onebit_adam_warmup_step(&c, host.p.data(), host.m.data(), host.v.data(), host.g.data(), n),
              ONEBIT_SUCCESS);
    ASSERT_EQ(onebit_adam_warmup_step_device(&c, p.ptr, m.ptr, v.ptr, g.ptr, n, stream), ONEBIT_SUCCESS)
        << onebit_last_error();
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(p.get(), host.p) << "warmup params, n " << n;
    EXPECT_EQ(m.get(), host.m) << "warmup m, n " << n;
    EXPECT_EQ(v.get(), host.v) << "warmup v, n " << n;

    std::vector<float> host_kept(n);
    ASSERT_EQ(onebit_adam_momentum_step_keeping(&c, host.m.data(), host_kept.data(), host.g.data(), n), ONEBIT_SUCCESS);
    ASSERT_EQ(onebit_adam_momentum_step_device(&c, m.ptr, kept.ptr, g.ptr, n, stream), ONEBIT_SUCCESS)
        << onebit_last_error();
    ASSERT_EQ(onebit_adam_apply_step(&c, host.p.data(), host.m.data(), host.v.data(), n), ONEBIT_SUCCESS);
    ASSERT_EQ(onebit_adam_apply_step_device(&c, p.ptr, m.ptr, v.ptr, n, stream), ONEBIT_SUCCESS) << onebit_last_error();
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(kept.get(), host_kept) << "kept momentum, n " << n;
    EXPECT_EQ(m.get(), host.m) << "compression-stage m (dormant zeroed), n " << n;
    EXPECT_EQ(p.get(), host.p) << "compression-stage params, n " << n;
    cudaStreamDestroy(stream);
  }
}

TEST(OptimizerDeviceSteps, HostMemoryOverlapAndBadConfigAreRefusedChangingNothing) {
  SKIP_WITHOUT_GPU();
  const onebit_adam_config_t c{0.01f, 0.9f, 0.999f, 1e-8f, 0.0f, 0};
  Arrays host = random_arrays(64, 3);
  OnDevice p(host.p), m(host.m), v(host.v), g(host.g);
  EXPECT_EQ(onebit_adam_apply_step_device(&c, host.p.data(), m.ptr, v.ptr, 64, nullptr), ONEBIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(onebit_last_error()).find("params is not device memory"), std::string::npos)
      << onebit_last_error();
  EXPECT_EQ(onebit_adam_momentum_step_device(&c, m.ptr, m.ptr + 8, g.ptr, 32, nullptr), ONEBIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(onebit_last_error()).find("m_before overlaps m"), std::string::npos) << onebit_last_error();
  const onebit_adam_config_t bad{0.01f, 1.5f, 0.999f, 1e-8f, 0.0f, 0};
  EXPECT_EQ(onebit_adam_warmup_step_device(&bad, p.ptr, m.ptr, v.ptr, g.ptr, 64, nullptr), ONEBIT_INVALID_ARGUMENT);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(p.get(), host.p);
  EXPECT_EQ(m.get(), host.m);
  EXPECT_EQ(v.get(), host.v);
}

}  // namespace
}  // namespace onebit::optim
