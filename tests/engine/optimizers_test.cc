// The 0/1 Adam and 1-bit LAMB shims (include/onebit/zero_one_adam.hpp, onebit_lamb.hpp) with ranks
// as real processes, against replays of their rules written out again here from onebit.h and
// docs/design/optimizer-rules.md — not calling the C core — with exact sums for the full-precision averages and the
// fp32 oracle for the compressed ones; checkpoints mid-compression, and under another schedule; a
// failed sync step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "onebit/onebit.h"
#include "onebit/onebit_adam.hpp"
#include "onebit/onebit_lamb.hpp"
#include "onebit/zero_one_adam.hpp"
#include "tests/support/float32_oracle.h"
#include "tests/support/loopback_comm.h"
#include "tests/support/multiprocess.h"
#include "tests/support/rank_record.h"

namespace onebit::testing {
namespace {

constexpr int kWorld = 4;  // averages of integers are exact: sums are, and ÷4 is
constexpr std::size_t kSizes[2] = {1000, 37};
constexpr std::size_t kTotal = kSizes[0] + kSizes[1];

// Elements that get no gradient while the variance is measured (every 50th, from 7) and normal ones
// afterwards: dormant elements (onebit.h), a unit that wakes up after the freeze.
bool sleeps(std::size_t i) { return i % 50 == 7; }

// Rank r's gradient at step t for one group: integers where the step averages exactly (0 for the
// sleeping elements), else normal.
std::vector<float> gradient(int rank, std::int64_t step, unsigned group, bool integers) {
  std::mt19937 rng(static_cast<unsigned>(rank * 7919 + step * 104729) ^ (group * 0x9e3779b9u));
  std::vector<float> g(kSizes[group]);
  if (integers) {
    std::uniform_int_distribution<int> values(-8, 8);
    for (auto& x : g) x = static_cast<float>(values(rng));
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = sleeps(i) ? 0.0f : g[i];
  } else {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (auto& x : g) x = normal(rng);
  }
  return g;
}

std::vector<float> initial() {
  std::vector<float> p(kTotal);
  for (std::size_t i = 0; i < kTotal; ++i) p[i] = std::sin(static_cast<float>(i + (i >= kSizes[0] ? 1000 : 0)));
  return p;
}

std::size_t offset(unsigned group) { return group == 0 ? 0 : kSizes[0]; }

// Adam's largest step with these betas (onebit.h, "Steps under a frozen variance"), written out:
// (1−β1)/√((1−β2)(1−β1²/β2)).
float step_bound(float beta1, float beta2) {
  const double b1 = beta1, b2 = beta2;
  return static_cast<float>((1.0 - b1) / std::sqrt((1.0 - b2) * (1.0 - b1 * b1 / b2)));
}

// m/(√v+ε) within ±bound.
float clipped(float m, float v, float eps, float bound) {
  return std::min(std::max(m / (std::sqrt(v) + eps), -bound), bound);
}

onebit_comm_t join(int rank, int port) { return join_loopback(rank, kWorld, port); }

std::vector<float> exact_average(const std::vector<std::vector<float>>& x) {
  std::vector<float> a(x[0].size(), 0.0f);
  for (const auto& r : x) {
    for (std::size_t i = 0; i < a.size(); ++i) a[i] += r[i];
  }
  for (float& v : a) v /= static_cast<float>(x.size());
  return a;
}

// Runs `body(rank, comm, restart)` on every rank; the body calls restart() to move to a fresh
// communicator. Returns each rank's kTotal floats written to `out` by the body.
template <typename Body>
std::vector<std::vector<float>> on_ranks(Body body) {
  SharedMemory out(kWorld * kTotal * sizeof(float));
  const int port = free_port(), second_port = free_port();
  auto outcomes = run_ranks(kWorld, [&](int rank) {
    onebit_comm_t comm = join(rank, port);
    auto rejoin = [&] {
      onebit_comm_destroy(comm);
      comm = join(rank, second_port);
      return comm;
    };
    int code = 0;
    try {
      code = body(rank, comm, rejoin, out.as<float>() + rank * kTotal);
    } catch (const CallError& error) {
      std::fprintf(stderr, "rank %d: %s\n", rank, error.what());
      code = 4;
    }
    onebit_comm_destroy(comm);
    return code;
  });
  std::vector<std::vector<float>> params;
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(outcomes[r].exit_code, 0) << "rank " << r;
    params.emplace_back(out.as<float>() + r * kTotal, out.as<float>() + (r + 1) * kTotal);
  }
  return params;
}

// ---------------------------------------------------------------------------------------------
// 0/1 Adam

onebit_zero_one_adam_config_t zero_one_config(unsigned group) {
  // var_freeze_step 6, κ = 2, local_step_scaler 3, H = 4: all four kinds of step in 24 steps.
  if (group == 0) return {0.01f, 0.9f, 0.999f, 1e-8f, 0.01f, 6, 2, 3, 4};
  return {0.05f, 0.8f, 0.99f, 1e-6f, 0.0f, 6, 2, 3, 4};
}
constexpr int kZeroOneSteps = 24;
enum Kind { kVariance, kCompressed, kLocal, kSync };

// The schedule as written: count = t + 1; variance stage t <= var_freeze_step.
std::vector<Kind> zero_one_schedule(int steps) {
  const onebit_zero_one_adam_config_t c = zero_one_config(0);
  std::int64_t var_interval = 1, var_counter = 0, local_interval = 1, local_counter = 0;
  std::vector<Kind> kinds;
  for (std::int64_t t = 0; t < steps; ++t) {
    const std::int64_t count = t + 1;
    if (t <= c.var_freeze_step) {
      const bool variance = count % var_interval == 0;
      kinds.push_back(variance ? kVariance : kCompressed);
      if (variance && ++var_counter == c.var_update_scaler) var_counter = 0, var_interval *= 2;
    } else {
      kinds.push_back(count % local_interval == 0 ? kSync : kLocal);
      if (++local_counter == c.local_step_scaler) {
        local_counter = 0;
        local_interval = std::min<std::int64_t>(c.local_step_clipper, local_interval * 2);
      }
    }
  }
  return kinds;
}

std::vector<float> zero_one_gradient(int rank, std::int64_t t, Kind kind) {
  std::vector<float> g = gradient(rank, t, 0, kind == kVariance);
  const std::vector<float> b = gradient(rank, t, 1, kind == kVariance);
  g.insert(g.end(), b.begin(), b.end());
  return g;
}

// Every rank's parameters after `steps` steps of the written rule.
std::vector<std::vector<float>> zero_one_replay(int steps) {
  const std::vector<Kind> kinds = zero_one_schedule(steps);
  struct Rank {
    std::vector<float> p = initial(), m = std::vector<float>(kTotal, 0.0f), u = std::vector<float>(kTotal, 0.0f);
    std::vector<float> p_sync;
    float lrs[2] = {0, 0};
  };
  std::vector<Rank> ranks(kWorld);
  std::vector<float> v(kTotal, 0.0f);  // the same on every rank
  auto oracle = std::make_unique<Float32Oracle>(kWorld, kTotal);
  auto each = [](auto&& body) {
    for (unsigned g = 0; g < 2; ++g) {
      const onebit_zero_one_adam_config_t c = zero_one_config(g);
      for (std::size_t i = offset(g); i < offset(g) + kSizes[g]; ++i) body(c, g, i);
    }
  };
  for (int t = 0; t < steps; ++t) {
    std::vector<std::vector<float>> grads(kWorld);
    for (int r = 0; r < kWorld; ++r) grads[r] = zero_one_gradient(r, t, kinds[t]);
    if (kinds[t] == kVariance || kinds[t] == kCompressed) {
      const std::vector<float> g = kinds[t] == kVariance ? exact_average(grads) : oracle->step(grads, false);
      for (Rank& k : ranks) {
        each([&](const onebit_zero_one_adam_config_t& c, unsigned, std::size_t i) {
          if (kinds[t] == kVariance && &k == &ranks[0]) v[i] = c.beta2 * v[i] + (1.0f - c.beta2) * g[i] * g[i];
          k.m[i] = c.beta1 * k.m[i] + (1.0f - c.beta1) * g[i];
          if (kinds[t] == kVariance) {
            k.p[i] = k.p[i] - c.lr * (k.m[i] / (std::sqrt(v[i]) + c.eps) + c.weight_decay * k.p[i]);
            return;
          }
          if (std::sqrt(v[i]) <= c.eps) k.m[i] = 0.0f;  // v kept: dormant, and the step bounded
          k.p[i] =
              k.p[i] - c.lr * (clipped(k.m[i], v[i], c.eps, step_bound(c.beta1, c.beta2)) + c.weight_decay * k.p[i]);
        });
      }
    } else {
      for (int r = 0; r < kWorld; ++r) {
        Rank& k = ranks[r];
        each([&](const onebit_zero_one_adam_config_t& c, unsigned, std::size_t i) {
          k.m[i] = std::sqrt(v[i]) <= c.eps ? 0.0f : c.beta1 * k.m[i] + (1.0f - c.beta1) * grads[r][i];
          const float d = c.lr * (clipped(k.m[i], v[i], c.eps, step_bound(c.beta1, c.beta2)) + c.weight_decay * k.p[i]);
          k.p[i] = k.p[i] - d;
          k.u[i] = k.u[i] - d;
        });
        for (unsigned g = 0; g < 2; ++g) k.lrs[g] += zero_one_config(g).lr;
      }
      if (kinds[t] == kSync) {
        std::vector<std::vector<float>> us;
        for (Rank& k : ranks) {
          each([&](const onebit_zero_one_adam_config_t& c, unsigned, std::size_t i) {
            k.u[i] = k.u[i] * (std::sqrt(v[i]) + c.eps);
          });
          us.push_back(k.u);
        }
        const std::vector<float> average = oracle->step(us, false);
        for (Rank& k : ranks) {
          each([&](const onebit_zero_one_adam_config_t& c, unsigned g, std::size_t i) {
            const bool dormant = std::sqrt(v[i]) <= c.eps;  // keeps the p of its local steps
            k.m[i] = dormant ? 0.0f : -(average[i] / k.lrs[g]);
            const float reach = k.lrs[g] * (step_bound(c.beta1, c.beta2) + c.weight_decay * std::fabs(k.p_sync[i]));
            if (!dormant)
              k.p[i] = k.p_sync[i] + std::min(std::max(average[i] / (std::sqrt(v[i]) + c.eps), -reach), reach);
            k.p_sync[i] = k.p[i];
            k.u[i] = 0.0f;
          });
          k.lrs[0] = k.lrs[1] = 0.0f;
        }
      }
    }
    if (t == zero_one_config(0).var_freeze_step) {  // the local-step stage begins
      oracle = std::make_unique<Float32Oracle>(kWorld, kTotal);
      for (Rank& k : ranks) k.p_sync = k.p;
    }
  }
  std::vector<std::vector<float>> out;
  for (const Rank& k : ranks) out.push_back(k.p);
  return out;
}

std::vector<std::vector<float>> zero_one_train(int steps, int restart_at) {
  const std::vector<Kind> kinds = zero_one_schedule(steps);
  return on_ranks([&](int rank, onebit_comm_t comm, auto rejoin, float* out) {
    std::vector<float> p = initial();
    auto groups = [&] {
      return std::vector<ZeroOneAdam::ParamGroup>{{p.data(), kSizes[0], zero_one_config(0)},
                                                  {p.data() + kSizes[0], kSizes[1], zero_one_config(1)}};
    };
    auto adam = std::make_unique<ZeroOneAdam>(comm, groups());
    for (int t = 0; t < steps; ++t) {
      if (t == restart_at) {
        const ZeroOneAdam::Checkpoint saved = adam->save();
        adam.reset();
        comm = rejoin();
        adam = std::make_unique<ZeroOneAdam>(comm, groups());
        adam->load(saved);
      }
      RANK_FAILS_IF(static_cast<int>(adam->next_step()) != static_cast<int>(kinds[t]), 3);
      const std::vector<float> g = zero_one_gradient(rank, t, kinds[t]);
      adam->step({g.data(), g.data() + kSizes[0]});
    }
    RANK_FAILS_IF(adam->steps() != steps, 5);
    std::memcpy(out, p.data(), kTotal * sizeof(float));
    return 0;
  });
}

TEST(ZeroOneAdamShim, TheScheduleHasEveryKindOfStep) {
  const std::vector<Kind> kinds = zero_one_schedule(16);
  const std::vector<Kind> expected = {kVariance,   kVariance, kCompressed, kVariance, kCompressed, kVariance,
                                      kCompressed, kSync,     kSync,       kSync,     kLocal,      kSync,
                                      kLocal,      kLocal,    kLocal,      kSync};
  EXPECT_EQ(kinds, expected);
  // The C core agrees, step by step.
  const onebit_zero_one_adam_config_t c = zero_one_config(0);
  onebit_zero_one_adam_schedule_t s;
  ASSERT_EQ(onebit_zero_one_adam_schedule_init(&s), ONEBIT_SUCCESS);
  for (int t = 0; t < 16; ++t) {
    onebit_zero_one_adam_step_t kind;
    ASSERT_EQ(onebit_zero_one_adam_next(&c, &s, &kind), ONEBIT_SUCCESS);
    EXPECT_EQ(static_cast<int>(kind), static_cast<int>(expected[t])) << "step " << t;
    ASSERT_EQ(onebit_zero_one_adam_advance(&c, &s), ONEBIT_SUCCESS);
  }
  EXPECT_EQ(s.step, 16);
  EXPECT_EQ(s.var_interval, 4);
  EXPECT_EQ(s.local_step_interval, 4);
}

TEST(ZeroOneAdamShim, TwoGroupsMatchTheReplayOnEveryRankBitForBit) {
  const auto expected = zero_one_replay(kZeroOneSteps);
  const auto params = zero_one_train(kZeroOneSteps, -1);
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_EQ(0, std::memcmp(params[r].data(), expected[r].data(), kTotal * 4)) << "rank " << r;
  }
  // The last step is a sync step: every replica holds the same parameters again.
  for (int r = 1; r < kWorld; ++r) ASSERT_EQ(0, std::memcmp(params[r].data(), params[0].data(), kTotal * 4)) << r;
}

