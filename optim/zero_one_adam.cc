#include "optim/zero_one_adam.h"

#include <algorithm>
#include <limits>

#include "common/error.h"
#include "optim/adam_elementwise.h"
#include "optim/frozen_variance.h"

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

void gradient_step(const Config& c, float* p, float* m, float* v, const float* g, std::size_t n, bool update_variance) {
  const float bound = update_variance ? std::numeric_limits<float>::infinity() : adam_step_bound(c.beta1, c.beta2);
  for (std::size_t i = 0; i < n; ++i) {
    if (update_variance) v[i] = elementwise::variance(c.beta2, v[i], g[i]);
    m[i] = elementwise::momentum(c.beta1, m[i], g[i]);
    if (!update_variance && dormant(v[i], c.eps)) m[i] = 0.0f;  // g was compressed, v kept
    p[i] = elementwise::frozen_update(c.lr, c.eps, c.weight_decay, bound, p[i], m[i], v[i]);
  }
}

void local_step(const Config& c, float* p, float* m, const float* v, float* u, float* lrs, const float* g,
                std::size_t n) {
  const float bound = adam_step_bound(c.beta1, c.beta2);
  for (std::size_t i = 0; i < n; ++i) {
    m[i] = dormant(v[i], c.eps) ? 0.0f : elementwise::momentum(c.beta1, m[i], g[i]);
    const float step = elementwise::frozen_step(c.lr, c.eps, c.weight_decay, bound, p[i], m[i], v[i]);
    p[i] = p[i] - step;
    u[i] = u[i] - step;
  }
  *lrs += c.lr;
}

void check_sync(float lrs) {
  ONEBIT_CHECK(lrs > 0, ONEBIT_INVALID_ARGUMENT, "0/1 Adam sync with a learning-rate sum of ", lrs,
               " since the last sync (need > 0: sync_end divides by it; was every lr 0?)");
}

void sync_begin(const Config& c, float* u, const float* v, float lrs, std::size_t n) {
  check_sync(lrs);
  for (std::size_t i = 0; i < n; ++i) u[i] = elementwise::sync_scaled(u[i], v[i], c.eps);
}

void sync_end(const Config& c, float* p, float* p_sync, float* m, float* u, const float* v, float* lrs, std::size_t n) {
  // A dormant element moved by weight decay alone since the last sync, alike on every rank: it
  // keeps p; its averaged u is compression error. Any other moves from p_sync at most as far as
  // the local steps could have taken it, lrs·(C + wd·|p_sync|) (frozen_variance.h).
  check_sync(*lrs);
  const float bound = adam_step_bound(c.beta1, c.beta2);
  for (std::size_t i = 0; i < n; ++i) {
    elementwise::sync_end(c.eps, c.weight_decay, bound, *lrs, p[i], p_sync[i], m[i], u[i], v[i]);
  }
  *lrs = 0.0f;
}

}  // namespace onebit::optim::zero_one_adam
