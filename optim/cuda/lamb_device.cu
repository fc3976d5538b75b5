#include "optim/cuda/lamb_device.h"

#include <utility>
#include <vector>

#include "common/error.h"
#include "optim/cuda/grid.h"
#include "optim/cuda/tiled_sums.h"
#include "optim/lamb_rules.h"

namespace onebit::optim::lamb::cuda {
namespace {

using onebit::optim::cuda::blocks_for;
using onebit::optim::cuda::kThreads;

void check_cuda(cudaError_t status, const char* doing) { tiled::cuda::check_cuda(status, "1-bit LAMB", doing); }

struct WarmupTerm {
  Config c;
  bool last;
  const float* p;
  float *m, *v, *v_fresh;
  const float* g;
  __device__ Sums operator()(std::size_t i) const {
    return warmup_element(c, last, p[i], m[i], v[i], v_fresh[i], g[i]);
  }
};

struct SquareTerm {
  const float* x;
  __device__ Sums operator()(std::size_t i) const { return square_terms(x[i]); }
};

struct ApplyTerm {
  Config c;
  float scaling;
  const float* p;
  float* m;
  const float* m_last;
  const float* v;
  float* v_fresh;
  __device__ Sums operator()(std::size_t i) const {
    return apply_element(c, scaling, p[i], m[i], m_last[i], v[i], v_fresh[i]);
  }
};

__global__ void move_kernel(Config c, float step, float* p, const float* m, const float* v, std::size_t n) {
  ONEBIT_GRID_STRIDE_LOOP(i, n) { p[i] = p[i] - step * direction(c, p[i], m[i], v[i]); }
}

__global__ void momentum_kernel(Config c, float scaling, float* m, float* m_last, const float* g, std::size_t n) {
  ONEBIT_GRID_STRIDE_LOOP(i, n) {
    const float before = m[i];
    m_last[i] = before;
    m[i] = scaled_momentum(c, scaling, before, g[i]);
  }
}

void move(const Config& c, double coefficient, float* p, const float* m, const float* v, std::size_t n,
          cudaStream_t stream) {
  if (n == 0) return;
  move_kernel<<<blocks_for(n), kThreads, 0, stream>>>(c, move_step(c, coefficient), p, m, v, n);
  check_cuda(cudaGetLastError(), "the update's kernel did not launch");
}

}  // namespace

void warmup_steps(const Config* configs, Layer* states, const std::size_t* counts, std::size_t layers,
                  std::int64_t step, float* p, float* m, float* v, float* v_fresh, const float* g, void* workspace,
                  cudaStream_t stream) {
  const auto term_of = [&](std::size_t j, std::size_t at) {
    const bool last = step + 1 == configs[j].freeze_step;
    return WarmupTerm{configs[j], last, p + at, m + at, v + at, v_fresh + at, g + at};
  };
  const std::vector<Sums> sums = tiled::cuda::ranges_sums(counts, layers, term_of, workspace, stream, "1-bit LAMB");
  for (std::size_t j = 0, at = 0; j < layers; at += counts[j], ++j) {
    move(configs[j], warmup_coefficient(configs[j], states[j], sums[j]), p + at, m + at, v + at, counts[j], stream);
  }
}

void scaling_coeffs(const float* m, const std::size_t* counts, std::size_t layers, Layer* states, void* workspace,
                    cudaStream_t stream) {
  const auto term_of = [&](std::size_t, std::size_t at) { return SquareTerm{m + at}; };
  const std::vector<Sums> sums = tiled::cuda::ranges_sums(counts, layers, term_of, workspace, stream, "1-bit LAMB");
  std::vector<double> squares(layers);
  for (std::size_t j = 0; j < layers; ++j) squares[j] = sums[j].first;
  set_scaling_coeffs(squares.data(), counts, layers, states);
}

void momentum_step(const Config& c, const Layer& layer, float* m, float* m_last, const float* g, std::size_t n,
                   cudaStream_t stream) {
  check_momentum(layer);
  if (n == 0) return;
  momentum_kernel<<<blocks_for(n), kThreads, 0, stream>>>(c, static_cast<float>(layer.scaling_coeff), m, m_last, g, n);
  check_cuda(cudaGetLastError(), "the momentum's kernel did not launch");
}

void apply_steps(const Config* configs, Layer* states, const std::size_t* counts, std::size_t layers, float* p,
                 float* m, const float* m_last, const float* v, float* v_fresh, void* workspace, cudaStream_t stream) {
  for (std::size_t j = 0; j < layers; ++j) {  // every layer before any kernel, a bad one named
    try {
      check_apply(states[j]);
    } catch (const Error& error) {
      fail(error.code(), "layer ", j, ": ", error.what());
    }
  }
  const auto term_of = [&](std::size_t j, std::size_t at) {
    return ApplyTerm{configs[j],  static_cast<float>(states[j].scaling_coeff), p + at, m + at, m_last + at, v + at,
                     v_fresh + at};
  };
  const std::vector<Sums> sums = tiled::cuda::ranges_sums(counts, layers, term_of, workspace, stream, "1-bit LAMB");
  for (std::size_t j = 0, at = 0; j < layers; at += counts[j], ++j) {
    move(configs[j], apply_coefficient(configs[j], states[j], sums[j]), p + at, m + at, v + at, counts[j], stream);
  }
}

}  // namespace onebit::optim::lamb::cuda
