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

std::size_t tiles_of(std::size_t n) { return (n + kTile - 1) / kTile; }

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

// The layer's sums: term over its n elements, one block a tile, into workspace; the tiles' sums
// read back (the one synchronization) and finished on the host.
template <typename Term>
Sums layer_sums(std::size_t n, const Term& term, void* workspace, cudaStream_t stream) {
  const std::size_t tiles = tiles_of(n);
  if (tiles == 0) return total({});
  auto* on_device = static_cast<Sums*>(workspace);
  tiles_kernel<<<static_cast<unsigned>(tiles), kLanes, 0, stream>>>(n, on_device, term);
  check_cuda(cudaGetLastError(), "the sums' kernel did not launch");
  std::vector<Sums> on_host(tiles);
  check_cuda(cudaMemcpyAsync(on_host.data(), on_device, tiles * sizeof(Sums), cudaMemcpyDeviceToHost, stream),
             "reading the layer's sums back");
  check_cuda(cudaStreamSynchronize(stream), "waiting for the layer's sums");
  return total(std::move(on_host));
}

void move(const Config& c, double coefficient, float* p, const float* m, const float* v, std::size_t n,
          cudaStream_t stream) {
  if (n == 0) return;
  move_kernel<<<blocks_for(n), kThreads, 0, stream>>>(c, move_step(c, coefficient), p, m, v, n);
  check_cuda(cudaGetLastError(), "the update's kernel did not launch");
}

}  // namespace

std::size_t workspace_bytes(std::size_t n) { return (tiles_of(n) > 0 ? tiles_of(n) : 1) * sizeof(Sums); }

void warmup_step(const Config& c, Layer& layer, std::int64_t step, float* p, float* m, float* v, float* v_fresh,
                 const float* g, std::size_t n, void* workspace, cudaStream_t stream) {
  const bool last = step + 1 == c.freeze_step;
  const Sums sums = layer_sums(n, WarmupTerm{c, last, p, m, v, v_fresh, g}, workspace, stream);
  move(c, warmup_coefficient(c, layer, sums), p, m, v, n, stream);
}

void scaling_coeffs(const float* m, const std::size_t* counts, std::size_t layers, Layer* states, void* workspace,
                    cudaStream_t stream) {
  std::vector<double> squares(layers);
  std::size_t offset = 0;
  for (std::size_t j = 0; j < layers; ++j) {
    squares[j] = layer_sums(counts[j], SquareTerm{m + offset}, workspace, stream).first;
    offset += counts[j];
  }
  set_scaling_coeffs(squares.data(), counts, layers, states);
}

void momentum_step(const Config& c, const Layer& layer, float* m, float* m_last, const float* g, std::size_t n,
                   cudaStream_t stream) {
  check_momentum(layer);
  if (n == 0) return;
  momentum_kernel<<<blocks_for(n), kThreads, 0, stream>>>(c, static_cast<float>(layer.scaling_coeff), m, m_last, g, n);
  check_cuda(cudaGetLastError(), "the momentum's kernel did not launch");
}

void apply_step(const Config& c, Layer& layer, float* p, float* m, const float* m_last, const float* v, float* v_fresh,
                std::size_t n, void* workspace, cudaStream_t stream) {
  check_apply(layer);
  const float scaling = static_cast<float>(layer.scaling_coeff);
  const Sums sums = layer_sums(n, ApplyTerm{c, scaling, p, m, m_last, v, v_fresh}, workspace, stream);
  move(c, apply_coefficient(c, layer, sums), p, m, v, n, stream);
}

}  // namespace onebit::optim::lamb::cuda
