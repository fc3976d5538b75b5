#include "plugin/optim/onebit_adam.h"

#include <cmath>

#include "common/params.h"

namespace onebit::optim {
namespace {

// One formula for both stages' parameter update. No bias correction, decoupled weight decay
// (the paper and DeepSpeed).
inline float updated(const AdamConfig& c, float p, float m, float v) {
  return p - c.lr * (m / (std::sqrt(v) + c.eps) + c.weight_decay * p);
}

}  // namespace

std::int64_t freeze_step(std::int64_t requested) {
  return param::FreezeStep() >= 0 ? param::FreezeStep() : requested;
}

bool compressing(const AdamConfig& config, std::int64_t step) { return step >= config.freeze_step; }

void warmup_step(const AdamConfig& c, float* p, float* m, float* v, const float* g, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    m[i] = c.beta1 * m[i] + (1.0f - c.beta1) * g[i];
    v[i] = c.beta2 * v[i] + (1.0f - c.beta2) * g[i] * g[i];
    p[i] = updated(c, p[i], m[i], v[i]);
  }
}

void momentum_step(const AdamConfig& c, float* m, const float* g, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) m[i] = c.beta1 * m[i] + (1.0f - c.beta1) * g[i];
}

void apply_step(const AdamConfig& c, float* p, const float* m, const float* v, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) p[i] = updated(c, p[i], m[i], v[i]);
}

}  // namespace onebit::optim