TEST(ZeroOneAdamShim, CheckpointsInBothStagesContinueBitForBit) {
  const auto expected = zero_one_replay(kZeroOneSteps);
  // Step 5: the variance stage, with gradient error feedback in the state. Step 14: the local
  // stage between two syncs, with u accumulated and u's error feedback in the state.
  for (int restart_at : {5, 14}) {
    const auto params = zero_one_train(kZeroOneSteps, restart_at);
    for (int r = 0; r < kWorld; ++r) {
      ASSERT_EQ(0, std::memcmp(params[r].data(), expected[r].data(), kTotal * 4))
          << "rank " << r << ", restarted at step " << restart_at;
    }
  }
}

TEST(ZeroOneAdamShim, NaNAtASyncStepFailsEveryRankAndChangesNothing) {
  const std::vector<Kind> kinds = zero_one_schedule(kZeroOneSteps);
  on_ranks([&](int rank, onebit_comm_t comm, auto, float* out) {
    std::vector<float> p = initial();
    ZeroOneAdam adam(
        comm, {{p.data(), kSizes[0], zero_one_config(0)}, {p.data() + kSizes[0], kSizes[1], zero_one_config(1)}});
    for (int t = 0; t < 11; ++t) {  // up to the sync step 11, after the local step 10
      const std::vector<float> g = zero_one_gradient(rank, t, kinds[t]);
      adam.step({g.data(), g.data() + kSizes[0]});
    }
    RANK_FAILS_IF(adam.next_step() != ONEBIT_ZERO_ONE_ADAM_SYNC_STEP, 9);
    const ZeroOneAdam::Checkpoint before = adam.save();
    const std::vector<float> p_before = p;
    std::vector<float> g = zero_one_gradient(rank, 11, kSync);
    if (rank == 1) g[kSizes[0] + 3] = NAN;
    try {
      adam.step({g.data(), g.data() + kSizes[0]});
      return RANK_FAILED(10, "a sync step with NaN in rank 1's gradient succeeded");
    } catch (const CallError& error) {
      RANK_FAILS_IF(error.code() != ONEBIT_NUMERIC_ERROR, 11);
      if (std::string(error.what()).find("onebit::ZeroOneAdam step 11 (a sync step of the local-step stage)") ==
          std::string::npos) {
        return RANK_FAILED(14, std::string("the failed step's message does not name it: ") + error.what());
      }
    }
    const ZeroOneAdam::Checkpoint after = adam.save();
    if (p != p_before || after.m != before.m || after.u != before.u || after.lrs != before.lrs ||
        after.worker_error != before.worker_error || after.schedule.step != 11) {
      return RANK_FAILED(12, "the failed sync step changed the parameters or the state");
    }
    g[kSizes[0] + 3] = 0.0f;
    adam.step({g.data(), g.data() + kSizes[0]});  // the communicator is still usable
    std::memcpy(out, p.data(), kTotal * sizeof(float));
    return adam.steps() == 12 ? 0 : 13;
  });
}

