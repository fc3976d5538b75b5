// The optimizers' arithmetic (optim): 1-bit Adam's phase boundary and each update, element by
// element, against the formulas of docs/algorithm.md written out here in the same fp32 operations; the
// frozen-variance rules (optim/frozen_variance.h: dormant elements, Adam's step bound) in
// every step that divides by a variance it no longer updates.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "onebit/onebit.h"
#include "onebit/optimizer_report.hpp"
#include "optim/adam_elementwise.h"
#include "optim/frozen_variance.h"
#include "optim/lamb_rules.h"
#include "optim/onebit_adam.h"
#include "optim/onebit_lamb.h"
#include "optim/tiled_sums.h"
#include "optim/variance_measures.h"
#include "optim/zero_one_adam.h"

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

// The momentum step that keeps the momentum as it was (what a shim restores after a failed
// average): the same new momentum as momentum_step, bit for bit, and m_before the old one; through
// the ABI, an m_before overlapping m is refused, naming it, with both arrays untouched.
TEST(OnebitAdam, MomentumStepKeepingKeepsTheOldMomentumAndStepsAsMomentumStep) {
  const onebit_adam_config_t c{0.01f, 0.9f, 0.999f, 1e-8f, 0.0f, 0};
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  std::vector<float> m(1027), g(1027);
  for (std::size_t i = 0; i < m.size(); ++i) m[i] = normal(rng), g[i] = normal(rng);
  std::vector<float> stepped = m, kept(m.size()), old = m;
  ASSERT_EQ(onebit_adam_momentum_step(&c, stepped.data(), g.data(), m.size()), ONEBIT_SUCCESS);
  ASSERT_EQ(onebit_adam_momentum_step_keeping(&c, m.data(), kept.data(), g.data(), m.size()), ONEBIT_SUCCESS);
  EXPECT_EQ(m, stepped);
  EXPECT_EQ(kept, old);

  const std::vector<float> before = m;
  EXPECT_EQ(onebit_adam_momentum_step_keeping(&c, m.data(), m.data() + 10, g.data(), 100), ONEBIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(onebit_last_error()).find("m_before overlaps m (100 elements)"), std::string::npos)
      << onebit_last_error();
  EXPECT_EQ(onebit_adam_momentum_step_keeping(&c, m.data(), nullptr, g.data(), 100), ONEBIT_INVALID_ARGUMENT);
  EXPECT_EQ(m, before);
}

// A library built without CUDA (libonebit.so) has the device steps' entry points, and each says
// it cannot run them and where the working ones are, changing nothing.
TEST(OnebitAdam, DeviceStepsWithoutCudaAreRefusedSayingWhere) {
  EXPECT_EQ(onebit_device_steps(), 0);
  const onebit_adam_config_t c{0.01f, 0.9f, 0.999f, 1e-8f, 0.0f, 0};
  std::vector<float> p(4, 1.0f), m(4, 0.5f), v(4, 0.25f), g(4, 2.0f);
  const std::vector<float> before = p;
  EXPECT_EQ(onebit_adam_warmup_step_device(&c, p.data(), m.data(), v.data(), g.data(), 4, nullptr), ONEBIT_UNSUPPORTED);
  EXPECT_NE(std::string(onebit_last_error())
                .find("onebit_adam_warmup_step_device: this library was built without "
                      "CUDA"),
            std::string::npos)
      << onebit_last_error();
  EXPECT_NE(std::string(onebit_last_error()).find("libonebit-nccl-preload.so"), std::string::npos);
  EXPECT_EQ(onebit_adam_momentum_step_device(&c, m.data(), nullptr, g.data(), 4, nullptr), ONEBIT_UNSUPPORTED);
  EXPECT_EQ(onebit_adam_apply_step_device(&c, p.data(), m.data(), v.data(), 4, nullptr), ONEBIT_UNSUPPORTED);
  EXPECT_EQ(p, before);
  EXPECT_STREQ(onebit_result_string(ONEBIT_UNSUPPORTED), "ONEBIT_UNSUPPORTED");

  // The measurements' twins likewise, the answers left as they were.
  std::vector<unsigned char> workspace(onebit_measure_workspace_size(4));
  double change = -1.0;
  std::size_t dormant = 99;
  EXPECT_EQ(
      onebit_adam_variance_change_device(v.data(), m.data(), 4, workspace.data(), workspace.size(), &change, nullptr),
      ONEBIT_UNSUPPORTED);
  EXPECT_NE(std::string(onebit_last_error()).find("onebit_adam_variance_change_device: this library was built without"),
            std::string::npos)
      << onebit_last_error();
  EXPECT_EQ(onebit_dormant_count_device(v.data(), 4, 1e-8f, workspace.data(), workspace.size(), &dormant, nullptr),
            ONEBIT_UNSUPPORTED);
  EXPECT_NE(std::string(onebit_last_error()).find("onebit_dormant_count_device: this library was built without"),
            std::string::npos)
      << onebit_last_error();
  EXPECT_EQ(change, -1.0);
  EXPECT_EQ(dormant, 99u);
}

