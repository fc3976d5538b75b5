// The C++ optimizer shim (include/onebit/onebit_adam.hpp) with ranks as real processes: its steps
// against an independent replay of docs/algorithm.md's optimizer (the C core's arithmetic, exact sums for
// the warmup average, the fp32 oracle for the compressed one), checkpoints, and failed steps.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "onebit/onebit.h"
#include "onebit/onebit_adam.hpp"
#include "tests/support/float32_oracle.h"
#include "tests/support/loopback_comm.h"
#include "tests/support/multiprocess.h"

namespace onebit::testing {
namespace {

constexpr int kWorld = 4;  // warmup averages of integers are exact: sums are, and ÷4 is
constexpr std::size_t kWeights = 1000, kBiases = 37;
constexpr int kSteps = 12, kFreeze = 4;

onebit_adam_config_t weights_config() { return {0.01f, 0.9f, 0.999f, 1e-8f, 0.01f, kFreeze}; }
onebit_adam_config_t biases_config() { return {0.05f, 0.8f, 0.99f, 1e-6f, 0.0f, kFreeze}; }

// Rank r's gradient at step t, one group: integers in warmup, normal values after.
std::vector<float> gradient(int rank, int step, std::size_t n, unsigned group) {
  std::mt19937 rng(static_cast<unsigned>(rank * 7919 + step * 104729) ^ (group * 0x9e3779b9u));
  std::vector<float> g(n);
  if (step < kFreeze) {
    std::uniform_int_distribution<int> integers(-8, 8);
    for (auto& v : g) v = static_cast<float>(integers(rng));
    // Every 50th element (from 7) gets no gradient in warmup: dormant (onebit.h) once it is frozen,
    // while the compression stage gives it gradients — a unit that wakes up after the freeze.
    for (std::size_t i = 7; i < n; i += 50) g[i] = 0.0f;
  } else {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (auto& v : g) v = normal(rng);
  }
  return g;
}

std::vector<float> initial(std::size_t n, unsigned group) {
  std::vector<float> p(n);
  for (std::size_t i = 0; i < n; ++i) p[i] = std::sin(static_cast<float>(i + group * 1000));
  return p;
}

onebit_comm_t join(int rank, int port) { return join_loopback(rank, kWorld, port); }

// The parameters every rank must hold after `steps` steps, computed without the shim.
std::vector<float> replay(int steps) {
  const std::size_t total = kWeights + kBiases;
  std::vector<float> p = initial(kWeights, 0), b = initial(kBiases, 1);
  std::vector<float> m(total, 0.0f), v(total, 0.0f);
  const onebit_adam_config_t cw = weights_config(), cb = biases_config();
  Float32Oracle oracle(kWorld, total);
  for (int t = 0; t < steps; ++t) {
    std::vector<std::vector<float>> flat(kWorld);
    for (int r = 0; r < kWorld; ++r) {
      flat[r] = gradient(r, t, kWeights, 0);
      const std::vector<float> gb = gradient(r, t, kBiases, 1);
      flat[r].insert(flat[r].end(), gb.begin(), gb.end());
    }
    if (t < kFreeze) {
      std::vector<float> average(total, 0.0f);
      for (int r = 0; r < kWorld; ++r) {
        for (std::size_t i = 0; i < total; ++i) average[i] += flat[r][i];
      }
      for (float& a : average) a /= static_cast<float>(kWorld);
      EXPECT_EQ(onebit_adam_warmup_step(&cw, p.data(), m.data(), v.data(), average.data(), kWeights), ONEBIT_SUCCESS);
      EXPECT_EQ(onebit_adam_warmup_step(&cb, b.data(), m.data() + kWeights, v.data() + kWeights,
                                        average.data() + kWeights, kBiases),
                ONEBIT_SUCCESS);
    } else {
      // Every rank's momentum is the same before the step, its local update differs.
      std::vector<std::vector<float>> local(kWorld, m);
      for (int r = 0; r < kWorld; ++r) {
        onebit_adam_momentum_step(&cw, local[r].data(), flat[r].data(), kWeights);
        onebit_adam_momentum_step(&cb, local[r].data() + kWeights, flat[r].data() + kWeights, kBiases);
      }
      m = oracle.step(local, /*sum=*/false);
      onebit_adam_apply_step(&cw, p.data(), m.data(), v.data(), kWeights);
      onebit_adam_apply_step(&cb, b.data(), m.data() + kWeights, v.data() + kWeights, kBiases);
    }
  }
  p.insert(p.end(), b.begin(), b.end());
  return p;
}

// Runs the shim on every rank for `steps` steps (checkpointing and restoring into a fresh
// communicator and optimizer after `restart_at` steps, if positive); returns each rank's parameters.
std::vector<std::vector<float>> train(int steps, int restart_at, const onebit_adam_auto_freeze_t* automatic = nullptr) {
  const std::size_t total = kWeights + kBiases;
  SharedMemory out(kWorld * total * sizeof(float));
  const int port = free_port(), second_port = free_port();
  auto outcomes = run_ranks(kWorld, [&](int rank) {
    std::vector<float> p = initial(kWeights, 0), b = initial(kBiases, 1);
    auto groups = [&] {
      return std::vector<OnebitAdam::ParamGroup>{{p.data(), kWeights, weights_config()},
                                                 {b.data(), kBiases, biases_config()}};
    };
    onebit_comm_t comm = join(rank, port);
    try {
      auto adam = std::make_unique<OnebitAdam>(comm, groups(), "onebit_adam/momentum", automatic);
      for (int t = 0; t < steps; ++t) {
        if (t == restart_at) {
          const OnebitAdam::Checkpoint saved = adam->save();
          adam.reset();
          onebit_comm_destroy(comm);
          comm = join(rank, second_port);
          adam = std::make_unique<OnebitAdam>(comm, groups(), "onebit_adam/momentum", automatic);
          adam->load(saved);
        }
        const std::vector<float> gw = gradient(rank, t, kWeights, 0), gb = gradient(rank, t, kBiases, 1);
        adam->step({gw.data(), gb.data()});
        RANK_FAILS_IF(adam->compressing() != (t + 1 >= kFreeze), 3);
      }
      RANK_FAILS_IF(adam->freeze_step() != kFreeze, 5);
      // Automatic: measured after steps 1 and 3 (window 2); the first against zeros, so 1.
      if (automatic != nullptr && restart_at < 0) {
        const auto& changes = adam->variance_changes();
        if (changes.size() != 2 || changes[0].first != 1 || changes[0].second != 1.0 || changes[1].first != 3 ||
            !(changes[1].second < automatic->threshold)) {
          return RANK_FAILED(6, "the variance changes are not the replay's");
        }
      }
    } catch (const CallError& error) {
      return RANK_FAILED(4, error.what());
    }
    std::memcpy(out.as<float>() + rank * total, p.data(), kWeights * 4);
    std::memcpy(out.as<float>() + rank * total + kWeights, b.data(), kBiases * 4);
    onebit_comm_destroy(comm);
    return 0;
  });
  std::vector<std::vector<float>> params;
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(outcomes[r].exit_code, 0) << "rank " << r;
    params.emplace_back(out.as<float>() + r * total, out.as<float>() + (r + 1) * total);
  }
  return params;
}

TEST(OnebitAdamShim, TwoGroupsMatchAnIndependentReplayBitForBit) {
  const std::vector<float> expected = replay(kSteps);
  const auto params = train(kSteps, -1);
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_EQ(0, std::memcmp(params[r].data(), expected.data(), expected.size() * 4))
        << "rank " << r << "'s parameters differ from the replay of docs/algorithm.md";
  }
}

