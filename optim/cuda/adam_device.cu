#include "optim/cuda/adam_device.h"

#include "optim/adam_elementwise.h"
#include "optim/cuda/grid.h"
#include "optim/frozen_variance.h"

namespace onebit::optim::cuda {
namespace {

__global__ void warmup_kernel(AdamConfig c, float* p, float* m, float* v, const float* g, std::size_t n) {
  ONEBIT_GRID_STRIDE_LOOP(i, n) {
    const float mi = elementwise::momentum(c.beta1, m[i], g[i]);
    const float vi = elementwise::variance(c.beta2, v[i], g[i]);
    m[i] = mi;
    v[i] = vi;
    p[i] = elementwise::warmup_update(c.lr, c.eps, c.weight_decay, p[i], mi, vi);
  }
}

__global__ void momentum_kernel(float beta1, float* m, float* m_before, const float* g, std::size_t n) {
  ONEBIT_GRID_STRIDE_LOOP(i, n) {
    const float before = m[i];
    if (m_before != nullptr) m_before[i] = before;
    m[i] = elementwise::momentum(beta1, before, g[i]);
  }
}

__global__ void apply_kernel(AdamConfig c, float bound, float* p, float* m, const float* v, std::size_t n) {
  ONEBIT_GRID_STRIDE_LOOP(i, n) {
    const float momentum = elementwise::dormant(v[i], c.eps) ? 0.0f : m[i];
    m[i] = momentum;
    p[i] = elementwise::frozen_update(c.lr, c.eps, c.weight_decay, bound, p[i], momentum, v[i]);
  }
}

}  // namespace

cudaError_t warmup_step(const AdamConfig& config, float* p, float* m, float* v, const float* g, std::size_t n,
                        cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  warmup_kernel<<<blocks_for(n), kThreads, 0, stream>>>(config, p, m, v, g, n);
  return cudaGetLastError();
}

cudaError_t momentum_step(const AdamConfig& config, float* m, float* m_before, const float* g, std::size_t n,
                          cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  momentum_kernel<<<blocks_for(n), kThreads, 0, stream>>>(config.beta1, m, m_before, g, n);
  return cudaGetLastError();
}

cudaError_t apply_step(const AdamConfig& config, float* p, float* m, const float* v, std::size_t n,
                       cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  // The bound in double on the host, as the CPU core computes it, then rounded to float alike.
  const float bound = adam_step_bound(config.beta1, config.beta2);
  apply_kernel<<<blocks_for(n), kThreads, 0, stream>>>(config, bound, p, m, v, n);
  return cudaGetLastError();
}

}  // namespace onebit::optim::cuda