TEST(ZeroOneAdam, DeviceStepsWithoutCudaAreRefusedSayingWhere) {
  const onebit_zero_one_adam_config_t c{0.01f, 0.9f, 0.999f, 1e-8f, 0.0f, 4, 2, 2, 4};
  std::vector<float> p(4, 1.0f), p_sync(4, 1.0f), m(4, 0.5f), v(4, 0.25f), u(4, 0.125f), g(4, 2.0f);
  const std::vector<float> before = p, u_before = u;
  float lrs = 0.5f;
  EXPECT_EQ(onebit_zero_one_adam_gradient_step_device(&c, p.data(), m.data(), v.data(), g.data(), 4, 1, nullptr),
            ONEBIT_UNSUPPORTED);
  EXPECT_NE(std::string(onebit_last_error())
                .find("onebit_zero_one_adam_gradient_step_device: this library was built "
                      "without CUDA"),
            std::string::npos)
      << onebit_last_error();
  EXPECT_EQ(
      onebit_zero_one_adam_local_step_device(&c, p.data(), m.data(), v.data(), u.data(), &lrs, g.data(), 4, nullptr),
      ONEBIT_UNSUPPORTED);
  EXPECT_EQ(onebit_zero_one_adam_sync_begin_device(&c, u.data(), v.data(), lrs, 4, nullptr), ONEBIT_UNSUPPORTED);
  EXPECT_EQ(
      onebit_zero_one_adam_sync_end_device(&c, p.data(), p_sync.data(), m.data(), u.data(), v.data(), &lrs, 4, nullptr),
      ONEBIT_UNSUPPORTED);
  EXPECT_EQ(p, before);
  EXPECT_EQ(u, u_before);
  EXPECT_EQ(lrs, 0.5f);
}

// The compression-stage update over enough elements that its vector loop runs (in whichever clone
// this CPU selects: avx512f, avx2 or the default), not only its scalar tail: every element equal to
// the rule written out here — dormant elements, clipped directions, weight decay, and an unaligned
// start and length.
TEST(OnebitAdam, ApplyStepsVectorLoopGivesTheScalarRulesBits) {
  AdamConfig c{0.003f, 0.9f, 0.999f, 1e-8f, 0.01f, 0};
  const float bound = adam_step_bound(c.beta1, c.beta2);
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> exponent(-20.0f, 1.0f);
  const std::size_t n = 4099;
  std::vector<float> p(n + 1), m(n + 1), v(n + 1);
  for (std::size_t i = 0; i <= n; ++i) {
    p[i] = normal(rng);
    m[i] = normal(rng) * 0.1f;
    v[i] = i % 7 == 0 ? 0.0f : std::pow(10.0f, exponent(rng));  // dormant, tiny (clipped) and ordinary
  }
  std::vector<float> p2 = p, m2 = m;
  apply_step(c, p.data() + 1, m.data() + 1, v.data() + 1, n);
  std::size_t dormant_seen = 0, clipped_seen = 0;
  for (std::size_t i = 1; i <= n; ++i) {
    const bool asleep = std::sqrt(v[i]) <= c.eps;
    const float momentum = asleep ? 0.0f : m2[i];
    const float direction = std::clamp(momentum / (std::sqrt(v[i]) + c.eps), -bound, bound);
    dormant_seen += asleep;
    clipped_seen += std::fabs(direction) == bound;
    ASSERT_EQ(m[i], momentum) << "element " << i;
    ASSERT_EQ(p[i], p2[i] - c.lr * (direction + c.weight_decay * p2[i])) << "element " << i;
  }
  EXPECT_EQ(p[0], p2[0]);  // the element before the range is untouched
  EXPECT_GT(dormant_seen, 0u);
  EXPECT_GT(clipped_seen, 0u);
}