// A group whose lr was 0 at every step since the last sync has no learning-rate sum to divide its
// accumulated update by: the sync is refused on every rank in the C core's words, nothing changed
// (before: the C core's bare "learning-rate sum of 0" from inside the sync, after the local step).
TEST(ZeroOneAdamShim, ASyncOfAGroupWhoseLrWasZeroIsRefusedNamingItAndChangesNothing) {
  const std::vector<Kind> kinds = zero_one_schedule(kZeroOneSteps);
  on_ranks([&](int rank, onebit_comm_t comm, auto, float* out) {
    std::vector<float> p = initial();
    onebit_zero_one_adam_config_t frozen = zero_one_config(1);
    frozen.lr = 0.0f;
    ZeroOneAdam adam(comm, {{p.data(), kSizes[0], zero_one_config(0)}, {p.data() + kSizes[0], kSizes[1], frozen}});
    int t = 0;
    for (; adam.next_step() != ONEBIT_ZERO_ONE_ADAM_SYNC_STEP; ++t) {  // up to the first sync
      const std::vector<float> g = zero_one_gradient(rank, t, kinds[t]);
      adam.step({g.data(), g.data() + kSizes[0]});
    }
    const ZeroOneAdam::Checkpoint before = adam.save();
    const std::vector<float> p_before = p;
    const std::vector<float> g = zero_one_gradient(rank, t, kSync);
    try {
      adam.step({g.data(), g.data() + kSizes[0]});
      return RANK_FAILED(10, "a sync of a group whose lr was 0 succeeded");
    } catch (const CallError& error) {
      RANK_FAILS_IF(error.code() != ONEBIT_INVALID_ARGUMENT, 11);
      const std::string said = error.what();
      if (said.find("onebit::ZeroOneAdam: the learning rate of group 1 was 0 at every step since the last sync "
                    "(schedule step " +
                    std::to_string(t) + ")") == std::string::npos ||
          said.find("; nothing was changed") == std::string::npos) {
        return RANK_FAILED(12, "the refusal does not say why: " + said);
      }
    }
    const ZeroOneAdam::Checkpoint after = adam.save();
    if (p != p_before || after.m != before.m || after.u != before.u || after.lrs != before.lrs ||
        after.worker_error != before.worker_error || after.schedule.step != t) {
      return RANK_FAILED(13, "the refused sync changed the parameters or the state");
    }
    std::memcpy(out, p.data(), kTotal * sizeof(float));
    return 0;
  });
}

TEST(ZeroOneAdamShim, BadConfigsAreRefusedByName) {
  onebit_zero_one_adam_config_t c = zero_one_config(0);
  c.local_step_clipper = 0;
  onebit_zero_one_adam_schedule_t s;
  onebit_zero_one_adam_schedule_init(&s);
  onebit_zero_one_adam_step_t kind;
  EXPECT_EQ(onebit_zero_one_adam_next(&c, &s, &kind), ONEBIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(onebit_last_error()).find("local_step_clipper 0"), std::string::npos) << onebit_last_error();
  float u[2] = {1, 2}, v[2] = {1, 1};
  c = zero_one_config(0);
  EXPECT_EQ(onebit_zero_one_adam_sync_begin(&c, u, v, 0.0f, 2), ONEBIT_INVALID_ARGUMENT);
  EXPECT_EQ(u[0], 1.0f);  // refused before anything changed
  float p[2] = {0, 0};
  onebit_comm_t comm = nullptr;
  ASSERT_EQ(onebit_comm_init(&comm, 0, 1, ""), ONEBIT_SUCCESS) << onebit_last_error();
  onebit_zero_one_adam_config_t other = zero_one_config(0);
  other.var_update_scaler = 5;
  try {
    ZeroOneAdam adam(comm, {{p, 1, zero_one_config(0)}, {p + 1, 1, other}});
    ADD_FAILURE() << "groups with different schedules were accepted";
  } catch (const CallError& error) {
    EXPECT_NE(std::string(error.what()).find("group 1's schedule"), std::string::npos) << error.what();
  }
  onebit_comm_destroy(comm);
}

// ---------------------------------------------------------------------------------------------
// 1-bit LAMB

