// 1-bit Adam's arithmetic (plugin/optim): the phase boundary and each update, element by element,
// against the formulas of algorithm.md written out here in the same fp32 operations.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "plugin/optim/onebit_adam.h"

namespace onebit::optim {
namespace {

TEST(OnebitAdam, FreezeStepSplitsTheStages) {
  AdamConfig c;
  c.freeze_step = 3;
  EXPECT_FALSE(compressing(c, 0));
  EXPECT_FALSE(compressing(c, 2));
  EXPECT_TRUE(compressing(c, 3));
  EXPECT_TRUE(compressing(c, 100));
  c.freeze_step = 0;
  EXPECT_TRUE(compressing(c, 0));
}

TEST(OnebitAdam, UpdatesFollowTheFormulas) {
  AdamConfig c{0.01f, 0.9f, 0.999f, 1e-8f, 0.1f, 10};
  std::vector<float> p = {1.0f, -2.0f, 0.5f}, m = {0.1f, 0.0f, -0.3f}, v = {0.01f, 0.0f, 0.2f};
  const std::vector<float> g = {0.5f, -1.0f, 2.0f};
  std::vector<float> p2 = p, m2 = m, v2 = v;
  warmup_step(c, p.data(), m.data(), v.data(), g.data(), p.size());
  for (std::size_t i = 0; i < p.size(); ++i) {
    m2[i] = c.beta1 * m2[i] + (1.0f - c.beta1) * g[i];
    v2[i] = c.beta2 * v2[i] + (1.0f - c.beta2) * g[i] * g[i];
    p2[i] = p2[i] - c.lr * (m2[i] / (std::sqrt(v2[i]) + c.eps) + c.weight_decay * p2[i]);
    EXPECT_EQ(m[i], m2[i]);
    EXPECT_EQ(v[i], v2[i]);
    EXPECT_EQ(p[i], p2[i]);
  }
  // Compression stage: the momentum from the local gradient; then the update with v unchanged.
  momentum_step(c, m.data(), g.data(), m.size());
  const std::vector<float> frozen = v;
  apply_step(c, p.data(), m.data(), v.data(), p.size());
  for (std::size_t i = 0; i < p.size(); ++i) {
    m2[i] = c.beta1 * m2[i] + (1.0f - c.beta1) * g[i];
    p2[i] = p2[i] - c.lr * (m2[i] / (std::sqrt(v2[i]) + c.eps) + c.weight_decay * p2[i]);
    EXPECT_EQ(m[i], m2[i]);
    EXPECT_EQ(p[i], p2[i]);
    EXPECT_EQ(v[i], frozen[i]);
  }
}

}  // namespace
}  // namespace onebit::optim
