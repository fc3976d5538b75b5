// The Adam family's rules for one element — 1-bit Adam's and 0/1 Adam's — written once for the CPU
// loops (optim/onebit_adam.cc, optim/zero_one_adam.cc) and the CUDA kernels (optim/cuda/adam_device.cu,
// optim/cuda/zero_one_adam_device.cu): the same IEEE operations in the same order, so the two
// give the same bits wherever neither side fuses a multiply and an add — the CPU sources are built
// with -ffp-contract=off and the CUDA ones with --fmad=false (CMakeLists.txt), and sqrtf and the
// division are correctly rounded on both (nvcc's defaults -prec-sqrt=true, -prec-div=true).
// The frozen-variance rules (dormant elements, the step bound) are optim/frozen_variance.h's.
#pragma once

#include <math.h>

#if defined(__CUDACC__)
#define ONEBIT_ELEMENTWISE __host__ __device__ inline
#else
#define ONEBIT_ELEMENTWISE inline
#endif

namespace onebit::optim::elementwise {

// m ← β1·m + (1−β1)·g
ONEBIT_ELEMENTWISE float momentum(float beta1, float m, float g) { return beta1 * m + (1.0f - beta1) * g; }

// v ← β2·v + (1−β2)·g²
ONEBIT_ELEMENTWISE float variance(float beta2, float v, float g) { return beta2 * v + (1.0f - beta2) * g * g; }

// Warmup's update: p − lr·(m / (√v + ε) + wd·p).
ONEBIT_ELEMENTWISE float warmup_update(float lr, float eps, float weight_decay, float p, float m, float v) {
  return p - lr * (m / (sqrtf(v) + eps) + weight_decay * p);
}

// A dormant element (√v ≤ ε) takes no momentum step under a frozen variance (frozen_variance.h).
ONEBIT_ELEMENTWISE bool dormant(float v, float eps) { return sqrtf(v) <= eps; }

// m/(√v+ε) within ±bound; NaN stays NaN (std::clamp's order of comparisons).
ONEBIT_ELEMENTWISE float frozen_direction(float m, float v, float eps, float bound) {
  const float direction = m / (sqrtf(v) + eps);
  return direction < -bound ? -bound : (bound < direction ? bound : direction);
}

// The compression stage's update with the averaged momentum (already 0 for a dormant element):
// p − lr·(clip(m / (√v + ε), ±bound) + wd·p).
ONEBIT_ELEMENTWISE float frozen_update(float lr, float eps, float weight_decay, float bound, float p, float m,
                                       float v) {
  return p - lr * (frozen_direction(m, v, eps, bound) + weight_decay * p);
}

// ---- 0/1 Adam (optim/zero_one_adam.h has the stages) ----

// A local step's move, lr·(clip(m / (√v + ε), ±bound) + wd·p): taken from p and from u alike.
ONEBIT_ELEMENTWISE float frozen_step(float lr, float eps, float weight_decay, float bound, float p, float m, float v) {
  return lr * (frozen_direction(m, v, eps, bound) + weight_decay * p);
}

// A sync's u before the average: u·(√v + ε).
ONEBIT_ELEMENTWISE float sync_scaled(float u, float v, float eps) { return u * (sqrtf(v) + eps); }

// A sync after the average of u, one element: a dormant element keeps p (it moved by weight decay
// alone since the last sync) and its m is 0; any other takes m ← −u/lrs and moves from p_sync by
// u/(√v+ε) within ±lrs·(bound + wd·|p_sync|). Then p_sync ← p, u ← 0.
ONEBIT_ELEMENTWISE void sync_end(float eps, float weight_decay, float bound, float lrs, float& p, float& p_sync,
                                 float& m, float& u, float v) {
  // Written as selects (both sides computed, one kept): the CPU loop then vectorizes.
  const bool asleep = dormant(v, eps);
  const float reach = lrs * (bound + weight_decay * fabsf(p_sync));
  const float move = u / (sqrtf(v) + eps);
  const float moved = p_sync + (move < -reach ? -reach : (reach < move ? reach : move));  // std::clamp's order
  m = asleep ? 0.0f : -(u / lrs);
  p = asleep ? p : moved;
  p_sync = p;
  u = 0.0f;
}

}  // namespace onebit::optim::elementwise