// Adam's own steps never exceed the bound, whatever the gradients: 200 steps of Adam from zero on
// gradients that swing over 12 orders of magnitude and vanish, for several betas; and the bound is
// nearly reached (a gradient that grows geometrically at the rate that makes Cauchy–Schwarz tight).
TEST(FrozenVariance, AdamStaysWithinItsStepBound) {
  const float betas[][2] = {{0.9f, 0.999f}, {0.8f, 0.99f}, {0.0f, 0.9f}, {0.5f, 0.3f}};
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> exponent(-12.0f, 0.0f), coin(0.0f, 1.0f);
  for (const auto& b : betas) {
    const double bound = adam_step_bound(b[0], b[1]);
    double largest = 0;
    for (int trial = 0; trial < 50; ++trial) {
      double m = 0, v = 0;
      for (int t = 0; t < 200; ++t) {
        const double g = coin(rng) < 0.3 ? 0.0 : (coin(rng) < 0.5 ? -1 : 1) * std::pow(10.0, exponent(rng));
        m = b[0] * m + (1 - b[0]) * g;
        v = b[1] * v + (1 - b[1]) * g * g;
        if (v > 0) largest = std::max(largest, std::fabs(m) / std::sqrt(v));
      }
    }
    EXPECT_LE(largest, bound * (1 + 1e-6)) << "betas " << b[0] << ", " << b[1];
    // The tight case (Cauchy–Schwarz's equality): g changes by β2/β1 a step, all of one sign.
    if (b[0] > 0) {
      const double rate = static_cast<double>(b[1]) / b[0];
      double m = 0, v = 0, g = rate > 1 ? 1e-30 : 1e30;
      for (int t = 0; t < 5000 && g >= 1e-30 && g <= 1e30; ++t) {
        m = b[0] * m + (1 - b[0]) * g;
        v = b[1] * v + (1 - b[1]) * g * g;
        g *= rate;
      }
      EXPECT_GT(std::fabs(m) / std::sqrt(v), 0.99 * bound) << "betas " << b[0] << ", " << b[1];
    }
  }
  EXPECT_NEAR(adam_step_bound(0.9f, 0.999f), 7.2703, 1e-3);
  EXPECT_EQ(adam_step_bound(0.0f, 0.99f), static_cast<float>(1.0 / std::sqrt(1.0 - static_cast<double>(0.99f))));
  EXPECT_TRUE(std::isinf(adam_step_bound(0.99f, 0.9f)));  // β1² ≥ β2: Adam has no bound, nor do we
  EXPECT_EQ(onebit_adam_step_bound(0.9f, 0.999f), adam_step_bound(0.9f, 0.999f));
}

// v = {0, eps² / 4, 4·eps², 0.01}: the first two are dormant (√v ≤ eps), the last two are not — the
// third only just (√v = 2·eps): the floor is eps itself, not "exactly zero". The third's direction
// 0.37 / 3e-4 is far past Adam's bound (7.27): clipped; the fourth's, 0.37 / 0.1001, is not.
constexpr float kEps = 1e-4f;
const std::vector<float> kFrozen = {0.0f, kEps* kEps / 4, 4 * kEps* kEps, 0.01f};
const std::vector<float> kCompressed = {0.37f, -0.37f, 0.37f, -0.37f};  // ±scale, as a 1-bit average is

float bound_of(float beta1, float beta2) { return adam_step_bound(beta1, beta2); }

TEST(FrozenVariance, DormantCountedByTheCAbi) {
  std::size_t count = 99;
  ASSERT_EQ(onebit_dormant_count(kFrozen.data(), kFrozen.size(), kEps, &count), ONEBIT_SUCCESS);
  EXPECT_EQ(count, 2u);
  ASSERT_EQ(onebit_dormant_count(kFrozen.data(), 0, kEps, &count), ONEBIT_SUCCESS);
  EXPECT_EQ(count, 0u);
  EXPECT_EQ(onebit_dormant_count(kFrozen.data(), kFrozen.size(), 0.0f, &count), ONEBIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(onebit_last_error()).find("eps 0"), std::string::npos) << onebit_last_error();
  EXPECT_EQ(onebit_dormant_count(nullptr, 3, kEps, &count), ONEBIT_INVALID_ARGUMENT);
}

// The line rank 0 prints at the freeze (the Python shims print the same words).
TEST(FrozenVariance, FreezeReportNamesTheDormantElementsByGroup) {
  const std::vector<float> live = {0.5f, 0.25f};
  EXPECT_EQ(freeze_report("onebit::OnebitAdam", 3, {{kFrozen.data(), kFrozen.size(), kEps}, {live.data(), 2, kEps}}),
            "onebit: onebit::OnebitAdam: variance frozen from step 3; 2 of 6 elements are dormant (sqrt(v) <= eps: no "
            "gradient reached them) and take no momentum step, only weight decay: group 0 (2 of 4)");
  EXPECT_EQ(freeze_report("x", 7, {{live.data(), 2, kEps}}),
            "onebit: x: variance frozen from step 7; 0 of 2 elements are dormant");
  try {
    freeze_report("x", 0, {{kFrozen.data(), kFrozen.size(), 0.0f}});
    ADD_FAILURE() << "eps 0 was accepted";
  } catch (const CallError& error) {
    EXPECT_EQ(error.code(), ONEBIT_INVALID_ARGUMENT);
  }
}