// The weights' fresh variance barely moves (β2 0.999): their factor stays near 1, unclamped, with
// weight decay's ratio mixed in. The biases' (β2 0.5) falls fast once the gradients shrink, so
// their factor climbs by factor_threshold a step until factor_max 1.2 stops it. (factor_min:
// FactorClampsBite below.)
onebit_lamb_config_t lamb_config(unsigned group) {
  if (group == 0) return {0.01f, 0.9f, 0.999f, 1e-8f, 0.01f, 4, 10.0, 0.01, 0.9, 4.0, 0.5, 0.1};
  return {0.05f, 0.8f, 0.5f, 1e-6f, 0.0f, 4, 10.0, 0.01, 0.9, 1.2, 0.5, 0.1};
}
constexpr int kLambSteps = 12, kLambFreeze = 4;

std::vector<float> lamb_gradient(int rank, std::int64_t t) {
  std::vector<float> g = gradient(rank, t, 0, t < kLambFreeze);
  const std::vector<float> b = gradient(rank, t, 1, t < kLambFreeze);
  g.insert(g.end(), b.begin(), b.end());
  return g;
}

double norm(const float* x, std::size_t n) {
  double s = 0;
  for (std::size_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return std::sqrt(s);
}

// The parameters (the same on every rank) after `steps` steps of the written rule.
std::vector<float> lamb_replay(int steps) {
  std::vector<float> p = initial(), m(kTotal, 0.0f), v(kTotal, 0.0f), fresh(kTotal, 0.0f), m_last(kTotal);
  double coeff_freeze[2] = {0, 0}, last_factor[2] = {1, 1}, scaling[2] = {0, 0};
  Float32Oracle oracle(kWorld, kTotal);
  std::vector<float> d(kTotal);
  for (int t = 0; t < steps; ++t) {
    std::vector<std::vector<float>> grads(kWorld);
    for (int r = 0; r < kWorld; ++r) grads[r] = lamb_gradient(r, t);
    if (t < kLambFreeze) {
      const std::vector<float> g = exact_average(grads);
      for (unsigned j = 0; j < 2; ++j) {
        const onebit_lamb_config_t c = lamb_config(j);
        const std::size_t o = offset(j), n = kSizes[j];
        for (std::size_t i = o; i < o + n; ++i) {
          m[i] = c.beta1 * m[i] + (1.0f - c.beta1) * g[i];
          v[i] = c.beta2 * v[i] + (1.0f - c.beta2) * g[i] * g[i];
        }
        if (t == kLambFreeze - 1) std::copy(v.begin() + o, v.begin() + o + n, fresh.begin() + o);
        for (std::size_t i = o; i < o + n; ++i) d[i] = m[i] / (std::sqrt(v[i]) + c.eps) + c.weight_decay * p[i];
        const double pn = norm(&p[o], n), dn = norm(&d[o], n);
        double coeff = 1.0;
        if (pn != 0 && dn != 0) coeff = std::min(std::max(pn / dn, c.min_coeff), c.max_coeff);
        if (coeff != 1.0) coeff_freeze[j] = c.coeff_beta * coeff_freeze[j] + (1.0 - c.coeff_beta) * coeff;
        const float step = static_cast<float>(static_cast<double>(c.lr) * coeff);
        for (std::size_t i = o; i < o + n; ++i) p[i] = p[i] - step * d[i];
      }
      continue;
    }
    if (t == kLambFreeze) {
      const double s0 = norm(&m[0], kSizes[0]) / std::sqrt(double(kSizes[0]));
      const double s1 = norm(&m[kSizes[0]], kSizes[1]) / std::sqrt(double(kSizes[1]));
      const double united = (s0 + s1) / 2;
      scaling[0] = united / s0;
      scaling[1] = united / s1;
    }
    m_last = m;
    std::vector<std::vector<float>> local(kWorld, m);
    for (int r = 0; r < kWorld; ++r) {
      for (unsigned j = 0; j < 2; ++j) {
        const onebit_lamb_config_t c = lamb_config(j);
        for (std::size_t i = offset(j); i < offset(j) + kSizes[j]; ++i) {
          local[r][i] = (c.beta1 * m[i] + (1.0f - c.beta1) * grads[r][i]) * static_cast<float>(scaling[j]);
        }
      }
    }
    m = oracle.step(local, false);
    for (unsigned j = 0; j < 2; ++j) {
      const onebit_lamb_config_t c = lamb_config(j);
      const std::size_t o = offset(j), n = kSizes[j];
      float factor_f = 0.0f;
      std::vector<float> prelim(n);
      for (std::size_t i = o; i < o + n; ++i) {
        const bool dormant = std::sqrt(v[i]) <= c.eps;
        m[i] = dormant ? 0.0f : m[i] / static_cast<float>(scaling[j]);
        const float g = (m[i] - m_last[i] * c.beta1) / (1.0f - c.beta1);
        fresh[i] = c.beta2 * fresh[i] + (1.0f - c.beta2) * g * g;
        const float denominator = std::sqrt(v[i]) + c.eps;
        prelim[i - o] = m[i] / denominator;  // not clipped: LAMB takes the dormant rule only
        d[i] = prelim[i - o] + c.weight_decay * p[i];
        if (!dormant) factor_f = std::max(factor_f, denominator / (std::sqrt(fresh[i]) + c.eps));
      }
      double factor = factor_f == 0.0f ? 1.0 : factor_f;
      if (c.weight_decay > 0) {
        const double ratio = std::min(1.0, norm(prelim.data(), n) / norm(&d[o], n));
        factor = factor * ratio + (1.0 - ratio);
      }
      factor = std::min(std::max(factor, c.factor_min), c.factor_max);
      factor = std::min(std::max(factor, last_factor[j] * (1.0 - c.factor_threshold)),
                        last_factor[j] * (1.0 + c.factor_threshold));
      last_factor[j] = factor;
      const float step = static_cast<float>(static_cast<double>(c.lr) * (coeff_freeze[j] * factor));
      for (std::size_t i = o; i < o + n; ++i) p[i] = p[i] - step * d[i];
    }
  }
  return p;
}

std::vector<std::vector<float>> lamb_train(int steps, int restart_at) {
  return on_ranks([&](int rank, onebit_comm_t comm, auto rejoin, float* out) {
    std::vector<float> p = initial();
    auto groups = [&] {
      return std::vector<OnebitLamb::ParamGroup>{{p.data(), kSizes[0], lamb_config(0)},
                                                 {p.data() + kSizes[0], kSizes[1], lamb_config(1)}};
    };
    auto lamb = std::make_unique<OnebitLamb>(comm, groups());
    for (int t = 0; t < steps; ++t) {
      if (t == restart_at) {
        const OnebitLamb::Checkpoint saved = lamb->save();
        lamb.reset();
        comm = rejoin();
        lamb = std::make_unique<OnebitLamb>(comm, groups());
        lamb->load(saved);
      }
      const std::vector<float> g = lamb_gradient(rank, t);
      lamb->step({g.data(), g.data() + kSizes[0]});
      RANK_FAILS_IF(lamb->compressing() != (t + 1 >= kLambFreeze), 3);
    }
    // The coefficients moved (a constant 1 would hide a bug), and the clamps above held the factors.
    for (double coeff : lamb->lamb_coeffs()) {
      RANK_FAILS_IF(!(coeff > 0) || coeff == 1.0, 6);
    }
    RANK_FAILS_IF(restart_at < 0 && (lamb->layers()[0].last_factor == 1.0 || lamb->layers()[1].last_factor != 1.2), 7);
    std::memcpy(out, p.data(), kTotal * sizeof(float));
    return 0;
  });
}

TEST(OnebitLambShim, TwoLayersMatchTheReplayBitForBit) {
  const std::vector<float> expected = lamb_replay(kLambSteps);
  const auto params = lamb_train(kLambSteps, -1);
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_EQ(0, std::memcmp(params[r].data(), expected.data(), kTotal * 4)) << "rank " << r;
  }
}

