// OnebitAdam's driver through the C ABI (onebit.h, "OnebitAdam's driver"): the schedule both shims
// run, its automatic freeze, the step settings, what the ranks agree on and what a checkpoint may
// resume. The shims' own tests run it with real ranks (tests/engine/onebit_adam_test.cc,
// tests/python/shim_languages_check.py); here each rule is pinned by itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "onebit/onebit.h"

namespace {

constexpr std::int64_t kNotRecorded = std::numeric_limits<std::int64_t>::min();
constexpr std::int64_t kUndecided = std::numeric_limits<std::int64_t>::max();

onebit_adam_schedule_t fixed(std::int64_t freeze, bool deepspeed = false, bool bias_correction = false) {
  return {freeze, {10, 0.1, 0}, deepspeed ? 1 : 0, bias_correction ? 1 : 0};
}

onebit_adam_schedule_t automatic(std::int64_t window, double threshold, std::int64_t max_step) {
  return {-1, {window, threshold, max_step}, 0, 0};
}

// An owned driver; ASSERTs that it was made.
class Driver {
 public:
  explicit Driver(const onebit_adam_schedule_t& schedule) {
    EXPECT_EQ(onebit_adam_driver_create("OnebitAdam", &schedule, 1037, 2, &driver_), ONEBIT_SUCCESS)
        << onebit_last_error();
  }
  ~Driver() { onebit_adam_driver_destroy(driver_); }
  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;

  onebit_adam_driver_t get() const { return driver_; }
  onebit_adam_driver_status_t status() const {
    onebit_adam_driver_status_t s{};
    EXPECT_EQ(onebit_adam_driver_status(driver_, &s), ONEBIT_SUCCESS);
    return s;
  }
  bool taken() const {
    int measure = -1;
    EXPECT_EQ(onebit_adam_driver_taken(driver_, &measure), ONEBIT_SUCCESS);
    return measure == 1;
  }
  std::string news() const { return text(onebit_adam_driver_news); }
  std::string refusal(const onebit_adam_driver_state_t& saved) const {
    char text[512];
    size_t length = 0;
    EXPECT_EQ(onebit_adam_driver_resume_refusal(driver_, &saved, text, sizeof text, &length), ONEBIT_SUCCESS);
    return text;
  }

 private:
  template <typename Call>
  std::string text(Call call) const {
    char text[512];
    size_t length = 0;
    EXPECT_EQ(call(driver_, text, sizeof text, &length), ONEBIT_SUCCESS);
    return text;
  }

