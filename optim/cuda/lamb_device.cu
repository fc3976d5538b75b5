#include "optim/cuda/lamb_device.h"

#include <utility>
#include <vector>

#include "common/error.h"
#include "optim/cuda/grid.h"
#include "optim/lamb_rules.h"

namespace onebit::optim::lamb::cuda {
namespace {

using onebit::optim::cuda::blocks_for;
using onebit::optim::cuda::kThreads;

void check_cuda(cudaError_t status, const char* what) {
  ONEBIT_CHECK(status == cudaSuccess, ONEBIT_SYSTEM_ERROR, "1-bit LAMB on the device: ", what, ": ",
               cudaGetErrorString(status));
}

// One block sums one tile of term(i) in lamb_rules.h's order — lane j (thread j) over its rounds,
// then the halving tree — and writes the tile's sums.
template <typename Term>
__device__ void sum_tile(std::size_t n, Sums* tiles, const Term& term) {
  __shared__ Sums lanes[kLanes];
  const int j = threadIdx.x;
  Sums lane{0.0, 0.0, 0.0f};
  for (int r = 0; r < kRounds; ++r) {
    const std::size_t i = blockIdx.x * kTile + std::size_t(r) * kLanes + j;
    if (i < n) lane = combine(lane, term(i));
  }
  lanes[j] = lane;
  __syncthreads();
  for (int s = kLanes / 2; s > 0; s /= 2) {
    if (j < s) lanes[j] = combine(lanes[j], lanes[j + s]);
    __syncthreads();
  }
  if (j == 0) tiles[blockIdx.x] = lanes[0];
}

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

template <typename Term>
__global__ void tiles_kernel(std::size_t n, Sums* tiles, Term term) {
  sum_tile(n, tiles, term);
}

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

// Every layer's sums: layer j's terms (term_of(j, its offset)) summed by one kernel into its
// slice of the workspace, all the tiles' sums read back at once (the one synchronization) and each
// layer's finished on the host.
template <typename TermOf>
std::vector<Sums> layers_sums(const std::size_t* counts, std::size_t layers, const TermOf& term_of, void* workspace,
                              cudaStream_t stream) {
  auto* on_device = static_cast<Sums*>(workspace);
  std::vector<std::size_t> first(layers + 1, 0);  // layer j's tiles are [first[j], first[j + 1])
  std::size_t offset = 0;
  for (std::size_t j = 0; j < layers; ++j) {
    const std::size_t tiles = tiles_of(counts[j]);
    if (tiles > 0) {
      tiles_kernel<<<static_cast<unsigned>(tiles), kLanes, 0, stream>>>(counts[j], on_device + first[j],
                                                                        term_of(j, offset));
      check_cuda(cudaGetLastError(), "the sums' kernel did not launch");
    }
    first[j + 1] = first[j] + tiles;
    offset += counts[j];
  }
  std::vector<Sums> on_host(first[layers]);
  if (!on_host.empty()) {
    check_cuda(
        cudaMemcpyAsync(on_host.data(), on_device, on_host.size() * sizeof(Sums), cudaMemcpyDeviceToHost, stream),
        "reading the layers' sums back");
    check_cuda(cudaStreamSynchronize(stream), "waiting for the layers' sums");
  }
  std::vector<Sums> totals(layers);
  for (std::size_t j = 0; j < layers; ++j) {
    totals[j] = total(std::vector<Sums>(on_host.begin() + first[j], on_host.begin() + first[j + 1]));
  }
  return totals;
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
  const std::vector<Sums> sums = layers_sums(counts, layers, term_of, workspace, stream);
  for (std::size_t j = 0, at = 0; j < layers; at += counts[j], ++j) {
    move(configs[j], warmup_coefficient(configs[j], states[j], sums[j]), p + at, m + at, v + at, counts[j], stream);
  }
}

void scaling_coeffs(const float* m, const std::size_t* counts, std::size_t layers, Layer* states, void* workspace,
                    cudaStream_t stream) {
  const auto term_of = [&](std::size_t, std::size_t at) { return SquareTerm{m + at}; };
  const std::vector<Sums> sums = layers_sums(counts, layers, term_of, workspace, stream);
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
  const std::vector<Sums> sums = layers_sums(counts, layers, term_of, workspace, stream);
  for (std::size_t j = 0, at = 0; j < layers; at += counts[j], ++j) {
    move(configs[j], apply_coefficient(configs[j], states[j], sums[j]), p + at, m + at, v + at, counts[j], stream);
  }
}

}  // namespace onebit::optim::lamb::cuda
