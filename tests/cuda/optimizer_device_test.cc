// The optimizers' device steps (onebit_adam_*_device, optim/cuda) against the C core on the CPU,
// their oracle: random arrays with dormant elements (v = 0), tiny variances (clipped directions),
// weight decay and odd sizes; every element of every array bit-identical after each step. Also
// the refusals: host memory where device memory is due, an m_before overlapping m, a bad config,
// a 0/1 Adam sync with no learning rate summed, a LAMB workspace too small. 0/1 Adam's four steps
// and 1-bit LAMB's five likewise (LAMB's layer scalars too), and the measurements' device twins.
// Skips, saying so, where no CUDA device is present; tools/gpu-check.sh runs it on a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
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

// The arrays' bits: equal bits, not equal values (+0 and -0 differ; a NaN equals its own bits).
std::vector<std::uint32_t> bits(const std::vector<float>& values) {
  std::vector<std::uint32_t> out(values.size());
  std::memcpy(out.data(), values.data(), values.size() * sizeof(float));
  return out;
}

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
    a.g[i] = i % 7 == 0 ? 0.0f : normal(rng);  // no gradient: these stay dormant through warmup steps
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
    EXPECT_EQ(bits(p.get()), bits(host.p)) << "warmup params, n " << n;
    EXPECT_EQ(bits(m.get()), bits(host.m)) << "warmup m, n " << n;
    EXPECT_EQ(bits(v.get()), bits(host.v)) << "warmup v, n " << n;

    std::vector<float> host_kept(n);
    ASSERT_EQ(onebit_adam_momentum_step_keeping(&c, host.m.data(), host_kept.data(), host.g.data(), n), ONEBIT_SUCCESS);
    ASSERT_EQ(onebit_adam_momentum_step_device(&c, m.ptr, kept.ptr, g.ptr, n, stream), ONEBIT_SUCCESS)
        << onebit_last_error();
    ASSERT_EQ(onebit_adam_apply_step(&c, host.p.data(), host.m.data(), host.v.data(), n), ONEBIT_SUCCESS);
    ASSERT_EQ(onebit_adam_apply_step_device(&c, p.ptr, m.ptr, v.ptr, n, stream), ONEBIT_SUCCESS) << onebit_last_error();
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(bits(kept.get()), bits(host_kept)) << "kept momentum, n " << n;
    EXPECT_EQ(bits(m.get()), bits(host.m)) << "compression-stage m (dormant zeroed), n " << n;
    EXPECT_EQ(bits(p.get()), bits(host.p)) << "compression-stage params, n " << n;
    cudaStreamDestroy(stream);
  }
}