  onebit_adam_driver_t driver_ = nullptr;
};

TEST(AdamDriver, AFixedScheduleWarmsUpThenCompressesAndSaysTheFreezeOnce) {
  Driver d(fixed(3));
  std::vector<std::pair<int, int>> seen;  // (next, freezes_now) of steps 0..5
  for (int t = 0; t < 6; ++t) {
    const auto s = d.status();
    EXPECT_EQ(s.step, t);
    EXPECT_EQ(s.steps_taken, t);
    EXPECT_EQ(s.freeze_step, 3);
    seen.emplace_back(s.next, s.freezes_now);
    EXPECT_FALSE(d.taken());  // a fixed freeze never measures
    EXPECT_EQ(d.news(), "");
  }
  const std::vector<std::pair<int, int>> want{{ONEBIT_ADAM_WARMUP_STEP, 0},     {ONEBIT_ADAM_WARMUP_STEP, 0},
                                              {ONEBIT_ADAM_WARMUP_STEP, 0},     {ONEBIT_ADAM_COMPRESSED_STEP, 1},
                                              {ONEBIT_ADAM_COMPRESSED_STEP, 0}, {ONEBIT_ADAM_COMPRESSED_STEP, 0}};
  EXPECT_EQ(seen, want);
}

TEST(AdamDriver, DeepSpeedsFirstCallOnlyCountsAndItsFreezeIsAtLeastTwo) {
  Driver d(fixed(1, /*deepspeed=*/true));
  EXPECT_EQ(d.status().next, ONEBIT_ADAM_COUNTING_STEP);
  EXPECT_EQ(d.status().freeze_step, 2);  // DeepSpeed's freeze check skips its initialising call
  d.taken();
  EXPECT_EQ(d.status().steps_taken, 0);
  EXPECT_EQ(d.status().next, ONEBIT_ADAM_WARMUP_STEP);
  d.taken();
  const auto s = d.status();
  EXPECT_EQ(s.next, ONEBIT_ADAM_COMPRESSED_STEP);
  EXPECT_EQ(s.freezes_now, 1);
  EXPECT_EQ(s.steps_taken, 1);
}

TEST(AdamDriver, TheAutomaticFreezeMeasuresEveryWindowAndDecidesOnTheLargestChange) {
  Driver d(automatic(2, 0.3, 0));
  EXPECT_EQ(d.status().freeze_step, -1);
  EXPECT_FALSE(d.taken());  // after step 0: not a window's end
  EXPECT_TRUE(d.taken());   // after step 1
  const double first[] = {0.2, 0.5};
  ASSERT_EQ(onebit_adam_driver_decide(d.get(), first, 2), ONEBIT_SUCCESS);
  EXPECT_EQ(d.status().freeze_step, -1);  // the largest, 0.5, is not under 0.3
  EXPECT_EQ(d.news(), "");
  EXPECT_FALSE(d.taken());
  EXPECT_TRUE(d.taken());  // after step 3
  const double second[] = {0.125, 0.25};
  ASSERT_EQ(onebit_adam_driver_decide(d.get(), second, 2), ONEBIT_SUCCESS);
  EXPECT_EQ(d.status().freeze_step, 4);
  EXPECT_EQ(d.status().next, ONEBIT_ADAM_COMPRESSED_STEP);
  EXPECT_EQ(d.status().freezes_now, 1);
  EXPECT_EQ(d.news(),
            "OnebitAdam: freeze_step='auto' fired after step 3: the variance moved 0.2500 < 0.3 over the last 2 "
            "steps; compression from step 4");
  std::int64_t steps[4] = {};
  double changes[4] = {};
  size_t count = 0;
  ASSERT_EQ(onebit_adam_driver_changes(d.get(), steps, changes, 4, &count), ONEBIT_SUCCESS);
  ASSERT_EQ(count, 2u);
  EXPECT_EQ(steps[0], 1);
  EXPECT_EQ(changes[0], 0.5);
  EXPECT_EQ(steps[1], 3);
  EXPECT_EQ(changes[1], 0.25);
  EXPECT_FALSE(d.taken());  // decided: nothing more to measure
  EXPECT_EQ(d.news(), "");  // said once
}

TEST(AdamDriver, MaxFreezeStepEndsTheWarmupWithoutAMeasurement) {
  Driver d(automatic(10, 0.1, 3));
  EXPECT_FALSE(d.taken());
  EXPECT_FALSE(d.taken());
  EXPECT_FALSE(d.taken());  // after step 2: max_step 3 fires
  EXPECT_EQ(d.status().freeze_step, 3);
  EXPECT_EQ(d.news(), "OnebitAdam: freeze_step='auto' fired after step 2: max_freeze_step 3; compression from step 3");
  size_t count = 7;
  ASSERT_EQ(onebit_adam_driver_changes(d.get(), nullptr, nullptr, 0, &count), ONEBIT_SUCCESS);
  EXPECT_EQ(count, 0u);
}

TEST(AdamDriver, ADecisionNotDueIsRefusedAndChangesNothing) {
  Driver d(automatic(2, 0.3, 0));
  d.taken();  // after step 0: nothing due
  const double change = 0.0;
  EXPECT_EQ(onebit_adam_driver_decide(d.get(), &change, 1), ONEBIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(onebit_last_error()).find("no variance measurement is due after step 0"), std::string::npos)
      << onebit_last_error();
  EXPECT_EQ(d.status().freeze_step, -1);
  EXPECT_TRUE(d.taken());
  EXPECT_EQ(onebit_adam_driver_decide(d.get(), &change, 0), ONEBIT_INVALID_ARGUMENT);  // no rank's change
  EXPECT_EQ(d.status().freeze_step, -1);
  const double settled = 0.5;
  ASSERT_EQ(onebit_adam_driver_decide(d.get(), &settled, 1), ONEBIT_SUCCESS);
  EXPECT_EQ(onebit_adam_driver_decide(d.get(), &settled, 1), ONEBIT_INVALID_ARGUMENT);  // once a measurement
  size_t count = 0;
  ASSERT_EQ(onebit_adam_driver_changes(d.get(), nullptr, nullptr, 0, &count), ONEBIT_SUCCESS);
  EXPECT_EQ(count, 1u);
}

TEST(AdamDriver, BiasCorrectionFoldsIntoTheStepSettingsAndFreezesWithTheVariance) {
  Driver d(fixed(3, false, /*bias_correction=*/true));
  const onebit_adam_hyper_t hyper{1e-3, 0.9, 0.999, 1e-8, 0.01};
  for (int t = 0; t < 6; ++t) {
    onebit_adam_config_t c{};
    ASSERT_EQ(onebit_adam_driver_config(d.get(), &hyper, &c), ONEBIT_SUCCESS);
    const double updates = t + 1;
    const double c1 = 1.0 - std::pow(0.9, updates);
    const double c2 = 1.0 - std::pow(0.999, std::min(updates, 3.0));  // frozen at the freeze step, 3
    EXPECT_EQ(c.lr, static_cast<float>(1e-3 * std::pow(c2, 0.5) / c1)) << "step " << t;
    EXPECT_EQ(c.eps, static_cast<float>(1e-8 * std::pow(c2, 0.5))) << "step " << t;
    EXPECT_EQ(c.weight_decay, static_cast<float>(0.01 * c1 / std::pow(c2, 0.5))) << "step " << t;
    EXPECT_EQ(c.beta1, 0.9f);
    EXPECT_EQ(c.beta2, 0.999f);
    EXPECT_EQ(c.freeze_step, 3);
    d.taken();
  }
  Driver plain(fixed(3));
  onebit_adam_config_t c{};
  ASSERT_EQ(onebit_adam_driver_config(plain.get(), &hyper, &c), ONEBIT_SUCCESS);
  EXPECT_EQ(c.lr, 1e-3f);  // without it: the settings as given
  EXPECT_EQ(c.eps, 1e-8f);
  EXPECT_EQ(c.weight_decay, 0.01f);
}

TEST(AdamDriver, SchedulesThatCannotRunAreRefusedByName) {
  const std::vector<std::pair<onebit_adam_schedule_t, std::string>> refused{
      {fixed(-2), "OnebitAdam: freeze_step must be a step (>= 0) or automatic (-1, Python's 'auto'), not -2"},
      {{-1, {10, 0.1, 0}, 1, 0}, "OnebitAdam: deepspeed_schedule=True takes a fixed freeze_step"},
      {fixed(5, true, true), "OnebitAdam: deepspeed_schedule=True runs DeepSpeed's rule, which has no bias correction"},
      {automatic(0, 0.1, 0), "auto freeze config out of range: window 0"},
      {automatic(2, -1.0, 0), "auto freeze config out of range: window 2, threshold -1"},
  };
  for (const auto& [schedule, says] : refused) {
    onebit_adam_driver_t d = nullptr;
    EXPECT_EQ(onebit_adam_driver_create("OnebitAdam", &schedule, 10, 1, &d), ONEBIT_INVALID_ARGUMENT);
    EXPECT_EQ(d, nullptr);
    EXPECT_NE(std::string(onebit_last_error()).find(says), std::string::npos) << onebit_last_error();
  }
  const onebit_adam_schedule_t s = fixed(5);
  onebit_adam_driver_t d = nullptr;
  EXPECT_EQ(onebit_adam_driver_create("OnebitAdam", nullptr, 10, 1, &d), ONEBIT_INVALID_ARGUMENT);
  EXPECT_EQ(onebit_adam_driver_create("OnebitAdam", &s, 10, 1, nullptr), ONEBIT_INVALID_ARGUMENT);
  onebit_adam_driver_status_t status{};
  EXPECT_EQ(onebit_adam_driver_status(nullptr, &status), ONEBIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(onebit_last_error()).find("driver is NULL"), std::string::npos);
  onebit_adam_driver_destroy(nullptr);  // does nothing, as free(NULL)
}

TEST(AdamDriver, TheAgreedFieldsNameTheScheduleAndACheckpointsStepAndDecision) {
  Driver d(automatic(2, 0.3, 9));
  const char* names[16] = {};
  std::int64_t values[16] = {};
  size_t count = 0;
  ASSERT_EQ(onebit_adam_driver_agreed_fields(d.get(), nullptr, names, values, 16, &count), ONEBIT_SUCCESS);
  ASSERT_EQ(count, 9u);
  const std::vector<std::string> want{"parameters",
                                      "groups",
                                      "step",
                                      "freeze_step",
                                      "freeze_window",
                                      "freeze_threshold_bits",
                                      "max_freeze_step",
                                      "deepspeed_schedule",
                                      "bias_correction"};
  for (size_t i = 0; i < count; ++i) EXPECT_EQ(names[i], want[i]);
  const double threshold = 0.3;
  std::int64_t bits = 0;
  std::memcpy(&bits, &threshold, sizeof bits);
  const std::vector<std::int64_t> mine{1037, 2, 0, kUndecided, 2, bits, 9, 0, 0};
  EXPECT_EQ(std::vector<std::int64_t>(values, values + count), mine);
  // At load: the checkpoint's step and, with "auto", its decision (-1: undecided).
  const onebit_adam_driver_state_t saved{7, 6, 1, 0, 0};
  ASSERT_EQ(onebit_adam_driver_agreed_fields(d.get(), &saved, names, values, 16, &count), ONEBIT_SUCCESS);
  EXPECT_EQ(values[2], 7);
  EXPECT_EQ(values[3], 6);
  const onebit_adam_driver_state_t undecided{7, -1, 1, 0, 0};
  ASSERT_EQ(onebit_adam_driver_agreed_fields(d.get(), &undecided, names, values, 16, &count), ONEBIT_SUCCESS);
  EXPECT_EQ(values[3], kUndecided);
}

TEST(AdamDriver, ACheckpointGoesOnOnlyUnderTheScheduleItWasMadeWith) {
  Driver fixed_at_5(fixed(5));
  Driver automatic_one(automatic(2, 0.3, 0));
  Driver with_bias(fixed(5, false, true));
  Driver deepspeed(fixed(5, true));
  // {driver, saved, what its refusal says ("" : none)}
  const std::vector<std::tuple<const Driver*, onebit_adam_driver_state_t, std::string>> cases{
      {&fixed_at_5, {3, 4, 0, 0, 0}, ""},  // in warmup under both freeze steps: may move
      {&fixed_at_5, {6, 4, 0, 0, 0}, "freeze_step"},
      {&fixed_at_5, {6, kNotRecorded, 0, kNotRecorded, kNotRecorded}, ""},  // not recorded: this optimizer's
      {&fixed_at_5, {3, 5, 1, 0, 0}, "the checkpoint was saved with freeze_step='auto'"},
      {&automatic_one, {3, 5, 0, 0, 0}, "this optimizer freezes automatically (freeze_step='auto') and the checkpoint"},
      {&automatic_one, {3, kNotRecorded, 1, 0, 0}, "does not record its freeze_step"},
      {&automatic_one, {9, 4, 1, 0, 0}, ""},  // the checkpoint's decision goes on
      {&fixed_at_5, {3, 5, 0, 1, 0}, "the checkpoint was saved with bias_correction=True, this optimizer has False"},
      {&with_bias, {3, 5, 0, kNotRecorded, 0}, "bias_correction=False, this optimizer has True"},
      {&deepspeed, {3, 5, 0, 0, 0}, "deepspeed_schedule=False, this optimizer has True"},
      {&deepspeed, {3, 5, 0, 0, kNotRecorded}, ""},
      {&fixed_at_5, {-1, 5, 0, 0, 0}, "the checkpoint's schedule is malformed (step -1, freeze_step 5)"},
      {&automatic_one, {3, -7, 1, 0, 0}, "the checkpoint's schedule is malformed (step 3, freeze_step -7)"},
  };
  for (const auto& [driver, saved, says] : cases) {
    const std::string refusal = driver->refusal(saved);
    if (says.empty()) {
      EXPECT_EQ(refusal, "") << "step " << saved.step;
    } else {
      EXPECT_NE(refusal.find(says), std::string::npos) << refusal;
    }
  }
  // Resuming: the step, and under "auto" the decision and the measurements; a refusal changes nothing.
  const std::int64_t steps[] = {1, 3};
  const double changes[] = {0.5, 0.25};
  const onebit_adam_driver_state_t decided{9, 4, 1, 0, 0};
  ASSERT_EQ(onebit_adam_driver_resume(automatic_one.get(), &decided, steps, changes, 2), ONEBIT_SUCCESS);
  EXPECT_EQ(automatic_one.status().step, 9);
  EXPECT_EQ(automatic_one.status().freeze_step, 4);
  size_t count = 0;
  ASSERT_EQ(onebit_adam_driver_changes(automatic_one.get(), nullptr, nullptr, 0, &count), ONEBIT_SUCCESS);
  EXPECT_EQ(count, 2u);
  const onebit_adam_driver_state_t moved{6, 4, 0, 0, 0};
  EXPECT_EQ(onebit_adam_driver_resume(fixed_at_5.get(), &moved, nullptr, nullptr, 0), ONEBIT_INVALID_ARGUMENT);
  EXPECT_EQ(fixed_at_5.status().step, 0);
  onebit_adam_driver_state_t state{};
  ASSERT_EQ(onebit_adam_driver_state(automatic_one.get(), &state), ONEBIT_SUCCESS);
  EXPECT_EQ(state.step, 9);
  EXPECT_EQ(state.freeze_step, 4);
  EXPECT_EQ(state.automatic, 1);
}

}  // namespace