TEST(OnebitAdamShim, CheckpointMidCompressionContinuesBitForBit) {
  const std::vector<float> expected = replay(kSteps);
  const auto params = train(kSteps, kFreeze + 3);  // saved with error-feedback state in it
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_EQ(0, std::memcmp(params[r].data(), expected.data(), expected.size() * 4))
        << "rank " << r << ": restored training differs from an uninterrupted run";
  }
}

// freeze_step "auto" (window 2, threshold 0.9): the first measurement, after step 1, compares with
// zeros (change 1); the second, after step 3, sees v move about half of itself and fires, so the
// compression stage starts at step 4 = kFreeze, and the run must be the fixed-freeze replay's, bit
// for bit — also when checkpointed between the two measurements and in the compression stage.
TEST(OnebitAdamShim, AutomaticFreezeFiresWhenTheVarianceSettlesAndMatchesTheReplay) {
  const std::vector<float> expected = replay(kSteps);
  const onebit_adam_auto_freeze_t automatic{2, 0.9, 0};
  for (int restart_at : {-1, 2, kFreeze + 2}) {
    const auto params = train(kSteps, restart_at, &automatic);
    for (int r = 0; r < kWorld; ++r) {
      ASSERT_EQ(0, std::memcmp(params[r].data(), expected.data(), expected.size() * 4))
          << "rank " << r << ", restart at " << restart_at << ": the automatic run differs from the replay";
    }
  }
}

