// 1-bit LAMB's rules for one element, written once for the CPU loops (optim/onebit_lamb.cc) and
// the CUDA kernels (optim/cuda/lamb_device.cu), so that both give the same bits
// (optim/adam_elementwise.h says how: no fused multiply-adds on either side).
//
// A layer's norms are fp64 sums in tiled_sums.h's order, shared with the device: a GPU block sums a
// tile, and the host finishes the tiles' sums with the CPU's own total().
#pragma once

#include <cstddef>

#include "onebit/onebit_types.h"
#include "optim/adam_elementwise.h"
#include "optim/tiled_sums.h"

namespace onebit::optim::lamb {

// What a layer's pass sums: warmup: ‖d‖², ‖p‖²; the compression stage: ‖prelim‖², ‖d‖², the
// largest variance ratio.
using tiled::Sums;

// d = m/(√v+ε) + wd·p. Unbounded in the compression stage too (onebit_lamb.cc says why).
ONEBIT_ELEMENTWISE float direction(const onebit_lamb_config_t& c, float p, float m, float v) {
  return m / (sqrtf(v) + c.eps) + c.weight_decay * p;
}

// An element's square in the first sum (the momentum's norm, for the layers' scaling coefficients).
ONEBIT_ELEMENTWISE Sums square_terms(float x) {
  const double value = x;
  return Sums{value * value, 0.0, 0.0f};
}

// The compression stage's momentum before the average: (β1·m + (1−β1)·g)·scaling.
ONEBIT_ELEMENTWISE float scaled_momentum(const onebit_lamb_config_t& c, float scaling, float m, float g) {
  return elementwise::momentum(c.beta1, m, g) * scaling;
}

// A warmup element: m and v as Adam's (v_fresh ← v at the last warmup step); its terms (d², p²).
ONEBIT_ELEMENTWISE Sums warmup_element(const onebit_lamb_config_t& c, bool last_warmup_step, float p, float& m,
                                       float& v, float& v_fresh, float g) {
  m = elementwise::momentum(c.beta1, m, g);
  v = elementwise::variance(c.beta2, v, g);
  if (last_warmup_step) v_fresh = v;
  const double d = direction(c, p, m, v);
  const double weight = p;
  return Sums{d * d, weight * weight, 0.0f};
}

// A compression-stage element after the average: m ← m/scaling (0 if dormant, frozen_variance.h);
// the gradient it implies updates v_fresh; its terms (prelim², d², the variance ratio unless dormant).
ONEBIT_ELEMENTWISE Sums apply_element(const onebit_lamb_config_t& c, float scaling, float p, float& m, float m_last,
                                      float v, float& v_fresh) {
  const bool asleep = elementwise::dormant(v, c.eps);
  m = asleep ? 0.0f : m / scaling;
  const float g = (m - m_last * c.beta1) / (1.0f - c.beta1);
  v_fresh = c.beta2 * v_fresh + (1.0f - c.beta2) * g * g;
  const float denominator = sqrtf(v) + c.eps;
  const float prelim = m / denominator;
  const double d = prelim + c.weight_decay * p;
  // A dormant element's ratio compares ε with ε: it says nothing of the variance moving.
  const float ratio = asleep ? 0.0f : denominator / (sqrtf(v_fresh) + c.eps);
  return Sums{static_cast<double>(prelim) * prelim, d * d, ratio};
}

}  // namespace onebit::optim::lamb