// 0/1 Adam's four steps in the order of its stages: a variance step and a compressed step of the
// variance stage, two local steps, and a sync (its begin, then its end with the "averaged" u —
// here u itself), each array equal to the CPU core's bits after each; the host lrs alike.
TEST(OptimizerDeviceSteps, EveryZeroOneAdamStepGivesTheCpuCoresBits) {
  ASSERT_EQ(onebit_device_steps(), 1);
  SKIP_WITHOUT_GPU();
  const onebit_zero_one_adam_config_t c{0.003f, 0.9f, 0.999f, 1e-8f, 0.01f, 2, 2, 2, 4};
  for (const std::size_t n : {std::size_t{1}, std::size_t{1000}, std::size_t{1} << 20 | 77}) {
    Arrays host = random_arrays(n, static_cast<unsigned>(n) + 1);
    std::vector<float> host_u(n, 0.0f), host_sync = host.p;
    OnDevice p(host.p), m(host.m), v(host.v), g(host.g), u(host_u), p_sync(host_sync);
    float host_lrs = 0.0f, lrs = 0.0f;
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
    const auto expect_equal = [&](const char* after) {
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      EXPECT_EQ(bits(p.get()), bits(host.p)) << "params after " << after << ", n " << n;
      EXPECT_EQ(bits(m.get()), bits(host.m)) << "m after " << after << ", n " << n;
      EXPECT_EQ(bits(v.get()), bits(host.v)) << "v after " << after << ", n " << n;
      EXPECT_EQ(bits(u.get()), bits(host_u)) << "u after " << after << ", n " << n;
      EXPECT_EQ(bits(p_sync.get()), bits(host_sync)) << "params_at_sync after " << after << ", n " << n;
      EXPECT_EQ(lrs, host_lrs) << "lrs after " << after;
    };
    for (const int update_variance : {1, 0}) {
      ASSERT_EQ(onebit_zero_one_adam_gradient_step(&c, host.p.data(), host.m.data(), host.v.data(), host.g.data(), n,
                                                   update_variance),
                ONEBIT_SUCCESS);
      ASSERT_EQ(onebit_zero_one_adam_gradient_step_device(&c, p.ptr, m.ptr, v.ptr, g.ptr, n, update_variance, stream),
                ONEBIT_SUCCESS)
          << onebit_last_error();
      expect_equal(update_variance ? "a variance step" : "a compressed step");
    }
    for (int local = 0; local < 2; ++local) {
      ASSERT_EQ(onebit_zero_one_adam_local_step(&c, host.p.data(), host.m.data(), host.v.data(), host_u.data(),
                                                &host_lrs, host.g.data(), n),
                ONEBIT_SUCCESS);
      ASSERT_EQ(onebit_zero_one_adam_local_step_device(&c, p.ptr, m.ptr, v.ptr, u.ptr, &lrs, g.ptr, n, stream),
                ONEBIT_SUCCESS)
          << onebit_last_error();
      expect_equal("a local step");
    }
    ASSERT_EQ(onebit_zero_one_adam_sync_begin(&c, host_u.data(), host.v.data(), host_lrs, n), ONEBIT_SUCCESS);
    ASSERT_EQ(onebit_zero_one_adam_sync_begin_device(&c, u.ptr, v.ptr, lrs, n, stream), ONEBIT_SUCCESS)
        << onebit_last_error();
    expect_equal("a sync's begin");
    ASSERT_EQ(onebit_zero_one_adam_sync_end(&c, host.p.data(), host_sync.data(), host.m.data(), host_u.data(),
                                            host.v.data(), &host_lrs, n),
              ONEBIT_SUCCESS);
    ASSERT_EQ(onebit_zero_one_adam_sync_end_device(&c, p.ptr, p_sync.ptr, m.ptr, u.ptr, v.ptr, &lrs, n, stream),
              ONEBIT_SUCCESS)
        << onebit_last_error();
    expect_equal("a sync's end");
    cudaStreamDestroy(stream);
  }
}

void expect_same_layers(const std::vector<onebit_lamb_layer_t>& got, const std::vector<onebit_lamb_layer_t>& want,
                        const char* after) {
  for (std::size_t j = 0; j < want.size(); ++j) {
    EXPECT_EQ(got[j].coeff_freeze, want[j].coeff_freeze) << "layer " << j << " after " << after;
    EXPECT_EQ(got[j].last_factor, want[j].last_factor) << "layer " << j << " after " << after;
    EXPECT_EQ(got[j].scaling_coeff, want[j].scaling_coeff) << "layer " << j << " after " << after;
    EXPECT_EQ(got[j].lamb_coeff, want[j].lamb_coeff) << "layer " << j << " after " << after;
  }
}