TEST(OnebitAdamShim, AutomaticFreezeRules) {
  const onebit_adam_auto_freeze_t rule{10, 0.1, 25};
  EXPECT_EQ(onebit_adam_auto_freeze_measures(&rule, 8), 0);
  EXPECT_EQ(onebit_adam_auto_freeze_measures(&rule, 9), 1);
  EXPECT_EQ(onebit_adam_auto_freeze_measures(&rule, 19), 1);
  EXPECT_EQ(onebit_adam_auto_freeze_decide(&rule, 9, 0.2), -1);
  EXPECT_EQ(onebit_adam_auto_freeze_decide(&rule, 9, 0.05), 10);
  EXPECT_EQ(onebit_adam_auto_freeze_decide(&rule, 12, 0.0), -1);  // measured nothing: change ignored
  EXPECT_EQ(onebit_adam_auto_freeze_decide(&rule, 23, 1.0), -1);
  EXPECT_EQ(onebit_adam_auto_freeze_decide(&rule, 24, 1.0), 25);  // max_step
  const float v[4] = {1, 2, 3, 4}, then[4] = {1, 1, 3, 2};
  double change = -1;
  ASSERT_EQ(onebit_adam_variance_change(v, then, 4, &change), ONEBIT_SUCCESS);
  EXPECT_EQ(change, 3.0 / 10.0);
  const float zeros[2] = {0, 0};
  ASSERT_EQ(onebit_adam_variance_change(zeros, zeros, 2, &change), ONEBIT_SUCCESS);
  EXPECT_EQ(change, 0.0);
  const onebit_adam_auto_freeze_t bad{0, 0.1, 0};
  EXPECT_EQ(onebit_adam_auto_freeze_measures(&bad, 0), -1);
  EXPECT_NE(std::string(onebit_last_error()).find("window 0"), std::string::npos) << onebit_last_error();
  EXPECT_EQ(onebit_adam_auto_freeze_decide(&bad, 0, 0.0), -2);
  EXPECT_EQ(onebit_adam_variance_change(v, nullptr, 4, &change), ONEBIT_INVALID_ARGUMENT);
}

// The rule across ranks, the one both shims call: the largest of every rank's change decides,
// exactly as given (float64), in any order; a NaN holds the warmup (max_step still ends it).
TEST(OnebitAdamShim, AutomaticFreezeAcrossRanksDecidesOnTheLargestChange) {
  const onebit_adam_auto_freeze_t rule{10, 0.1, 25};
  const double one_unsettled[] = {0.05, 0.12, 0.01};  // average 0.06: under the threshold, the largest is not
  double decided = 0;
  EXPECT_EQ(onebit_adam_auto_freeze_decide_ranks(&rule, 9, one_unsettled, 3, &decided), -1);
  EXPECT_EQ(decided, 0.12);
  const double settled[] = {0.09, 0.05, 0.099999999999999992};  // the last is 0.1's predecessor: exact compare
  EXPECT_EQ(onebit_adam_auto_freeze_decide_ranks(&rule, 9, settled, 3, &decided), 10);
  EXPECT_EQ(decided, 0.099999999999999992);
  const double with_nan[] = {0.01, NAN};
  EXPECT_EQ(onebit_adam_auto_freeze_decide_ranks(&rule, 19, with_nan, 2, &decided), -1);
  EXPECT_TRUE(std::isnan(decided));
  EXPECT_EQ(onebit_adam_auto_freeze_decide_ranks(&rule, 12, nullptr, 0, nullptr), -1);  // measures nothing
  EXPECT_EQ(onebit_adam_auto_freeze_decide_ranks(&rule, 24, nullptr, 0, nullptr), 25);  // max_step
  EXPECT_EQ(onebit_adam_auto_freeze_decide_ranks(&rule, 9, nullptr, 0, &decided), -2);
  EXPECT_NE(std::string(onebit_last_error()).find("step 9 measures the variance: give every rank's change"),
            std::string::npos)
      << onebit_last_error();
}