// The C core's texts are written as snprintf writes: cut to the buffer, NUL-terminated, the whole
// length told. A compressed step's failure names the step and stage, and for NaN or Inf the causes.
TEST(FrozenVariance, TheCoresTextsFitAnyBuffer) {
  const std::size_t dormant[] = {1}, counts[] = {9};
  char text[16];
  std::size_t length = 0;
  ASSERT_EQ(onebit_freeze_report("w", 4, dormant, counts, 1, text, sizeof(text), &length), ONEBIT_SUCCESS);
  EXPECT_STREQ(text, "w: variance fro");
  const std::string whole =
      "w: variance frozen from step 4; 1 of 9 elements are dormant (sqrt(v) <= eps: no gradient "
      "reached them) and take no momentum step, only weight decay: group 0 (1 of 9)";
  EXPECT_EQ(length, whole.size());
  std::vector<char> room(whole.size() + 1, 'x');
  ASSERT_EQ(onebit_freeze_report("w", 4, dormant, counts, 1, room.data(), room.size(), &length), ONEBIT_SUCCESS);
  EXPECT_EQ(std::string(room.data()), whole);
  EXPECT_EQ(onebit_freeze_report("w", 4, dormant, counts, 1, nullptr, 0, &length), ONEBIT_SUCCESS);
  EXPECT_EQ(length, whole.size());
  EXPECT_EQ(onebit_freeze_report("w", 4, nullptr, counts, 1, text, sizeof(text), &length), ONEBIT_INVALID_ARGUMENT);
  const CallError numeric = step_failure(ONEBIT_NUMERIC_ERROR, "a scale is NaN or Inf", "w", 7, "compression stage");
  EXPECT_EQ(numeric.code(), ONEBIT_NUMERIC_ERROR);
  EXPECT_EQ(std::string(numeric.what())
                .rfind("w step 7 (compression stage): a scale is NaN or Inf. A momentum turned "
                       "non-finite",
                       0),
            0u)
      << numeric.what();
  const CallError timeout = step_failure(ONEBIT_TIMEOUT, "rank 1 did not answer", "w", 7, "compression stage");
  EXPECT_STREQ(timeout.what(), "w step 7 (compression stage): rank 1 did not answer");
}

TEST(FrozenVariance, OnebitAdamHoldsDormantAndClipsTheRest) {
  const AdamConfig c{0.01f, 0.9f, 0.999f, kEps, 0.1f, 0};
  const float bound = bound_of(c.beta1, c.beta2);
  std::vector<float> p = {1.0f, -2.0f, 0.5f, 3.0f}, m = kCompressed;
  const std::vector<float> p0 = p;
  apply_step(c, p.data(), m.data(), kFrozen.data(), p.size());
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(m[i], 0.0f) << i;
    EXPECT_EQ(p[i], p0[i] - c.lr * (0.0f + c.weight_decay * p0[i])) << i;
  }
  EXPECT_EQ(m[2], kCompressed[2]);  // the momentum is kept; only the step is bounded
  EXPECT_EQ(p[2], p0[2] - c.lr * (bound + c.weight_decay * p0[2]));
  const float direction = kCompressed[3] / (std::sqrt(kFrozen[3]) + kEps);
  ASSERT_LT(std::fabs(direction), bound);
  EXPECT_EQ(p[3], p0[3] - c.lr * (direction + c.weight_decay * p0[3]));
}