TEST(OnebitLambShim, CheckpointsContinueBitForBit) {
  const std::vector<float> expected = lamb_replay(kLambSteps);
  // Step 2: warmup (the coefficient's average in the state). Step 7: compression, with the
  // scaling coefficients, last factors, v_fresh and the error feedback in the state.
  for (int restart_at : {2, kLambFreeze + 3}) {
    const auto params = lamb_train(kLambSteps, restart_at);
    for (int r = 0; r < kWorld; ++r) {
      ASSERT_EQ(0, std::memcmp(params[r].data(), expected.data(), kTotal * 4))
          << "rank " << r << ", restarted at step " << restart_at;
    }
  }
}

// One layer whose fresh variance grew tenfold: the raw factor, about 0.1, is lifted to factor_min
// 0.5, which lies within factor_threshold of the last factor 0.55 (without the clamp the threshold
// would give 0.495).
TEST(OnebitLambShim, FactorMinBites) {
  onebit_lamb_config_t c = lamb_config(1);
  onebit_lamb_layer_t layer{2.0, 0.55, 1.0, 0.0};
  float p[2] = {1, -1}, m[2] = {0, 0}, last[2] = {0, 0}, v[2] = {1, 1}, fresh[2] = {200, 200};
  ASSERT_EQ(onebit_lamb_apply_step(&c, &layer, p, m, last, v, fresh, 2), ONEBIT_SUCCESS) << onebit_last_error();
  EXPECT_EQ(layer.last_factor, 0.5);
  EXPECT_EQ(layer.lamb_coeff, 1.0);  // coeff_freeze × factor
  EXPECT_EQ(fresh[0], 100.0f);       // β2 0.5 · 200 + 0.5 · 0²
  EXPECT_EQ(p[0], 1.0f);             // m = 0, no weight decay: no move
}

TEST(OnebitLambShim, BadConfigsAreRefusedByName) {
  onebit_lamb_config_t c = lamb_config(0);
  c.factor_min = 5.0;  // above factor_max
  EXPECT_EQ(onebit_lamb_compressing(&c, 0), -1);
  EXPECT_NE(std::string(onebit_last_error()).find("factor_min 5"), std::string::npos) << onebit_last_error();
  onebit_lamb_layer_t layer;
  ASSERT_EQ(onebit_lamb_layer_init(&layer), ONEBIT_SUCCESS);
  float m[2] = {1, 2}, last[2], g[2] = {0, 0};
  c = lamb_config(0);
  EXPECT_EQ(onebit_lamb_momentum_step(&c, &layer, m, last, g, 2), ONEBIT_INVALID_ARGUMENT);  // no scaling yet
  EXPECT_NE(std::string(onebit_last_error()).find("scaling_coeff"), std::string::npos) << onebit_last_error();
  EXPECT_EQ(m[0], 1.0f);
}

struct Outcome {
  onebit_result_t code;  // ONEBIT_SUCCESS: `make` returned
  std::string says;      // in the CallError's message
};

// Two ranks run `make(rank, comm)`; rank r must end with `want[r]` (ONEBIT_SUCCESS: returning; else
// a CallError of that code whose message holds the words). A check inside `make` that fails throws
// CallError(ONEBIT_INTERNAL_ERROR) saying what it saw.
void expect_on_ranks(const std::function<void(int, onebit_comm_t)>& make, const std::vector<Outcome>& want) {
  RankRecords records(2);
  const int port = free_port();
  auto outcomes = run_ranks(
      2,
      [&](int rank) {
        onebit_comm_t comm = join_loopback(rank, 2, port);
        records[rank].code = ONEBIT_SUCCESS;
        records[rank].message[0] = '\0';
        try {
          make(rank, comm);
        } catch (const CallError& error) {
          records[rank].code = error.code();
          std::snprintf(records[rank].message, sizeof(records[rank].message), "%s", error.what());
        }
        onebit_comm_destroy(comm);
        return 0;
      },
      std::chrono::seconds(60));
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(outcomes[r].exit_code, 0) << "rank " << r;
    EXPECT_EQ(records[r].code, want[r].code) << "rank " << r << ": " << records[r].message;
    EXPECT_NE(std::string(records[r].message).find(want[r].says), std::string::npos) << records[r].message;
  }
}

void expect_on_both_ranks(const std::function<void(int, onebit_comm_t)>& make, onebit_result_t code,
                          const std::string& says) {
  expect_on_ranks(make, {{code, says}, {code, says}});
}

// Two ranks whose optimizers are given different schedules: `make(rank, comm)` constructs one.
// Construction fails on both ranks with ONEBIT_MISMATCH naming the field and both values, instead of
// the ranks parting at the first step that depends on it and waiting until the timeout.
void expect_disagreement_named(const std::function<void(int, onebit_comm_t)>& make, const std::string& says) {
  expect_on_both_ranks(make, ONEBIT_MISMATCH, says);
}

TEST(RankAgreement, ShimsWithDifferentSchedulesAreNamedAtConstruction) {
  std::vector<float> p(kTotal, 0.0f);
  expect_disagreement_named(
      [&](int rank, onebit_comm_t comm) {
        const onebit_adam_config_t c{1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, rank == 0 ? 3 : 1};
        OnebitAdam adam(comm, {{p.data(), kTotal, c}});
      },
      "onebit::OnebitAdam: the ranks disagree on freeze_step: rank 0 has 3, rank 1 has 1; every rank must be given "
      "the same value (ONEBIT_FREEZE_STEP set on some ranks only? different checkpoints loaded? different models?)");
  expect_disagreement_named(
      [&](int rank, onebit_comm_t comm) {
        onebit_lamb_config_t c = lamb_config(0);
        c.freeze_step = rank == 0 ? 3 : 1;
        OnebitLamb lamb(comm, {{p.data(), kTotal, c}});
      },
      "onebit::OnebitLamb: the ranks disagree on freeze_step: rank 0 has 3, rank 1 has 1");
  expect_disagreement_named(
      [&](int rank, onebit_comm_t comm) {
        onebit_zero_one_adam_config_t c = zero_one_config(0);
        c.var_freeze_step = rank == 0 ? 8 : 9;
        ZeroOneAdam adam(comm, {{p.data(), kTotal, c}});
      },
      "onebit::ZeroOneAdam: the ranks disagree on var_freeze_step: rank 0 has 8, rank 1 has 9");
  expect_disagreement_named(
      [&](int rank, onebit_comm_t comm) {
        ZeroOneAdam adam(comm, {{p.data(), rank == 0 ? kTotal : kTotal - 1, zero_one_config(0)}});
      },
      "the ranks disagree on parameters: rank 0 has 1037, rank 1 has 1036");
  // Loading checkpoints of different steps (another rank's file, an older one) is named too.
  expect_disagreement_named(
      [&](int rank, onebit_comm_t comm) {
        OnebitLamb lamb(comm, {{p.data(), kTotal, lamb_config(0)}});
        OnebitLamb::Checkpoint saved = lamb.save();
        saved.step = rank == 0 ? 12 : 9;
        lamb.load(saved);
      },
      "onebit::OnebitLamb::load: the ranks disagree on step: rank 0 has 12, rank 1 has 9");
}

