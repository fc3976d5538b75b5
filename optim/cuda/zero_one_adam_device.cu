#include "optim/cuda/zero_one_adam_device.h"

#include <math.h>

#include "optim/adam_elementwise.h"
#include "optim/cuda/grid.h"
#include "optim/frozen_variance.h"

namespace onebit::optim::zero_one_adam::cuda {
namespace {

using onebit::optim::cuda::blocks_for;
using onebit::optim::cuda::kThreads;

__global__ void gradient_kernel(Config c, float bound, bool update_variance, float* p, float* m, float* v,
                                const float* g, std::size_t n) {
  ONEBIT_GRID_STRIDE_LOOP(i, n) {
    const float vi = update_variance ? elementwise::variance(c.beta2, v[i], g[i]) : v[i];
    float mi = elementwise::momentum(c.beta1, m[i], g[i]);
    if (!update_variance && elementwise::dormant(vi, c.eps)) mi = 0.0f;  // g was compressed, v kept
    v[i] = vi;
    m[i] = mi;
    p[i] = elementwise::frozen_update(c.lr, c.eps, c.weight_decay, bound, p[i], mi, vi);
  }
}

__global__ void local_kernel(Config c, float bound, float* p, float* m, const float* v, float* u, const float* g,
                             std::size_t n) {
  ONEBIT_GRID_STRIDE_LOOP(i, n) {
    const float mi = elementwise::dormant(v[i], c.eps) ? 0.0f : elementwise::momentum(c.beta1, m[i], g[i]);
    const float step = elementwise::frozen_step(c.lr, c.eps, c.weight_decay, bound, p[i], mi, v[i]);
    m[i] = mi;
    p[i] = p[i] - step;
    u[i] = u[i] - step;
  }
}

__global__ void sync_begin_kernel(float eps, float* u, const float* v, std::size_t n) {
  ONEBIT_GRID_STRIDE_LOOP(i, n) { u[i] = elementwise::sync_scaled(u[i], v[i], eps); }
}

__global__ void sync_end_kernel(Config c, float bound, float lrs, float* p, float* p_sync, float* m, float* u,
                                const float* v, std::size_t n) {
  ONEBIT_GRID_STRIDE_LOOP(i, n) {
    elementwise::sync_end(c.eps, c.weight_decay, bound, lrs, p[i], p_sync[i], m[i], u[i], v[i]);
  }
}

}  // namespace

cudaError_t gradient_step(const Config& c, float* p, float* m, float* v, const float* g, std::size_t n,
                          bool update_variance, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  // The bound in double on the host, as the CPU core computes it; infinite after a variance update.
  const float bound = update_variance ? INFINITY : adam_step_bound(c.beta1, c.beta2);
  gradient_kernel<<<blocks_for(n), kThreads, 0, stream>>>(c, bound, update_variance, p, m, v, g, n);
  return cudaGetLastError();
}

cudaError_t local_step(const Config& c, float* p, float* m, const float* v, float* u, float* lrs, const float* g,
                       std::size_t n, cudaStream_t stream) {
  if (n > 0) {
    local_kernel<<<blocks_for(n), kThreads, 0, stream>>>(c, adam_step_bound(c.beta1, c.beta2), p, m, v, u, g, n);
    const cudaError_t launched = cudaGetLastError();
    if (launched != cudaSuccess) return launched;
  }
  *lrs += c.lr;
  return cudaSuccess;
}

cudaError_t sync_begin(const Config& c, float* u, const float* v, float lrs, std::size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  sync_begin_kernel<<<blocks_for(n), kThreads, 0, stream>>>(c.eps, u, v, n);
  return cudaGetLastError();
}

cudaError_t sync_end(const Config& c, float* p, float* p_sync, float* m, float* u, const float* v, float* lrs,
                     std::size_t n, cudaStream_t stream) {
  if (n > 0) {
    sync_end_kernel<<<blocks_for(n), kThreads, 0, stream>>>(c, adam_step_bound(c.beta1, c.beta2), *lrs, p, p_sync, m, u,
                                                            v, n);
    const cudaError_t launched = cudaGetLastError();
    if (launched != cudaSuccess) return launched;
  }
  *lrs = 0.0f;
  return cudaSuccess;
}

}  // namespace onebit::optim::zero_one_adam::cuda