TEST(FrozenVariance, ZeroOneAdamOnlyWhereVarianceIsKept) {
  onebit_zero_one_adam_config_t c{0.01f, 0.9f, 0.999f, kEps, 0.1f, 100, 16, 32678, 16};
  const float bound = bound_of(c.beta1, c.beta2);
  const std::vector<float> g = kCompressed;
  std::vector<float> p = {1.0f, -2.0f, 0.5f, 3.0f}, m(4, 0.0f), v = kFrozen;
  // A variance step is Adam's: v takes the gradient, nothing is masked or clipped.
  std::vector<float> p0 = p;
  zero_one_adam::gradient_step(c, p.data(), m.data(), v.data(), g.data(), 4, true);
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(m[i], (1.0f - c.beta1) * g[i]) << i;
    EXPECT_EQ(p[i], p0[i] - c.lr * (m[i] / (std::sqrt(v[i]) + c.eps) + c.weight_decay * p0[i])) << i;
  }
  // A compressed step keeps v: the dormant elements' momentum is 0 (weight decay alone), the
  // third's direction is clipped.
  v = kFrozen;
  p0 = p;
  zero_one_adam::gradient_step(c, p.data(), m.data(), v.data(), g.data(), 4, false);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(m[i], 0.0f) << i;
    EXPECT_EQ(p[i], p0[i] - c.lr * (0.0f + c.weight_decay * p0[i])) << i;
  }
  EXPECT_EQ(p[2], p0[2] - c.lr * (bound + c.weight_decay * p0[2]));
  // Local steps, then a sync: a dormant element keeps the p of its local steps and ignores u's
  // average; the third moves from p_sync at most lrs·(C + wd·|p_sync|); the fourth as written.
  std::vector<float> u(4, 0.0f), p_sync = p;
  float lrs = 0.0f;
  p0 = p;
  zero_one_adam::local_step(c, p.data(), m.data(), v.data(), u.data(), &lrs, g.data(), 4);
  EXPECT_EQ(m[0], 0.0f);
  EXPECT_EQ(p[0], p0[0] - c.lr * (0.0f + c.weight_decay * p0[0]));
  EXPECT_EQ(p[2], p0[2] - c.lr * (bound + c.weight_decay * p0[2]));
  const std::vector<float> after_local = p;
  zero_one_adam::sync_begin(c, u.data(), v.data(), lrs, 4);
  u = {0.37f, -0.37f, 0.37f, -0.0037f};  // what a compressed average returns
  const std::vector<float> averaged = u;
  zero_one_adam::sync_end(c, p.data(), p_sync.data(), m.data(), u.data(), v.data(), &lrs, 4);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(p[i], after_local[i]) << i;
    EXPECT_EQ(p_sync[i], after_local[i]) << i;
    EXPECT_EQ(m[i], 0.0f) << i;
  }
  const float reach = c.lr * (bound + c.weight_decay * std::fabs(p0[2]));
  EXPECT_EQ(p[2], p0[2] + reach);
  EXPECT_EQ(p[3], p0[3] + averaged[3] / (std::sqrt(v[3]) + c.eps));
  EXPECT_EQ(p_sync[3], p[3]);
}

TEST(FrozenVariance, OnebitLambLeavesDormantOutOfTheFactor) {
  onebit_lamb_config_t c{0.01f, 0.9f, 0.999f, kEps, 0.0f, 0, 10.0, 0.01, 0.9, 4.0, 0.5, 0.5};
  onebit_lamb_layer_t layer{1.0, 1.0, 1.0, 1.0};
  // The dormant elements' fresh variance falls to 0, which would make their ratio (√v+ε)/ε up to
  // 1.5 and raise the whole layer's factor; the live ones' fresh variance follows the rebuilt ±3.7.
  std::vector<float> p = {1.0f, -2.0f, 0.5f, 3.0f}, m = kCompressed, m_last(4, 0.0f), fresh(4, 0.0f);
  const std::vector<float> p0 = p;
  lamb::apply_step(c, layer, p.data(), m.data(), m_last.data(), kFrozen.data(), fresh.data(), 4);
  EXPECT_EQ(m[0], 0.0f);
  EXPECT_EQ(m[1], 0.0f);
  EXPECT_EQ(fresh[0], 0.0f);  // the rebuilt gradient of a dormant element is 0
  EXPECT_EQ(p[0], p0[0]);     // no weight decay here: it does not move
  EXPECT_EQ(p[1], p0[1]);
  // The factor is the live elements' max((√v+ε)/(√v_fresh+ε)) (0.855), within factor_min 0.5.
  float live = 0.0f;
  for (std::size_t i = 2; i < 4; ++i)
    live = std::max(live, (std::sqrt(kFrozen[i]) + kEps) / (std::sqrt(fresh[i]) + kEps));
  EXPECT_EQ(layer.last_factor, std::max(0.5, static_cast<double>(live)));
  const float step = static_cast<float>(static_cast<double>(c.lr) * layer.lamb_coeff);
  for (std::size_t i = 2; i < 4; ++i) {  // not clipped: LAMB takes the dormant rule only
    EXPECT_EQ(p[i], p0[i] - step * (kCompressed[i] / (std::sqrt(kFrozen[i]) + kEps))) << i;
  }
  // All dormant: the factor is 1.
  onebit_lamb_layer_t asleep{1.0, 1.0, 1.0, 1.0};
  std::vector<float> q = {1.0f, 2.0f}, mq = {0.3f, -0.3f}, lq(2, 0.0f), fq(2, 0.0f), vq(2, 0.0f);
  lamb::apply_step(c, asleep, q.data(), mq.data(), lq.data(), vq.data(), fq.data(), 2);
  EXPECT_EQ(asleep.last_factor, 1.0);
  EXPECT_EQ(q[0], 1.0f);
}

