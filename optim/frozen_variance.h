// Steps under a frozen variance: the rules the optimizers follow where they divide by a variance
// they no longer update (1-bit Adam's and 1-bit LAMB's compression stage; 0/1 Adam's compressed,
// local and sync steps) — both for the two Adams, the first for 1-bit LAMB (onebit_lamb.cc says
// why). docs/design/optimizer-rules.md, "Steps under a frozen variance", has the reasoning.
//
// Adam bounds its own steps: without bias correction |m/√v| ≤ C(β1, β2) whatever the gradients
// (adam_step_bound). A frozen variance loses that bound twice over. The momentum is averaged 1-bit
// compressed, so an element's momentum is ±(its chunk's scale) — set by the largest elements of
// the chunk — and an element with a small √v turns that into a step far beyond anything Adam could
// take; and the gradients move on while v stays, so a unit that was nearly silent when v froze
// and speaks now gets m/√v as large as it likes, compressed or not. So:
//   1. A dormant element (√v ≤ ε: no gradient worth the name reached it while v was measured) takes
//      no momentum step: its momentum is 0 after the average (as DeepSpeed's exp_avg_mask does for
//      coordinates it is told never get a gradient) and it moves by weight decay alone.
//   2. Every other element's direction m/(√v+ε) is clipped to ±C: no step larger than Adam's own
//      largest. An element that is not clipped moves exactly as the paper's rule says.
// v is the same on every rank (built from averaged gradients) and so is the averaged momentum, so
// both rules decide alike on every rank.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

#include "optim/adam_elementwise.h"

namespace onebit::optim {

inline bool dormant(float v, float eps) { return elementwise::dormant(v, eps); }

inline std::size_t count_dormant(const float* v, std::size_t n, float eps) {
  std::size_t count = 0;
  for (std::size_t i = 0; i < n; ++i) count += dormant(v[i], eps) ? 1 : 0;
  return count;
}

// The largest |m/√v| Adam produces with these betas, no bias correction: m = (1−β1)Σβ1^k·g_k and
// v = (1−β2)Σβ2^k·g_k², so by Cauchy–Schwarz |m| ≤ (1−β1)·√(Σ(β1²/β2)^k / (1−β2))·√v, i.e.
// C = (1−β1) / √((1−β2)(1−β1²/β2)) — 7.27 for (0.9, 0.999). Infinite (no bound) when β1² ≥ β2.
inline float adam_step_bound(float beta1, float beta2) {
  const double b1 = beta1, b2 = beta2;
  if (b1 == 0) return static_cast<float>(1.0 / std::sqrt(1.0 - b2));
  if (b1 * b1 >= b2) return std::numeric_limits<float>::infinity();
  return static_cast<float>((1.0 - b1) / std::sqrt((1.0 - b2) * (1.0 - b1 * b1 / b2)));
}

// An element's direction under a frozen variance: m/(√v+ε), within ±bound. (A dormant element's m
// is 0 by then, so its direction is 0.)
inline float frozen_direction(float m, float v, float eps, float bound) {
  return elementwise::frozen_direction(m, v, eps, bound);
}

}  // namespace onebit::optim