// 1-bit LAMB's device steps through a whole schedule over four layers (empty, one element, one
// tile and a bit, many tiles; the last with its own lr and weight decay): warmup steps (the last
// copies v into v_fresh), the scaling coefficients, then compression steps (momentum; the
// "average" is the momentum itself; apply). Every array and every layer's fp64 scalars equal the
// CPU core's, bit for bit: the norms are summed in one order on both (optim/tiled_sums.h). The
// host steps go layer by layer; the device ones take all layers at once.
TEST(OptimizerDeviceSteps, EveryLambStepGivesTheCpuCoresBits) {
  ASSERT_EQ(onebit_device_steps(), 1);
  SKIP_WITHOUT_GPU();
  // Trust ratios and factors far from every clamp (min_coeff 1e-9, max_coeff 1e9, factor within
  // [0.5, 4]), so that the fp64 norms decide the coefficients' bits: a sum in another order, or
  // another layer's sums, would show. The last layer (513 tiles) has its own lr and weight decay.
  const onebit_lamb_config_t c{0.003f, 0.9f, 0.999f, 1e-8f, 0.01f, 2, 1e9, 1e-9, 0.9, 4.0, 0.5, 0.1};
  onebit_lamb_config_t other = c;
  other.lr = 0.001f;
  other.weight_decay = 0.5f;
  const std::vector<std::size_t> counts = {0, 1, 2048 + 300, (std::size_t{1} << 20) | 77};
  const std::vector<onebit_lamb_config_t> configs = {c, c, c, other};
  std::size_t n = 0;
  for (const std::size_t count : counts) n += count;
  Arrays host = random_arrays(n, 11);
  std::vector<float> host_fresh(n, 0.0f), host_last(n, 0.0f);
  OnDevice p(host.p), m(host.m), v(host.v), g(host.g), fresh(host_fresh), last(host_last);
  std::vector<onebit_lamb_layer_t> host_layers(counts.size()), layers(counts.size());
  for (std::size_t j = 0; j < counts.size(); ++j) {
    ASSERT_EQ(onebit_lamb_layer_init(&host_layers[j]), ONEBIT_SUCCESS);
    layers[j] = host_layers[j];
  }
  const std::size_t workspace_bytes = onebit_lamb_workspace_size(counts.data(), counts.size());
  void* workspace = nullptr;
  ASSERT_EQ(cudaMalloc(&workspace, workspace_bytes + 8), cudaSuccess);  // + 8: room for a misaligned try
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  const auto expect_equal = [&](const char* after) {
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(bits(p.get()), bits(host.p)) << "params after " << after;
    EXPECT_EQ(bits(m.get()), bits(host.m)) << "m after " << after;
    EXPECT_EQ(bits(v.get()), bits(host.v)) << "v after " << after;
    EXPECT_EQ(bits(fresh.get()), bits(host_fresh)) << "v_fresh after " << after;
    EXPECT_EQ(bits(last.get()), bits(host_last)) << "m_last after " << after;
    expect_same_layers(layers, host_layers, after);
  };
  const std::size_t layer_count = counts.size();
  for (std::int64_t step = 0; step < 4; ++step) {
    const bool warmup = step < c.freeze_step;
    if (step == c.freeze_step) {
      ASSERT_EQ(onebit_lamb_scaling_coeffs(host.m.data(), counts.data(), layer_count, host_layers.data()),
                ONEBIT_SUCCESS);
      ASSERT_EQ(onebit_lamb_scaling_coeffs_device(m.ptr, counts.data(), layer_count, layers.data(), workspace,
                                                  workspace_bytes, stream),
                ONEBIT_SUCCESS)
          << onebit_last_error();
      expect_equal("the scaling coefficients");
    }
    std::size_t at = 0;
    for (std::size_t j = 0; j < layer_count; at += counts[j], ++j) {  // the host, and the device's momentum
      const std::size_t k = counts[j];
      float *hp = host.p.data() + at, *hm = host.m.data() + at, *hv = host.v.data() + at;
      float *hf = host_fresh.data() + at, *hl = host_last.data() + at, *hg = host.g.data() + at;
      if (warmup) {
        ASSERT_EQ(onebit_lamb_warmup_step(&configs[j], &host_layers[j], step, hp, hm, hv, hf, hg, k), ONEBIT_SUCCESS);
        continue;
      }
      ASSERT_EQ(onebit_lamb_momentum_step(&configs[j], &host_layers[j], hm, hl, hg, k), ONEBIT_SUCCESS);
      ASSERT_EQ(
          onebit_lamb_momentum_step_device(&configs[j], &layers[j], m.ptr + at, last.ptr + at, g.ptr + at, k, stream),
          ONEBIT_SUCCESS)
          << onebit_last_error();
      ASSERT_EQ(onebit_lamb_apply_step(&configs[j], &host_layers[j], hp, hm, hl, hv, hf, k), ONEBIT_SUCCESS);
    }
    if (warmup) {
      ASSERT_EQ(onebit_lamb_warmup_steps_device(configs.data(), layers.data(), counts.data(), layer_count, step, p.ptr,
                                                m.ptr, v.ptr, fresh.ptr, g.ptr, workspace, workspace_bytes, stream),
                ONEBIT_SUCCESS)
          << onebit_last_error();
    } else {
      ASSERT_EQ(onebit_lamb_apply_steps_device(configs.data(), layers.data(), counts.data(), layer_count, p.ptr, m.ptr,
                                               last.ptr, v.ptr, fresh.ptr, workspace, workspace_bytes, stream),
                ONEBIT_SUCCESS)
          << onebit_last_error();
    }
    expect_equal(warmup ? "a warmup step" : "a compression step");
    for (std::size_t j = 2; j < layer_count; ++j) {  // the clamps did not decide (the test's premise)
      EXPECT_GT(host_layers[j].lamb_coeff, c.min_coeff) << "layer " << j << ", step " << step;
      EXPECT_LT(host_layers[j].lamb_coeff, c.max_coeff) << "layer " << j << ", step " << step;
      if (!warmup) {
        EXPECT_NE(host_layers[j].last_factor, c.factor_max) << "layer " << j << ", step " << step;
      }
    }
  }
  // Too small or misaligned a workspace, or a bad layer, is refused before anything runs, named.
  const std::vector<float> p_before = p.get();
  const auto apply = [&](void* at, std::size_t bytes, const onebit_lamb_layer_t* states) {
    std::vector<onebit_lamb_layer_t> copy(states, states + layer_count);
    return onebit_lamb_apply_steps_device(configs.data(), copy.data(), counts.data(), layer_count, p.ptr, m.ptr,
                                          last.ptr, v.ptr, fresh.ptr, at, bytes, stream);
  };
  EXPECT_EQ(apply(workspace, 8, layers.data()), ONEBIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(onebit_last_error()).find("workspace of 8 bytes is too small"), std::string::npos)
      << onebit_last_error();
  EXPECT_EQ(apply(static_cast<char*>(workspace) + 4, workspace_bytes, layers.data()), ONEBIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(onebit_last_error()).find("is not aligned to 8 bytes"), std::string::npos)
      << onebit_last_error();
  std::vector<onebit_lamb_layer_t> unset = layers;
  unset[2].scaling_coeff = 0;  // never through scaling_coeffs
  EXPECT_EQ(apply(workspace, workspace_bytes, unset.data()), ONEBIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(onebit_last_error()).find("layer 2: 1-bit LAMB layer has scaling_coeff 0"), std::string::npos)
      << onebit_last_error();
  std::vector<onebit_lamb_config_t> bad = configs;
  bad[3].beta1 = 1.5f;
  EXPECT_EQ(onebit_lamb_warmup_steps_device(bad.data(), layers.data(), counts.data(), layer_count, 0, p.ptr, m.ptr,
                                            v.ptr, fresh.ptr, g.ptr, workspace, workspace_bytes, stream),
            ONEBIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(onebit_last_error()).find("layer 3: 1-bit LAMB config out of range"), std::string::npos)
      << onebit_last_error();
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(bits(p.get()), bits(p_before));
  cudaStreamDestroy(stream);
  cudaFree(workspace);
}