// tiled_sums.h's order of sums (which the CUDA steps share): every element's term taken exactly
// once, whatever the count (within a tile, across tiles, across levels of tiles), and the sums
// exact where every partial sum is (integers): the order covers each element, no more, no less.
TEST(TiledSums, TakeEveryElementOnce) {
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{255}, std::size_t{257}, tiled::kTile,
                              tiled::kTile + 1, 3 * tiled::kTile + 5, tiled::kTile * tiled::kTile + 7}) {
    std::vector<int> taken(n, 0);
    const tiled::Sums sums = tiled::total(tiled::tile_sums(n, [&](std::size_t i) {
      ++taken[i];
      return tiled::Sums{static_cast<double>(i % 1000), 1.0, static_cast<float>(i % 4099)};
    }));
    EXPECT_TRUE(std::all_of(taken.begin(), taken.end(), [](int t) { return t == 1; })) << n;
    double want = 0;
    for (std::size_t i = 0; i < n; ++i) want += static_cast<double>(i % 1000);
    EXPECT_EQ(sums.first, want) << n;
    EXPECT_EQ(sums.second, static_cast<double>(n)) << n;
    EXPECT_EQ(sums.peak, static_cast<float>(n == 0 ? 0 : std::min<std::size_t>(n - 1, 4098))) << n;
  }
}

// The workspace the measurements' device twins ask for: one sum per started tile, at least one.
TEST(TiledSums, MeasureWorkspaceIsOneSumPerTile) {
  EXPECT_EQ(onebit_measure_workspace_size(0), sizeof(tiled::Sums));
  EXPECT_EQ(onebit_measure_workspace_size(1), sizeof(tiled::Sums));
  EXPECT_EQ(onebit_measure_workspace_size(tiled::kTile), sizeof(tiled::Sums));
  EXPECT_EQ(onebit_measure_workspace_size(tiled::kTile + 1), 2 * sizeof(tiled::Sums));
  EXPECT_EQ(sizeof(tiled::Sums), 24u);  // onebit.h says so
}

// The variance change sums in the tiled order: over values whose sums are exact in any order
// (integers), it is the ratio of the exact sums, whatever the count — within a tile, across
// tiles, across levels of tiles.
TEST(TiledSums, VarianceChangeIsTheRatioOfItsSums) {
  for (const std::size_t n : {std::size_t{1}, std::size_t{300}, tiled::kTile + 1, tiled::kTile * tiled::kTile + 7}) {
    std::vector<float> v(n), then(n);
    double moved = 0, total = 0;
    for (std::size_t i = 0; i < n; ++i) {
      v[i] = static_cast<float>(i % 97 + 1);
      then[i] = static_cast<float>(i % 5);
      moved += std::fabs(static_cast<double>(v[i]) - then[i]);
      total += v[i];
    }
    double change = -1;
    ASSERT_EQ(onebit_adam_variance_change(v.data(), then.data(), n, &change), ONEBIT_SUCCESS);
    EXPECT_EQ(change, moved / total) << n;
  }
  // v all zero and v_then not: all of it moved.
  const std::vector<float> zeros(3, 0.0f), some = {0.0f, 2.0f, 0.5f};
  double change = -1;
  ASSERT_EQ(onebit_adam_variance_change(zeros.data(), some.data(), 3, &change), ONEBIT_SUCCESS);
  EXPECT_EQ(change, 1.0);
}

// Over values whose sums round, the variance change is the tiled order's, bit for bit (the order
// the device twin shares), not element order's: the two differ in the last bits here.
TEST(TiledSums, VarianceChangeSumsInTheTiledOrder) {
  const std::size_t n = 37 * tiled::kTile + 77;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> uniform(0.0f, 1e-3f);
  std::vector<float> v(n), then(n);
  for (std::size_t i = 0; i < n; ++i) {
    v[i] = uniform(rng);
    then[i] = uniform(rng);
  }
  const tiled::Sums sums =
      tiled::sum(n, [&](std::size_t i) { return variance_measures::variance_change_terms(v[i], then[i]); });
  double moved = 0, total = 0;  // element order
  for (std::size_t i = 0; i < n; ++i) {
    moved += std::fabs(static_cast<double>(v[i]) - then[i]);
    total += v[i];
  }
  ASSERT_NE(sums.first / sums.second, moved / total) << "the data do not tell the orders apart";
  double change = -1;
  ASSERT_EQ(onebit_adam_variance_change(v.data(), then.data(), n, &change), ONEBIT_SUCCESS);
  EXPECT_EQ(change, sums.first / sums.second);
}

// The workspace the device steps ask for: one sum per started tile of each layer, at least one.
TEST(OnebitLamb, WorkspaceSizeIsOneSumPerTileOfEachLayer) {
  const std::size_t counts[] = {0, 1, tiled::kTile, tiled::kTile + 1};
  EXPECT_EQ(onebit_lamb_workspace_size(counts, 1), sizeof(tiled::Sums));  // none: still one
  EXPECT_EQ(onebit_lamb_workspace_size(counts, 2), sizeof(tiled::Sums));
  EXPECT_EQ(onebit_lamb_workspace_size(counts, 4), 4 * sizeof(tiled::Sums));
  EXPECT_EQ(onebit_lamb_workspace_size(nullptr, 0), sizeof(tiled::Sums));
  EXPECT_EQ(onebit_lamb_workspace_size(nullptr, 2), 0u);
  EXPECT_NE(std::string(onebit_last_error()).find("counts is NULL with 2 layers"), std::string::npos)
      << onebit_last_error();
}

