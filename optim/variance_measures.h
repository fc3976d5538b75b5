// What the optimizers measure of their variance, one rule for the CPU core and the device
// (optim/cuda/variance_measures.cu): 1-bit Adam's automatic freeze's change, an fp64 sum in
// tiled_sums.h's order on both, so the device's answer has the CPU's bits; and the dormant
// elements every optimizer counts when its variance freezes (frozen_variance.h's predicate), a
// count: the device sums it in the same order, the CPU in a loop, exact either way.
#pragma once

#include <math.h>

#include "optim/adam_elementwise.h"
#include "optim/tiled_sums.h"

namespace onebit::optim::variance_measures {

// One element's terms of the change: |v − v_then| and |v|, in fp64.
ONEBIT_ELEMENTWISE tiled::Sums variance_change_terms(float v, float v_then) {
  const double now = v;
  const double then = v_then;
  return tiled::Sums{fabs(now - then), fabs(now), 0.0f};
}

// The change from its sums: Σ|v − v_then| / Σ|v|; 0 when both are 0 (nothing moved), 1 when only v
// is all zero (it all moved).
inline double variance_change(const tiled::Sums& sums) {
  if (sums.second == 0) return sums.first == 0 ? 0.0 : 1.0;
  return sums.first / sums.second;
}

// One element's term of the dormant count: 1 if dormant. The count is exact in fp64 (below 2^53).
ONEBIT_ELEMENTWISE tiled::Sums dormant_terms(float v, float eps) {
  return tiled::Sums{elementwise::dormant(v, eps) ? 1.0 : 0.0, 0.0, 0.0f};
}

}  // namespace onebit::optim::variance_measures