// The shim decides on the largest change: here rank 0's variance has settled (its snapshot is v)
// and rank 3's has not (its snapshot is zeros: change 1), so the warmup goes on on every rank —
// where an average over the 4 ranks (the rule this shim had, ~0.25) would have frozen it.
TEST(OnebitAdamShim, AutomaticFreezeWaitsForEveryRanksVariance) {
  const std::size_t total = kWeights + kBiases;
  const onebit_adam_auto_freeze_t automatic{1, 0.9, 0};
  const int port = free_port();
  auto outcomes = run_ranks(kWorld, [&](int rank) {
    std::vector<float> p = initial(kWeights, 0), b = initial(kBiases, 1);
    onebit_comm_t comm = join(rank, port);
    try {
      OnebitAdam adam(comm, {{p.data(), kWeights, weights_config()}, {b.data(), kBiases, biases_config()}},
                      "onebit_adam/momentum", &automatic);
      OnebitAdam::Checkpoint start;
      start.m.assign(total, 0.0f);
      start.v.assign(total, 1.0f);
      start.freeze_step = -1;                               // undecided
      start.v_then.assign(total, rank == 3 ? 0.0f : 1.0f);  // rank 3 as if its variance had just begun
      adam.load(start);
      const std::vector<float> gw(kWeights, 1.0f), gb(kBiases, 1.0f);  // v stays 1: rank 0..2 measure 0
      adam.step({gw.data(), gb.data()});
      const auto& changes = adam.variance_changes();
      if (changes.size() != 1 || changes[0].first != 0 || changes[0].second != 1.0) {
        return RANK_FAILED(5, "the change decided on is not rank 3's (1.0)");
      }
      RANK_FAILS_IF(adam.freeze_step() != -1 || adam.compressing(), 6);
    } catch (const CallError& error) {
      return RANK_FAILED(4, error.what());
    }
    onebit_comm_destroy(comm);
    return 0;
  });
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(outcomes[r].exit_code, 0) << "rank " << r;
}

TEST(OnebitAdamShim, NaNGradientFailsTheStepOnEveryRankAndChangesNothing) {
  const int port = free_port();
  auto outcomes = run_ranks(kWorld, [&](int rank) {
    std::vector<float> p = initial(kWeights, 0), b = initial(kBiases, 1);
    onebit_comm_t comm = join(rank, port);
    onebit_adam_config_t cw = weights_config(), cb = biases_config();
    cw.freeze_step = cb.freeze_step = 0;  // compressing from the first step
    OnebitAdam adam(comm, {{p.data(), kWeights, cw}, {b.data(), kBiases, cb}});
    std::vector<float> gw = gradient(rank, kFreeze, kWeights, 0), gb = gradient(rank, kFreeze, kBiases, 1);
    adam.step({gw.data(), gb.data()});
    const std::vector<float> p_before = p, m_before = adam.momentum();
    if (rank == 2) gb[5] = NAN;
    try {
      adam.step({gw.data(), gb.data()});
      return RANK_FAILED(10, "a step with NaN in rank 2's gradient succeeded");
    } catch (const CallError& error) {
      RANK_FAILS_IF(error.code() != ONEBIT_NUMERIC_ERROR, 11);
      const std::string what = error.what();
      RANK_FAILS_IF(what.find("rank 2") == std::string::npos, 12);
      // The step, its stage and the likely causes (include/onebit/optimizer_report.hpp).
      if (what.find("onebit::OnebitAdam step 1 (compression stage since step 0)") == std::string::npos ||
          what.find("learning rate too high") == std::string::npos) {
        return RANK_FAILED(15, "the failed step's message does not name the step and the cause: " + what);
      }
    }
    RANK_FAILS_IF(p != p_before || adam.momentum() != m_before || adam.steps() != 1, 13);
    gb[5] = 0.0f;
    adam.step({gw.data(), gb.data()});  // the communicator is still usable
    onebit_comm_destroy(comm);
    return adam.steps() == 2 ? 0 : 14;
  });
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(outcomes[r].exit_code, 0) << "rank " << r;
}

