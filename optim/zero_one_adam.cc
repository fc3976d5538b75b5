#include "optim/zero_one_adam.h"

#include <algorithm>
#include <limits>

#include "common/error.h"
#include "optim/adam_elementwise.h"
#include "optim/frozen_variance.h"
#include "optim/vector_clones.h"

namespace onebit::optim::zero_one_adam {
namespace {

bool in_variance_stage(const Config& c, std::int64_t step) { return step <= c.var_freeze_step; }

}  // namespace

void check(const Config& c) {
  ONEBIT_CHECK(
      c.lr >= 0 && c.beta1 >= 0 && c.beta1 < 1 && c.beta2 >= 0 && c.beta2 < 1 && c.eps > 0 && c.weight_decay >= 0,
      ONEBIT_INVALID_ARGUMENT, "0/1 Adam config out of range: lr ", c.lr, ", betas (", c.beta1, ", ", c.beta2,
      "), eps ", c.eps, ", weight_decay ", c.weight_decay, " (need lr, weight_decay >= 0; 0 <= beta < 1; eps > 0)");
  ONEBIT_CHECK(
      c.var_freeze_step >= 0 && c.var_update_scaler >= 1 && c.local_step_scaler >= 1 && c.local_step_clipper >= 1,
      ONEBIT_INVALID_ARGUMENT, "0/1 Adam schedule out of range: var_freeze_step ", c.var_freeze_step,
      ", var_update_scaler ", c.var_update_scaler, ", local_step_scaler ", c.local_step_scaler, ", local_step_clipper ",
      c.local_step_clipper, " (need var_freeze_step >= 0 and the scalers and the clipper >= 1)");
}

Schedule initial_schedule() { return Schedule{0, 1, 0, 1, 0}; }

void check(const Schedule& s) {
  ONEBIT_CHECK(s.step >= 0 && s.var_interval >= 1 && s.var_counter >= 0 && s.local_step_interval >= 1 &&
                   s.local_step_counter >= 0,
               ONEBIT_INVALID_ARGUMENT, "0/1 Adam schedule state out of range: step ", s.step, ", var_interval ",
               s.var_interval, ", var_counter ", s.var_counter, ", local_step_interval ", s.local_step_interval,
               ", local_step_counter ", s.local_step_counter, " (a corrupt checkpoint?)");
}

StepKind next(const Config& c, const Schedule& s) {
  const std::int64_t count = s.step + 1;  // DeepSpeed's 1-based state['step']
  if (in_variance_stage(c, s.step)) {
    return count % s.var_interval == 0 ? ONEBIT_ZERO_ONE_ADAM_VARIANCE_STEP : ONEBIT_ZERO_ONE_ADAM_COMPRESSED_STEP;
  }
  return count % s.local_step_interval == 0 ? ONEBIT_ZERO_ONE_ADAM_SYNC_STEP : ONEBIT_ZERO_ONE_ADAM_LOCAL_STEP;
}

void advance(const Config& c, Schedule& s) {
  const std::int64_t count = s.step + 1;
  if (in_variance_stage(c, s.step)) {
    if (count % s.var_interval == 0 && ++s.var_counter == c.var_update_scaler) {
      s.var_counter = 0;
      s.var_interval *= 2;
    }
  } else if (++s.local_step_counter == c.local_step_scaler) {
    s.local_step_counter = 0;
    s.local_step_interval = std::min(c.local_step_clipper, s.local_step_interval * 2);
  }
  ++s.step;
}

namespace {

// gradient_step's loop, one per stage (a loop with the stage's test in it would not vectorize),
// inlined into gradient_step's clones: target_clones takes no template (clang refuses it).
template <bool kUpdateVariance>
[[gnu::always_inline]] inline void gradient_steps(const Config& c, float* p, float* m, float* v, const float* g,
                                                  std::size_t n) {
  // The settings in locals: read through `c` they could alias the arrays, and the loop would not vectorize.
  const float lr = c.lr, beta1 = c.beta1, beta2 = c.beta2, eps = c.eps, weight_decay = c.weight_decay;
  const float bound = kUpdateVariance ? std::numeric_limits<float>::infinity() : adam_step_bound(beta1, beta2);
  for (std::size_t i = 0; i < n; ++i) {
    const float variance = kUpdateVariance ? elementwise::variance(beta2, v[i], g[i]) : v[i];
    if constexpr (kUpdateVariance) v[i] = variance;
    const float momentum = elementwise::momentum(beta1, m[i], g[i]);
    m[i] = !kUpdateVariance && dormant(variance, eps) ? 0.0f : momentum;  // g was compressed, v kept
    p[i] = elementwise::frozen_update(lr, eps, weight_decay, bound, p[i], m[i], variance);
  }
}

}  // namespace

// Compute-bound, as every loop below: a square root and a division per element (vector_clones.h).
ONEBIT_VECTOR_CLONES void gradient_step(const Config& c, float* p, float* m, float* v, const float* g, std::size_t n,
                                        bool update_variance) {
  if (update_variance) {
    gradient_steps<true>(c, p, m, v, g, n);
  } else {
    gradient_steps<false>(c, p, m, v, g, n);
  }
}

ONEBIT_VECTOR_CLONES void local_step(const Config& c, float* p, float* m, const float* v, float* u, float* lrs,
                                     const float* g, std::size_t n) {
  // The settings in locals: read through `c` they could alias the arrays, and the loop would not vectorize.
  const float lr = c.lr, beta1 = c.beta1, eps = c.eps, weight_decay = c.weight_decay;
  const float bound = adam_step_bound(beta1, c.beta2);
  for (std::size_t i = 0; i < n; ++i) {
    const float momentum = elementwise::momentum(beta1, m[i], g[i]);
    m[i] = dormant(v[i], eps) ? 0.0f : momentum;
    const float step = elementwise::frozen_step(lr, eps, weight_decay, bound, p[i], m[i], v[i]);
    p[i] = p[i] - step;
    u[i] = u[i] - step;
  }
  *lrs += lr;
}

void check_sync(float lrs) {
  ONEBIT_CHECK(lrs > 0, ONEBIT_INVALID_ARGUMENT, "0/1 Adam sync with a learning-rate sum of ", lrs,
               " since the last sync (need > 0: sync_end divides by it; was every lr 0?)");
}

namespace {

ONEBIT_VECTOR_CLONES void sync_scale(const Config& c, float* u, const float* v, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) u[i] = elementwise::sync_scaled(u[i], v[i], c.eps);
}

ONEBIT_VECTOR_CLONES void sync_ends(const Config& c, float* p, float* p_sync, float* m, float* u, const float* v,
                                    float lrs, std::size_t n) {
  const float eps = c.eps, weight_decay = c.weight_decay;  // in locals, as in local_step
  const float bound = adam_step_bound(c.beta1, c.beta2);
  for (std::size_t i = 0; i < n; ++i) {
    elementwise::sync_end(eps, weight_decay, bound, lrs, p[i], p_sync[i], m[i], u[i], v[i]);
  }
}

}  // namespace

void sync_begin(const Config& c, float* u, const float* v, float lrs, std::size_t n) {
  check_sync(lrs);
  sync_scale(c, u, v, n);
}

void sync_end(const Config& c, float* p, float* p_sync, float* m, float* u, const float* v, float* lrs, std::size_t n) {
  // A dormant element moved by weight decay alone since the last sync, alike on every rank: it
  // keeps p; its averaged u is compression error. Any other moves from p_sync at most as far as
  // the local steps could have taken it, lrs·(C + wd·|p_sync|) (frozen_variance.h).
  check_sync(*lrs);
  sync_ends(c, p, p_sync, m, u, v, *lrs, n);
  *lrs = 0.0f;
}

}  // namespace onebit::optim::zero_one_adam