// The measurements' device twins — the automatic freeze's variance change and the dormant count —
// against the host calls: the same double, bit for bit (both sum in optim/tiled_sums.h's order),
// and the same count, for a first measurement (v_then all zero: exactly 1), a later one (v_then a
// step behind) and nothing moved (exactly 0), over counts within a tile and across tiles (the
// levels of tiles are the host's own total(), TiledSums.TakeEveryElementOnce). A workspace too small, host memory, and
// a NULL answer are refused, the answer left alone.
TEST(OptimizerDeviceSteps, TheMeasurementsGiveTheCpuCoresAnswers) {
  ASSERT_EQ(onebit_device_steps(), 1);
  SKIP_WITHOUT_GPU();
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  const std::size_t largest = std::size_t{2048} * 37 + 77;  // tiles to fold: the host's total() does the levels
  const std::size_t workspace_bytes = onebit_measure_workspace_size(largest);
  void* workspace = nullptr;
  ASSERT_EQ(cudaMalloc(&workspace, workspace_bytes), cudaSuccess);
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{2048} + 300, largest}) {
    Arrays host = random_arrays(n, static_cast<unsigned>(n) + 7);
    std::vector<float> later = host.v;
    for (std::size_t i = 0; i < n; ++i) later[i] = i % 3 == 0 ? later[i] : later[i] * 3.7f + 1e-3f;
    OnDevice v(host.v), zeros(std::vector<float>(n, 0.0f)), behind(later);
    for (const auto& [then, host_then, what] : {std::tuple{&zeros, std::vector<float>(n, 0.0f), "first"},
                                                std::tuple{&behind, later, "later"}, std::tuple{&v, host.v, "same"}}) {
      double want = -1, got = -2;
      ASSERT_EQ(onebit_adam_variance_change(host.v.data(), host_then.data(), n, &want), ONEBIT_SUCCESS);
      ASSERT_EQ(onebit_adam_variance_change_device(v.ptr, then->ptr, n, workspace, workspace_bytes, &got, stream),
                ONEBIT_SUCCESS)
          << onebit_last_error();
      EXPECT_EQ(std::memcmp(&got, &want, sizeof got), 0) << what << ", n " << n << ": " << got << " vs " << want;
      if (std::string(what) == "first" && n > 1) {  // n = 1: v is [0] (dormant), nothing to move
        EXPECT_EQ(got, 1.0) << "n " << n;
      }
      if (std::string(what) == "same") {
        EXPECT_EQ(got, 0.0) << "n " << n;
      }
    }
    std::size_t want = 0, got = 1;
    ASSERT_EQ(onebit_dormant_count(host.v.data(), n, 1e-8f, &want), ONEBIT_SUCCESS);
    ASSERT_EQ(onebit_dormant_count_device(v.ptr, n, 1e-8f, workspace, workspace_bytes, &got, stream), ONEBIT_SUCCESS)
        << onebit_last_error();
    EXPECT_EQ(got, want) << "n " << n;
    EXPECT_EQ(got > 0, n > 0) << "every 7th element is dormant (v = 0), n " << n;
  }
  // Refusals, before anything runs, the answer unchanged.
  OnDevice v(std::vector<float>(4096, 1.0f));
  std::vector<float> on_host(4096, 1.0f);
  double change = -1;
  EXPECT_EQ(onebit_adam_variance_change_device(v.ptr, v.ptr, 4096, workspace, 24, &change, stream),
            ONEBIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(onebit_last_error()).find("workspace of 24 bytes is too small: this call needs 48"),
            std::string::npos)
      << onebit_last_error();
  EXPECT_NE(std::string(onebit_last_error()).find("onebit_measure_workspace_size"), std::string::npos);
  EXPECT_EQ(
      onebit_adam_variance_change_device(v.ptr, on_host.data(), 4096, workspace, workspace_bytes, &change, stream),
      ONEBIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(onebit_last_error()).find("v_then"), std::string::npos) << onebit_last_error();
  EXPECT_EQ(change, -1);
  std::size_t dormant = 7;
  EXPECT_EQ(onebit_dormant_count_device(v.ptr, 4096, 1e-8f, workspace, workspace_bytes, nullptr, stream),
            ONEBIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(onebit_last_error()).find("dormant is NULL"), std::string::npos) << onebit_last_error();
  EXPECT_EQ(onebit_dormant_count_device(v.ptr, 4096, 0.0f, workspace, workspace_bytes, &dormant, stream),
            ONEBIT_INVALID_ARGUMENT);
  EXPECT_EQ(dormant, 7u);
  cudaFree(workspace);
  cudaStreamDestroy(stream);
}