TEST(OnebitAdamShim, BadGroupsAndGradientsAreRefused) {
  float p[4] = {0, 0, 0, 0};
  onebit_comm_t comm = nullptr;
  ASSERT_EQ(onebit_comm_init(&comm, 0, 1, ""), ONEBIT_SUCCESS) << onebit_last_error();
  onebit_adam_config_t a = weights_config(), b = weights_config();
  b.freeze_step = a.freeze_step + 1;
  try {
    OnebitAdam adam(comm, {{p, 2, a}, {p + 2, 2, b}});
    ADD_FAILURE() << "groups with different freeze steps were accepted";
  } catch (const CallError& error) {
    EXPECT_EQ(error.code(), ONEBIT_INVALID_ARGUMENT);
    EXPECT_NE(std::string(error.what()).find("freeze_step"), std::string::npos) << error.what();
  }
  OnebitAdam adam(comm, {{p, 4, a}});
  try {
    adam.step({});
    ADD_FAILURE() << "a step with no gradients was accepted";
  } catch (const CallError& error) {
    EXPECT_NE(std::string(error.what()).find("0 gradient arrays for 1 groups"), std::string::npos) << error.what();
  }
  EXPECT_EQ(adam.steps(), 0);
  OnebitAdam::Checkpoint wrong;
  wrong.m.resize(3);
  wrong.v.resize(3);
  EXPECT_THROW(adam.load(wrong), CallError);
  onebit_comm_destroy(comm);
}

// The layout all three C++ shims share (flat_parameters.hpp): groups end to end, and a refused
// gather — a NULL array among good ones — leaves the flat gradient exactly as it was.
TEST(FlatLayout, GroupsLieEndToEndAndARefusedGatherChangesNothing) {
  struct Group {
    float* params;
    std::size_t count;
  };
  float p[5] = {0, 0, 0, 0, 0};
  const FlatLayout layout(std::vector<Group>{{p, 2}, {nullptr, 0}, {p + 2, 3}}, "test");
  EXPECT_EQ(layout.total(), 5u);
  EXPECT_EQ(layout.offset(1), 2u);
  EXPECT_EQ(layout.offset(2), 2u);
  std::vector<float> flat(5, -1.0f);
  const float g0[2] = {1, 2}, g2[3] = {3, 4, 5};
  try {
    layout.gather({g0, nullptr, nullptr}, flat, "test::step");
    ADD_FAILURE() << "a NULL gradient for a group with elements was accepted";
  } catch (const CallError& error) {
    EXPECT_EQ(error.code(), ONEBIT_INVALID_ARGUMENT);
    EXPECT_STREQ(error.what(), "test::step: group 2's gradient is NULL");
  }
  EXPECT_EQ(flat, std::vector<float>(5, -1.0f));
  layout.gather({g0, nullptr, g2}, flat, "test::step");  // an empty group may pass NULL
  EXPECT_EQ(flat, (std::vector<float>{1, 2, 3, 4, 5}));
  try {
    FlatLayout(std::vector<Group>{{p, 2}, {nullptr, 1}}, "test");
    ADD_FAILURE() << "NULL params for a group with elements were accepted";
  } catch (const CallError& error) {
    EXPECT_STREQ(error.what(), "test: group 1's params is NULL");
  }
  EXPECT_THROW(FlatLayout(std::vector<Group>{}, "test"), CallError);
}

}  // namespace
}  // namespace onebit::testing