TEST(OnebitLamb, DeviceStepsWithoutCudaAreRefusedSayingWhere) {
  const onebit_lamb_config_t c{0.01f, 0.9f, 0.999f, 1e-8f, 0.0f, 2, 10.0, 0.01, 0.9, 4.0, 0.5, 0.1};
  onebit_lamb_layer_t layer{1.0, 1.0, 1.0, 1.0};
  const onebit_lamb_layer_t layer_before = layer;
  std::vector<float> p(4, 1.0f), m(4, 0.5f), m_last(4, 0.0f), v(4, 0.25f), fresh(4, 0.25f), g(4, 2.0f);
  const std::vector<float> p_before = p, m_before = m;
  const std::size_t counts[] = {4};
  std::vector<unsigned char> workspace(onebit_lamb_workspace_size(counts, 1));
  EXPECT_EQ(onebit_lamb_warmup_steps_device(&c, &layer, counts, 1, 0, p.data(), m.data(), v.data(), fresh.data(),
                                            g.data(), workspace.data(), workspace.size(), nullptr),
            ONEBIT_UNSUPPORTED);
  EXPECT_NE(std::string(onebit_last_error()).find("onebit_lamb_warmup_steps_device: this library was built without"),
            std::string::npos)
      << onebit_last_error();
  EXPECT_EQ(onebit_lamb_scaling_coeffs_device(m.data(), counts, 1, &layer, workspace.data(), workspace.size(), nullptr),
            ONEBIT_UNSUPPORTED);
  EXPECT_EQ(onebit_lamb_momentum_step_device(&c, &layer, m.data(), m_last.data(), g.data(), 4, nullptr),
            ONEBIT_UNSUPPORTED);
  EXPECT_EQ(onebit_lamb_apply_steps_device(&c, &layer, counts, 1, p.data(), m.data(), m_last.data(), v.data(),
                                           fresh.data(), workspace.data(), workspace.size(), nullptr),
            ONEBIT_UNSUPPORTED);
  EXPECT_EQ(p, p_before);
  EXPECT_EQ(m, m_before);
  EXPECT_EQ(layer.lamb_coeff, layer_before.lamb_coeff);
  EXPECT_EQ(layer.last_factor, layer_before.last_factor);
}

// The vectorized loops (optim/vector_clones.h: one clone per width, chosen at load) against the
// elementwise rule applied one element at a time here: long enough for every width's vector body
// and a tail, with dormant, NaN and infinite elements. Equal bits, or NaN on both sides (a NaN's
// payload may come from either operand of a commuted operation).
struct Elements {
  std::vector<float> p, m, v, g, u, p_sync;
};

Elements random_elements(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Elements e;
  for (std::size_t i = 0; i < n; ++i) {
    e.p.push_back(normal(rng));
    e.m.push_back(0.1f * normal(rng));
    const float root = 0.03f * normal(rng);
    e.v.push_back(i % 7 == 0 ? 0.0f : (i % 11 == 0 ? 1e-18f : root * root));  // dormant: sqrt(v) <= eps
    e.g.push_back(normal(rng));
    e.u.push_back(0.01f * normal(rng));
    e.p_sync.push_back(e.p.back() + 0.001f * normal(rng));
  }
  e.g[5] = NAN;
  e.g[9] = INFINITY;
  e.m[13] = -INFINITY;
  return e;
}

void expect_same_elements(const std::vector<float>& loop, const std::vector<float>& rule, const char* what) {
  ASSERT_EQ(loop.size(), rule.size());
  for (std::size_t i = 0; i < loop.size(); ++i) {
    if (std::isnan(loop[i]) && std::isnan(rule[i])) continue;
    ASSERT_EQ(std::memcmp(&loop[i], &rule[i], sizeof(float)), 0)
        << what << " element " << i << ": loop " << loop[i] << ", rule " << rule[i];
  }
}