// The calls that read sums back synchronize their stream, which a CUDA graph cannot hold: on a
// capturing stream each is refused before it queues anything (the stand-in stops a test that
// queues work on a capturing stream), and the capture ends valid (a synchronize would have
// invalidated it). Outside the capture the same call succeeds.
TEST(OptimizerDeviceSteps, TheCallsThatSumRefuseACapturingStreamQueuingNothing) {
  ASSERT_EQ(onebit_device_steps(), 1);
  SKIP_WITHOUT_GPU();
  const onebit_lamb_config_t c{0.003f, 0.9f, 0.999f, 1e-8f, 0.01f, 2, 1e9, 1e-9, 0.9, 4.0, 0.5, 0.1};
  const std::size_t n = 2048 + 300;
  Arrays host = random_arrays(n, 5);
  OnDevice p(host.p), m(host.m), v(host.v), g(host.g), fresh(std::vector<float>(n, 0.0f)),
      last(std::vector<float>(n, 0.0f));
  onebit_lamb_layer_t layer, layer_before;
  ASSERT_EQ(onebit_lamb_layer_init(&layer), ONEBIT_SUCCESS);
  layer.coeff_freeze = 1.0;  // as after a warmup: the apply step's checks of the state pass
  layer.scaling_coeff = 1.0;
  layer_before = layer;
  const std::size_t workspace_bytes = std::max(onebit_lamb_workspace_size(&n, 1), onebit_measure_workspace_size(n));
  void* workspace = nullptr;
  ASSERT_EQ(cudaMalloc(&workspace, workspace_bytes), cudaSuccess);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  double change = -1;
  std::size_t dormant = 7;
  const std::vector<std::pair<const char*, std::function<onebit_result_t()>>> calls = {
      {"onebit_lamb_warmup_steps_device",
       [&] {
         return onebit_lamb_warmup_steps_device(&c, &layer, &n, 1, 0, p.ptr, m.ptr, v.ptr, fresh.ptr, g.ptr, workspace,
                                                workspace_bytes, stream);
       }},
      {"onebit_lamb_scaling_coeffs_device",
       [&] { return onebit_lamb_scaling_coeffs_device(m.ptr, &n, 1, &layer, workspace, workspace_bytes, stream); }},
      {"onebit_lamb_apply_steps_device",
       [&] {
         return onebit_lamb_apply_steps_device(&c, &layer, &n, 1, p.ptr, m.ptr, last.ptr, v.ptr, fresh.ptr, workspace,
                                               workspace_bytes, stream);
       }},
      {"onebit_dormant_count_device",
       [&] { return onebit_dormant_count_device(v.ptr, n, 1e-8f, workspace, workspace_bytes, &dormant, stream); }},
      {"onebit_adam_variance_change_device",
       [&] {
         return onebit_adam_variance_change_device(v.ptr, g.ptr, n, workspace, workspace_bytes, &change, stream);
       }},
  };
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  for (const auto& [name, call] : calls) {
    EXPECT_EQ(call(), ONEBIT_UNSUPPORTED) << name;
    const std::string error = onebit_last_error();
    EXPECT_NE(error.find(name), std::string::npos) << error;
    EXPECT_NE(error.find("the stream is capturing a CUDA graph"), std::string::npos) << error;
  }
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess) << "the capture was invalidated: a call synchronized";
  if (graph != nullptr) cudaGraphDestroy(graph);
  EXPECT_EQ(bits(p.get()), bits(host.p));
  EXPECT_EQ(bits(m.get()), bits(host.m));
  EXPECT_EQ(bits(v.get()), bits(host.v));
  EXPECT_EQ(std::memcmp(&layer, &layer_before, sizeof layer), 0) << "a refused call changed the layer's state";
  EXPECT_EQ(change, -1);
  EXPECT_EQ(dormant, 7u);
  for (const auto& [name, call] : calls) EXPECT_EQ(call(), ONEBIT_SUCCESS) << name << ": " << onebit_last_error();
  EXPECT_GT(dormant, 0u);  // every 7th element's v is 0
  cudaFree(workspace);
  cudaStreamDestroy(stream);
}