// Ranks given different learning rates (which construction does not compare: a scheduler may change
// them) take their warmup steps; the first compressed step — whose settings travel with the call
// (share_step_settings) — fails on both ranks with ONEBIT_MISMATCH naming rank 1, instead of the
// replicas parting silently.
template <typename Optimizer, typename Config>
void expect_first_compressed_step_refused(const std::function<Config(int rank)>& config) {
  expect_on_both_ranks(
      [&](int rank, onebit_comm_t comm) {
        std::vector<float> p(kTotal, 0.5f), g(kTotal, 0.25f);
        Optimizer optimizer(comm, {{p.data(), kTotal, config(rank)}});
        for (int t = 0; t < 40; ++t) optimizer.step({g.data()});
      },
      ONEBIT_MISMATCH, "rank 1's settings for this call differ from rank 0's");
}

TEST(RankAgreement, ShimsWithDifferentLearningRatesFailTheirFirstCompressedStepOnEveryRank) {
  expect_first_compressed_step_refused<OnebitAdam, onebit_adam_config_t>(
      [](int rank) { return onebit_adam_config_t{rank == 0 ? 1e-3f : 2e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 2}; });
  expect_first_compressed_step_refused<OnebitLamb, onebit_lamb_config_t>([](int rank) {
    onebit_lamb_config_t c = lamb_config(0);
    c.freeze_step = 2;
    c.lr *= rank == 0 ? 1.0f : 2.0f;
    return c;
  });
  expect_first_compressed_step_refused<ZeroOneAdam, onebit_zero_one_adam_config_t>([](int rank) {
    onebit_zero_one_adam_config_t c = zero_one_config(0);
    c.weight_decay = rank == 0 ? 0.0f : 0.01f;
    return c;
  });
}

// A checkpoint's schedule goes on under the settings it was saved with (resume_rules.hpp): a freeze
// step may move only from a checkpoint before the freeze under both; 0/1 Adam's scalers and clipper
// not at all. Refused on every rank by name, nothing loaded (before: OnebitLamb and ZeroOneAdam did
// not record their schedule nor OnebitAdam compare its fixed freeze step, and a moved freeze step
// skipped or repeated the stage change — 0/1 Adam's local stage synced from parameters never kept,
// all zeros). Checkpoints are save()'s with the step set: the rule reads nothing else, and a refusal
// must come before anything is loaded.
void throw_unless(bool held, const std::string& what) {
  if (!held) throw CallError(ONEBIT_INTERNAL_ERROR, "check failed: " + what);
}

TEST(ResumeRules, AFreezeStepMovesOnlyFromBeforeTheFreezeUnderBoth) {
  std::vector<float> p(kTotal, 0.0f);
  auto adam_resumed = [&](std::int64_t saved_step, std::int64_t saved_freeze, std::int64_t freeze) {
    return [=, &p](int, onebit_comm_t comm) {
      OnebitAdam::Checkpoint saved;
      {
        OnebitAdam before(comm, {{p.data(), kTotal, {1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, saved_freeze}}});
        saved = before.save();
      }
      saved.step = saved_step;
      OnebitAdam adam(comm, {{p.data(), kTotal, {1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, freeze}}});
      try {
        adam.load(saved);
      } catch (const CallError&) {
        throw_unless(adam.steps() == 0, "the refused load changed the step");
        throw;
      }
      throw_unless(adam.steps() == saved_step && adam.freeze_step() == freeze, "resumed with another freeze_step");
    };
  };
  expect_on_both_ranks(adam_resumed(2, 3, 6), ONEBIT_SUCCESS, "");  // in warmup under both: goes on with 6
  expect_on_both_ranks(adam_resumed(3, 3, 6), ONEBIT_INVALID_ARGUMENT,
                       "onebit::OnebitAdam::load: the checkpoint (after step 3) was saved with freeze_step=3 "
                       "(this optimizer: 6)");
  expect_on_both_ranks(adam_resumed(4, 6, 3), ONEBIT_INVALID_ARGUMENT, "freeze_step=6 (this optimizer: 3)");
  expect_on_both_ranks(
      [&](int, onebit_comm_t comm) {  // a checkpoint filled by hand, its freeze_step not recorded: this one's
        OnebitAdam adam(comm, {{p.data(), kTotal, {1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 3}}});
        OnebitAdam::Checkpoint saved;
        saved.step = 5;
        saved.m.assign(kTotal, 0.0f);
        saved.v.assign(kTotal, 0.0f);
        adam.load(saved);
        throw_unless(adam.freeze_step() == 3, "a checkpoint without freeze_step changed it");
      },
      ONEBIT_SUCCESS, "");

  auto lamb_resumed = [&](std::int64_t saved_step, std::int64_t freeze) {
    return [=, &p](int, onebit_comm_t comm) {
      OnebitLamb::Checkpoint saved;
      {
        OnebitLamb before(comm, {{p.data(), kTotal, lamb_config(0)}});  // freeze_step 4
        saved = before.save();
      }
      saved.step = saved_step;
      onebit_lamb_config_t c = lamb_config(0);
      c.freeze_step = freeze;
      OnebitLamb lamb(comm, {{p.data(), kTotal, c}});
      lamb.load(saved);
      throw_unless(lamb.steps() == saved_step && !lamb.compressing(), "resumed into the wrong stage");
    };
  };
  expect_on_both_ranks(lamb_resumed(3, 8), ONEBIT_SUCCESS, "");
  expect_on_both_ranks(lamb_resumed(5, 8), ONEBIT_INVALID_ARGUMENT,
                       "onebit::OnebitLamb::load: the checkpoint (after step 5) was saved with freeze_step=4 "
                       "(this optimizer: 8)");

  // 0/1 Adam's variance stage includes var_freeze_step itself (6 here): a checkpoint after 6 steps
  // may move it, one after 7 (the stage changed) may not.
  auto zero_one_resumed = [&](std::int64_t saved_step, const onebit_zero_one_adam_config_t& c) {
    return [=, &p](int, onebit_comm_t comm) {
      ZeroOneAdam::Checkpoint saved;
      {
        ZeroOneAdam before(comm, {{p.data(), kTotal, zero_one_config(0)}});
        saved = before.save();
      }
      saved.schedule.step = saved_step;
      ZeroOneAdam adam(comm, {{p.data(), kTotal, c}});
      try {
        adam.load(saved);
      } catch (const CallError&) {
        throw_unless(adam.steps() == 0, "the refused load changed the schedule");
        throw;
      }
      throw_unless(adam.steps() == saved_step, "the schedule was not loaded");
    };
  };
  onebit_zero_one_adam_config_t later = zero_one_config(0);
  later.var_freeze_step = 9;
  expect_on_both_ranks(zero_one_resumed(6, later), ONEBIT_SUCCESS, "");
  expect_on_both_ranks(zero_one_resumed(7, later), ONEBIT_INVALID_ARGUMENT,
                       "onebit::ZeroOneAdam::load: the checkpoint (after step 7) was saved with var_freeze_step=6 "
                       "(this optimizer: 9)");
  onebit_zero_one_adam_config_t clipped = zero_one_config(0);
  clipped.local_step_clipper = 8;
  clipped.var_update_scaler = 3;
  expect_on_both_ranks(zero_one_resumed(2, clipped), ONEBIT_INVALID_ARGUMENT,
                       "was saved with var_update_scaler=2 (this optimizer: 3), local_step_clipper=4 (this "
                       "optimizer: 8)");
}

