#include "optim/onebit_adam.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "common/params.h"
#include "optim/adam_elementwise.h"
#include "optim/frozen_variance.h"
#include "optim/tiled_sums.h"
#include "optim/variance_measures.h"
#include "optim/vector_clones.h"

namespace onebit::optim {

std::int64_t freeze_step(std::int64_t requested) { return param::FreezeStep() >= 0 ? param::FreezeStep() : requested; }

bool compressing(const AdamConfig& config, std::int64_t step) { return step >= config.freeze_step; }

void warmup_step(const AdamConfig& c, float* p, float* m, float* v, const float* g, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    m[i] = elementwise::momentum(c.beta1, m[i], g[i]);
    v[i] = elementwise::variance(c.beta2, v[i], g[i]);
    p[i] = elementwise::warmup_update(c.lr, c.eps, c.weight_decay, p[i], m[i], v[i]);
  }
}

void momentum_step(const AdamConfig& c, float* m, const float* g, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) m[i] = elementwise::momentum(c.beta1, m[i], g[i]);
}

void momentum_step_keeping(const AdamConfig& c, float* m, float* m_before, const float* g, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    m_before[i] = m[i];
    m[i] = elementwise::momentum(c.beta1, m_before[i], g[i]);
  }
}

// Compute-bound: a square root and a division per element (optim/vector_clones.h).
ONEBIT_VECTOR_CLONES void apply_step(const AdamConfig& c, float* p, float* m, const float* v, std::size_t n) {
  const float bound = adam_step_bound(c.beta1, c.beta2);
  for (std::size_t i = 0; i < n; ++i) {
    // Stored whether or not it changes: a loop without a conditional store vectorises.
    const float momentum = elementwise::dormant(v[i], c.eps) ? 0.0f : m[i];  // dormant: weight decay alone
    m[i] = momentum;
    p[i] = elementwise::frozen_update(c.lr, c.eps, c.weight_decay, bound, p[i], momentum, v[i]);
  }
}

void check(const AutoFreeze& c) {
  ONEBIT_CHECK(c.window >= 1 && c.threshold > 0 && c.max_step >= 0, ONEBIT_INVALID_ARGUMENT,
               "auto freeze config out of range: window ", c.window, ", threshold ", c.threshold, ", max_step ",
               c.max_step, " (need window >= 1, threshold > 0, max_step >= 0)");
}

bool measures(const AutoFreeze& c, std::int64_t step) { return step >= 0 && (step + 1) % c.window == 0; }

double variance_change(const float* v, const float* v_then, std::size_t n) {
  return variance_measures::variance_change(
      tiled::sum(n, [&](std::size_t i) { return variance_measures::variance_change_terms(v[i], v_then[i]); }));
}

double largest_change(const double* changes, std::size_t ranks) {
  double largest = -INFINITY;
  for (std::size_t r = 0; r < ranks; ++r) {
    if (std::isnan(changes[r])) return changes[r];
    largest = std::max(largest, changes[r]);
  }
  return largest;
}

std::int64_t decide(const AutoFreeze& c, std::int64_t step, double change) {
  if (c.max_step > 0 && step + 1 >= c.max_step) return step + 1;
  if (measures(c, step) && change < c.threshold) return step + 1;
  return -1;
}

}  // namespace onebit::optim