// The legacy stream (NULL) while another stream captures in CUDA's global mode: CUDA cannot say
// it is not capturing (cudaErrorStreamCaptureImplicit), and a synchronize of it would join the
// capture; refused as capturing, CUDA's error cleared. (Whether the query leaves the other
// stream's capture valid is CUDA's: the end's answer is not checked.)
TEST(OptimizerDeviceSteps, TheLegacyStreamDuringAnotherStreamsCaptureIsRefusedAsCapturing) {
  ASSERT_EQ(onebit_device_steps(), 1);
  SKIP_WITHOUT_GPU();
  const std::size_t n = 4096;
  OnDevice v(std::vector<float>(n, 1.0f));
  const std::size_t workspace_bytes = onebit_measure_workspace_size(n);
  void* workspace = nullptr;
  ASSERT_EQ(cudaMalloc(&workspace, workspace_bytes), cudaSuccess);
  cudaStream_t capturing;
  ASSERT_EQ(cudaStreamCreate(&capturing), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(capturing, cudaStreamCaptureModeGlobal), cudaSuccess);
  std::size_t dormant = 7;
  EXPECT_EQ(onebit_dormant_count_device(v.ptr, n, 1e-8f, workspace, workspace_bytes, &dormant, nullptr),
            ONEBIT_UNSUPPORTED)
      << onebit_last_error();
  EXPECT_NE(std::string(onebit_last_error()).find("the stream is capturing a CUDA graph"), std::string::npos)
      << onebit_last_error();
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "CUDA's error left for the caller";
  EXPECT_EQ(dormant, 7u);
  cudaGraph_t graph = nullptr;
  (void)cudaStreamEndCapture(capturing, &graph);
  if (graph != nullptr) cudaGraphDestroy(graph);
  (void)cudaGetLastError();
  cudaStreamDestroy(capturing);
  cudaFree(workspace);
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
  const onebit_zero_one_adam_config_t zero_one{0.01f, 0.9f, 0.999f, 1e-8f, 0.0f, 4, 2, 2, 4};
  float lrs = 0.0f;  // a sync with no local step since the last
  EXPECT_EQ(onebit_zero_one_adam_sync_end_device(&zero_one, p.ptr, m.ptr, g.ptr, v.ptr, v.ptr, &lrs, 64, nullptr),
            ONEBIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(onebit_last_error()).find("learning-rate sum of 0"), std::string::npos) << onebit_last_error();
  lrs = 0.5f;
  EXPECT_EQ(
      onebit_zero_one_adam_local_step_device(&zero_one, p.ptr, m.ptr, v.ptr, g.ptr, &lrs, host.g.data(), 64, nullptr),
      ONEBIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(onebit_last_error()).find("grad is not device memory"), std::string::npos)
      << onebit_last_error();
  EXPECT_EQ(lrs, 0.5f);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(bits(p.get()), bits(host.p));
  EXPECT_EQ(bits(m.get()), bits(host.m));
  EXPECT_EQ(bits(v.get()), bits(host.v));
}

}  // namespace
}  // namespace onebit::optim