// An automatic freeze's checkpoint is loaded only by an optimizer that freezes automatically, and
// only with its freeze_step recorded (-1 undecided, or the step decided), as in Python.
TEST(ResumeRules, AnAutomaticFreezesCheckpointGoesOnlyToAnAutomaticFreeze) {
  std::vector<float> p(kTotal, 0.0f);
  const onebit_adam_config_t fixed{1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 3};
  const onebit_adam_auto_freeze_t automatic{2, 0.1, 0};
  expect_on_both_ranks(
      [&](int, onebit_comm_t comm) {
        OnebitAdam::Checkpoint saved;
        {
          OnebitAdam before(comm, {{p.data(), kTotal, fixed}}, "before", &automatic);
          saved = before.save();
        }
        OnebitAdam adam(comm, {{p.data(), kTotal, fixed}});
        adam.load(saved);
      },
      ONEBIT_INVALID_ARGUMENT,
      "onebit::OnebitAdam::load: the checkpoint was saved with freeze_step='auto' (it holds a variance snapshot), "
      "this optimizer has a fixed freeze_step 3");
  expect_on_both_ranks(
      [&](int, onebit_comm_t comm) {
        OnebitAdam::Checkpoint saved;
        {
          OnebitAdam before(comm, {{p.data(), kTotal, fixed}}, "before", &automatic);
          saved = before.save();
        }
        saved.freeze_step = kNotRecorded;  // a checkpoint filled by hand, without it
        OnebitAdam adam(comm, {{p.data(), kTotal, fixed}}, "after", &automatic);
        adam.load(saved);
      },
      ONEBIT_INVALID_ARGUMENT, "the checkpoint does not record its freeze_step (-1 while undecided");
}

// A checkpoint that does not fit on one rank only (each rank may load its own file): that rank
// says why, the other names it — neither waits in the load's agreement for the timeout.
void set_step(OnebitAdam::Checkpoint& c, std::int64_t step) { c.step = step; }
void set_step(OnebitLamb::Checkpoint& c, std::int64_t step) { c.step = step; }
void set_step(ZeroOneAdam::Checkpoint& c, std::int64_t step) { c.schedule.step = step; }

// Each rank makes a `Shim` over one group of kTotal parameters with `config` and loads its own
// save() moved to step 2, rank 1's changed by `spoil` first; a refused load must leave the
// optimizer at step 0.
template <typename Shim, typename Config, typename Spoil>
std::function<void(int, onebit_comm_t)> rank_1_spoils(float* p, Config config, Spoil spoil) {
  return [=](int rank, onebit_comm_t comm) {
    Shim shim(comm, {{p, kTotal, config}});
    typename Shim::Checkpoint saved = shim.save();
    set_step(saved, 2);
    if (rank == 1) spoil(saved);
    try {
      shim.load(saved);
    } catch (const CallError&) {
      throw_unless(shim.steps() == 0, "the refused load changed the step");
      throw;
    }
  };
}

TEST(ResumeRules, OneRanksCheckpointThatDoesNotFitIsNamedOnEveryRank) {
  std::vector<float> p(kTotal, 0.0f);
  const std::vector<Outcome> want{
      {ONEBIT_MISMATCH,
       "the ranks disagree on whether their checkpoint fits (1: it does not): rank 0 has 0, rank 1 "
       "has 1"},
      {ONEBIT_INVALID_ARGUMENT, "::load: the checkpoint holds 1036 "}};
  const auto one_short = [](auto& saved) { saved.m.pop_back(); };
  const onebit_adam_config_t adam_config{1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 3};
  expect_on_ranks(rank_1_spoils<OnebitAdam>(p.data(), adam_config, one_short), want);
  expect_on_ranks(rank_1_spoils<OnebitLamb>(p.data(), lamb_config(0), one_short), want);
  expect_on_ranks(rank_1_spoils<ZeroOneAdam>(p.data(), zero_one_config(0), one_short), want);
  const auto error_state_of_5 = [](auto& saved) { saved.worker_error.assign(5, 0.0f); };
  expect_on_ranks(rank_1_spoils<OnebitAdam>(p.data(), adam_config, error_state_of_5),
                  {want[0], {ONEBIT_INVALID_ARGUMENT, "elements; the saved worker error has 5"}});
  const auto corrupt = [](ZeroOneAdam::Checkpoint& saved) { saved.schedule.var_interval = 0; };
  expect_on_ranks(rank_1_spoils<ZeroOneAdam>(p.data(), zero_one_config(0), corrupt),
                  {want[0], {ONEBIT_INVALID_ARGUMENT, "0/1 Adam schedule state out of range"}});
}

// Each rank saves its checkpoint file after 6 steps (past every shim's freeze) and a fresh shim
// loads a file back: rank 1 the one `spoil(path)` has made unreadable, rank 0 its own. Both fail at
// once — rank 1 naming its file, rank 0 that rank 1's did not fit — and neither shim moved.
std::int64_t steps_of(const OnebitAdam& shim) { return shim.steps(); }
std::int64_t steps_of(const OnebitLamb& shim) { return shim.steps(); }
std::int64_t steps_of(const ZeroOneAdam& shim) { return shim.schedule().step; }

template <typename Shim, typename Config>
std::function<void(int, onebit_comm_t)> rank_1_file_spoiled(float* p, Config config, const std::string& dir,
                                                            std::function<void(const std::string&)> spoil) {
  return [=](int rank, onebit_comm_t comm) {
    const std::string path = dir + "/rank-" + std::to_string(rank) + ".ckpt";
    {
      Shim saver(comm, {{p, kTotal, config}}, "saver");
      const std::vector<float> g(kTotal, static_cast<float>(rank + 1));
      for (int t = 0; t < 6; ++t) saver.step({g.data()});
      saver.save_file(path);
    }
    if (rank == 1) spoil(path);
    Shim shim(comm, {{p, kTotal, config}});
    try {
      shim.load_file(path);
    } catch (const CallError&) {
      throw_unless(steps_of(shim) == 0, "the refused load changed the step");
      throw;
    }
  };
}