TEST(VectorClones, ZeroOneAdamLoopsAreTheElementwiseRuleAtEveryWidth) {
  namespace rule = elementwise;
  const onebit_zero_one_adam_config_t c{0.01f, 0.9f, 0.999f, 1e-8f, 0.1f, 100, 16, 32678, 16};
  const float bound = adam_step_bound(c.beta1, c.beta2);
  const std::size_t n = 1037;
  for (const bool update_variance : {true, false}) {
    Elements loop = random_elements(n, 1), one = loop;
    zero_one_adam::gradient_step(c, loop.p.data(), loop.m.data(), loop.v.data(), loop.g.data(), n, update_variance);
    for (std::size_t i = 0; i < n; ++i) {
      if (update_variance) one.v[i] = rule::variance(c.beta2, one.v[i], one.g[i]);
      one.m[i] = rule::momentum(c.beta1, one.m[i], one.g[i]);
      if (!update_variance && rule::dormant(one.v[i], c.eps)) one.m[i] = 0.0f;
      one.p[i] = rule::frozen_update(c.lr, c.eps, c.weight_decay, update_variance ? INFINITY : bound, one.p[i],
                                     one.m[i], one.v[i]);
    }
    expect_same_elements(loop.p, one.p, "gradient_step p");
    expect_same_elements(loop.m, one.m, "gradient_step m");
    expect_same_elements(loop.v, one.v, "gradient_step v");
  }
  Elements loop = random_elements(n, 2), one = loop;
  float lrs = 0.5f;
  zero_one_adam::local_step(c, loop.p.data(), loop.m.data(), loop.v.data(), loop.u.data(), &lrs, loop.g.data(), n);
  for (std::size_t i = 0; i < n; ++i) {
    one.m[i] = rule::dormant(one.v[i], c.eps) ? 0.0f : rule::momentum(c.beta1, one.m[i], one.g[i]);
    const float step = rule::frozen_step(c.lr, c.eps, c.weight_decay, bound, one.p[i], one.m[i], one.v[i]);
    one.p[i] = one.p[i] - step;
    one.u[i] = one.u[i] - step;
  }
  expect_same_elements(loop.p, one.p, "local_step p");
  expect_same_elements(loop.m, one.m, "local_step m");
  expect_same_elements(loop.u, one.u, "local_step u");
  zero_one_adam::sync_begin(c, loop.u.data(), loop.v.data(), lrs, n);
  for (std::size_t i = 0; i < n; ++i) one.u[i] = rule::sync_scaled(one.u[i], one.v[i], c.eps);
  expect_same_elements(loop.u, one.u, "sync_begin u");
  const float lrs_before = lrs;
  zero_one_adam::sync_end(c, loop.p.data(), loop.p_sync.data(), loop.m.data(), loop.u.data(), loop.v.data(), &lrs, n);
  for (std::size_t i = 0; i < n; ++i) {
    rule::sync_end(c.eps, c.weight_decay, bound, lrs_before, one.p[i], one.p_sync[i], one.m[i], one.u[i], one.v[i]);
  }
  expect_same_elements(loop.p, one.p, "sync_end p");
  expect_same_elements(loop.p_sync, one.p_sync, "sync_end p_sync");
  expect_same_elements(loop.m, one.m, "sync_end m");
  expect_same_elements(loop.u, one.u, "sync_end u");
}

TEST(VectorClones, OnebitAdamAndLambLoopsAreTheElementwiseRuleAtEveryWidth) {
  const std::size_t n = 1037;
  const AdamConfig adam{0.01f, 0.9f, 0.999f, 1e-8f, 0.1f, 0};
  Elements loop = random_elements(n, 3), one = loop;
  apply_step(adam, loop.p.data(), loop.m.data(), loop.v.data(), n);
  const float bound = adam_step_bound(adam.beta1, adam.beta2);
  for (std::size_t i = 0; i < n; ++i) {
    one.m[i] = elementwise::dormant(one.v[i], adam.eps) ? 0.0f : one.m[i];
    one.p[i] = elementwise::frozen_update(adam.lr, adam.eps, adam.weight_decay, bound, one.p[i], one.m[i], one.v[i]);
  }
  expect_same_elements(loop.p, one.p, "apply_step p");
  expect_same_elements(loop.m, one.m, "apply_step m");

  const onebit_lamb_config_t c{0.01f, 0.9f, 0.999f, 1e-8f, 0.1f, 0, 10.0, 0.01, 0.9, 4.0, 0.5, 0.1};
  lamb::Layer layer = lamb::initial_layer();
  layer.scaling_coeff = 1.5;
  loop = random_elements(n, 4);
  one = loop;
  std::vector<float> m_last(n), m_last_one(n);
  lamb::momentum_step(c, layer, loop.m.data(), m_last.data(), loop.g.data(), n);
  for (std::size_t i = 0; i < n; ++i) {
    m_last_one[i] = one.m[i];
    one.m[i] = lamb::scaled_momentum(c, 1.5f, m_last_one[i], one.g[i]);
  }
  expect_same_elements(loop.m, one.m, "1-bit LAMB momentum_step m");
  expect_same_elements(m_last, m_last_one, "1-bit LAMB momentum_step m_last");
}

}  // namespace
}  // namespace onebit::optim