TEST(ResumeRules, ACheckpointFileOneRankCannotReadFailsEveryRanksLoad) {
  std::vector<float> p(kTotal, 0.5f);
  char pattern[] = "/tmp/onebit-files-XXXXXX";
  ASSERT_NE(::mkdtemp(pattern), nullptr);
  const std::string dir = pattern;
  const auto damaged = [](const std::string& path) {
    std::FILE* file = std::fopen(path.c_str(), "r+b");
    std::fseek(file, 40, SEEK_SET);
    std::fputc(0x5a, file);
    std::fclose(file);
  };
  const auto missing = [](const std::string& path) { std::remove(path.c_str()); };
  const Outcome rank_0{ONEBIT_MISMATCH,
                       "the ranks disagree on whether their checkpoint fits (1: it does not): rank 0 has 0, rank 1 "
                       "has 1"};
  const onebit_adam_config_t adam_config{1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 3};
  expect_on_ranks(rank_1_file_spoiled<OnebitAdam>(p.data(), adam_config, dir, damaged),
                  {rank_0, {ONEBIT_INVALID_ARGUMENT, "rank-1.ckpt: its CRC-32 does not match its bytes"}});
  expect_on_ranks(rank_1_file_spoiled<OnebitLamb>(p.data(), lamb_config(0), dir, missing),
                  {rank_0, {ONEBIT_INVALID_ARGUMENT, "cannot read " + dir + "/rank-1.ckpt"}});
  expect_on_ranks(rank_1_file_spoiled<ZeroOneAdam>(p.data(), zero_one_config(0), dir, damaged),
                  {rank_0, {ONEBIT_INVALID_ARGUMENT, "its CRC-32 does not match"}});
  // Another optimizer's file is refused by name (the file itself reads).
  expect_on_ranks(
      [&](int rank, onebit_comm_t comm) {
        OnebitLamb lamb(comm, {{p.data(), kTotal, lamb_config(0)}});
        lamb.save_file(dir + "/lamb-" + std::to_string(rank) + ".ckpt");
        OnebitAdam adam(comm, {{p.data(), kTotal, adam_config}});
        adam.load_file(dir + "/lamb-" + std::to_string(rank) + ".ckpt");
      },
      {{ONEBIT_INVALID_ARGUMENT, "lamb-0.ckpt is OnebitLamb's checkpoint, not OnebitAdam's"},
       {ONEBIT_INVALID_ARGUMENT, "lamb-1.ckpt is OnebitLamb's checkpoint, not OnebitAdam's"}});
  for (const char* name : {"rank-0.ckpt", "rank-1.ckpt", "lamb-0.ckpt", "lamb-1.ckpt"}) {
    std::remove((dir + "/" + name).c_str());
  }
  ::rmdir(dir.c_str());
}

// A checkpoint of 5 steps (past each shim's first compressed call) loaded into the same shim one
// step later: the tag has run, so its error feedback cannot be taken; every rank refuses in the
// load's agreement, before anything changes.
template <typename Shim, typename Config>
std::function<void(int, onebit_comm_t)> loaded_after_compressed_calls(float* p, Config config) {
  return [=](int rank, onebit_comm_t comm) {
    Shim shim(comm, {{p, kTotal, config}});
    const std::vector<float> g(kTotal, static_cast<float>(rank + 1));
    for (int t = 0; t < 5; ++t) shim.step({g.data()});
    const typename Shim::Checkpoint saved = shim.save();
    throw_unless(!saved.worker_error.empty(), "no compressed call in 5 steps");
    shim.step({g.data()});
    try {
      shim.load(saved);
    } catch (const CallError&) {
      throw_unless(shim.steps() == 6, "the refused load changed the step");
      throw;
    }
  };
}

// A checkpoint of `steps` steps on 2 flat ranks, its recorded layout changed to 2 hosts of 2 ranks,
// loaded into a fresh shim of 2 flat ranks. With error feedback in it (past the first compressed
// call) every rank refuses: it belongs to other chunks. Without (warmup: zeros, a fresh state) it
// loads, whatever the layout.
template <typename Shim, typename Config>
std::function<void(int, onebit_comm_t)> loaded_into_another_layout(float* p, Config config, int steps) {
  return [=](int rank, onebit_comm_t comm) {
    typename Shim::Checkpoint saved;
    {
      Shim shim(comm, {{p, kTotal, config}});
      const std::vector<float> g(kTotal, static_cast<float>(rank + 1));
      for (int t = 0; t < steps; ++t) shim.step({g.data()});
      saved = shim.save();
    }
    throw_unless(saved.world_size == 2 && saved.local_size == 1, "the layout saved is not 2 ranks, flat");
    saved.world_size = 4;
    saved.local_size = 2;
    Shim shim(comm, {{p, kTotal, config}});
    shim.load(saved);
    throw_unless(shim.steps() == steps, "the checkpoint did not load");
  };
}

TEST(ResumeRules, AWarmupCheckpointLoadsIntoAnyLayout) {
  std::vector<float> p(kTotal, 0.0f);
  const Outcome loaded{ONEBIT_SUCCESS, ""};
  const onebit_adam_config_t adam_config{1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 100};
  expect_on_ranks(loaded_into_another_layout<OnebitAdam>(p.data(), adam_config, 2), {loaded, loaded});
  expect_on_ranks(loaded_into_another_layout<OnebitLamb>(p.data(), lamb_config(0), 2), {loaded, loaded});
  expect_on_ranks(loaded_into_another_layout<ZeroOneAdam>(p.data(), zero_one_config(0), 2), {loaded, loaded});
}

TEST(ResumeRules, ErrorFeedbackOfAnotherLayoutIsRefusedOnEveryRank) {
  std::vector<float> p(kTotal, 0.0f);
  const Outcome refused{ONEBIT_INVALID_ARGUMENT,
                        "saved by a job of 4 ranks, 2 per host, loading into one of 2 ranks, flat: each rank's error "
                        "feedback belongs to the chunks"};
  const onebit_adam_config_t adam_config{1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 3};
  expect_on_ranks(loaded_into_another_layout<OnebitAdam>(p.data(), adam_config, 5), {refused, refused});
  expect_on_ranks(loaded_into_another_layout<OnebitLamb>(p.data(), lamb_config(0), 5), {refused, refused});
  expect_on_ranks(loaded_into_another_layout<ZeroOneAdam>(p.data(), zero_one_config(0), 5), {refused, refused});
}

TEST(ResumeRules, ACheckpointIntoAShimWhoseTagHasRunIsRefusedOnEveryRank) {
  std::vector<float> p(kTotal, 0.0f);
  const Outcome refused{ONEBIT_INVALID_ARGUMENT, "has already run; its error feedback loads only before"};
  const onebit_adam_config_t adam_config{1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 3};
  expect_on_ranks(loaded_after_compressed_calls<OnebitAdam>(p.data(), adam_config), {refused, refused});
  expect_on_ranks(loaded_after_compressed_calls<OnebitLamb>(p.data(), lamb_config(0)), {refused, refused});
  expect_on_ranks(loaded_after_compressed_calls<ZeroOneAdam>(p.data(), zero_one_config(0)), {refused, refused});
}

}  // namespace
}  // namespace onebit::testing
