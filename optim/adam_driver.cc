#include "optim/adam_driver.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "common/error.h"
#include "optim/agreement.h"

namespace onebit::optim {

namespace {

// A checkpoint's freeze step as this driver keeps it: -1 (the C++ shim's "undecided") is kUndecided.
std::int64_t decided_or_undecided(std::int64_t saved) { return saved == -1 ? AdamDriver::kUndecided : saved; }

std::string said(std::int64_t recorded) { return recorded != 0 ? "True" : "False"; }

}  // namespace

AdamDriver::AdamDriver(std::string who, const AdamSchedule& schedule, std::size_t parameters, std::size_t groups)
    : who_(std::move(who)),
      parameters_(parameters),
      groups_(groups),
      deepspeed_(schedule.deepspeed_schedule),
      bias_correction_(schedule.bias_correction) {
  const bool requested_auto = schedule.freeze_step == -1;
  ONEBIT_CHECK(schedule.freeze_step >= -1, ONEBIT_INVALID_ARGUMENT, who_, ": freeze_step must be a step (>= 0) or ",
               "automatic (-1, Python's 'auto'), not ", schedule.freeze_step);
  ONEBIT_CHECK(!(deepspeed_ && requested_auto), ONEBIT_INVALID_ARGUMENT, who_,
               ": deepspeed_schedule=True takes a fixed freeze_step (DeepSpeed has no 'auto')");
  ONEBIT_CHECK(!(deepspeed_ && bias_correction_), ONEBIT_INVALID_ARGUMENT, who_,
               ": deepspeed_schedule=True runs DeepSpeed's rule, which has no bias correction: leave "
               "bias_correction=False");
  freeze_ = optim::freeze_step(schedule.freeze_step);  // ONEBIT_FREEZE_STEP overrides, "auto" too
  if (freeze_ < 0) {
    rule_ = schedule.automatic;
    check(rule_);
    automatic_ = true;
    freeze_ = kUndecided;
  }
  // DeepSpeed's freeze check skips its initialising call: F <= 2 all compress from call 3.
  if (deepspeed_) freeze_ = std::max<std::int64_t>(freeze_, 2);
}

onebit_adam_step_kind_t AdamDriver::next() const {
  if (deepspeed_ && step_ == 0) return ONEBIT_ADAM_COUNTING_STEP;  // DeepSpeed's initialising call
  return compressing() ? ONEBIT_ADAM_COMPRESSED_STEP : ONEBIT_ADAM_WARMUP_STEP;
}

onebit_adam_config_t AdamDriver::config(const AdamHyper& g) const {
  double lr = g.lr, eps = g.eps, weight_decay = g.weight_decay;
  if (bias_correction_) {
    const double updates = static_cast<double>(step_ + 1);
    const double c1 = 1.0 - std::pow(g.beta1, updates);
    // freeze_step 0: v is 0, every element dormant; the exponent stays 1.
    const double frozen = static_cast<double>(std::max<std::int64_t>(freeze_, 1));
    const double c2 = 1.0 - std::pow(g.beta2, std::min(updates, frozen));
    const double root = std::pow(c2, 0.5);  // pow, not sqrt: the bits the Python shim had before the driver
    lr = lr * root / c1;
    eps = eps * root;
    weight_decay = weight_decay * c1 / root;
  }
  return onebit_adam_config_t{static_cast<float>(lr),  static_cast<float>(g.beta1),      static_cast<float>(g.beta2),
                              static_cast<float>(eps), static_cast<float>(weight_decay), freeze_};
}

bool AdamDriver::taken() {
  ++step_;
  news_.clear();
  if (!automatic_ || freeze_ != kUndecided) return false;
  measure_due_ = measures(rule_, step_ - 1);
  if (measure_due_) return true;            // decide() follows with every rank's change
  decide_on(INFINITY, /*measured=*/false);  // only max_step can end the warmup here
  return false;
}

void AdamDriver::decide(const double* changes, std::size_t ranks) {
  ONEBIT_CHECK(measure_due_, ONEBIT_INVALID_ARGUMENT, who_, ": no variance measurement is due after step ", step_ - 1);
  ONEBIT_CHECK(ranks >= 1 && changes != nullptr, ONEBIT_INVALID_ARGUMENT, who_,
               ": decide takes every rank's change (got ", ranks, ")");
  measure_due_ = false;
  decide_on(largest_change(changes, ranks), /*measured=*/true);
}

void AdamDriver::decide_on(double change, bool measured) {
  const std::int64_t taken = step_ - 1;
  if (measured) changes_.emplace_back(taken, change);
  const std::int64_t first = optim::decide(rule_, taken, change);
  if (first < 0) return;
  freeze_ = first;
  char why[160];
  if (measured && change < rule_.threshold) {
    std::snprintf(why, sizeof why, "the variance moved %.4f < %g over the last %lld steps", change, rule_.threshold,
                  static_cast<long long>(rule_.window));
  } else {
    std::snprintf(why, sizeof why, "max_freeze_step %lld", static_cast<long long>(rule_.max_step));
  }
  news_ = who_ + ": freeze_step='auto' fired after step " + std::to_string(taken) + ": " + why +
          "; compression from step " + std::to_string(first);
}

std::vector<std::pair<const char*, std::int64_t>> AdamDriver::agreed_fields(const AdamDriverState* state) const {
  std::int64_t threshold_bits = 0;
  static_assert(sizeof threshold_bits == sizeof rule_.threshold);
  std::memcpy(&threshold_bits, &rule_.threshold, sizeof threshold_bits);
  // A fixed freeze step is this optimizer's whatever the checkpoint says (resume_refusal judges it).
  const bool resumes_decision = state != nullptr && automatic_ && state->freeze_step != AdamDriverState::kNotRecorded;
  return {{"parameters", static_cast<std::int64_t>(parameters_)},
          {"groups", static_cast<std::int64_t>(groups_)},
          {"step", state != nullptr ? state->step : step_},
          {"freeze_step", resumes_decision ? decided_or_undecided(state->freeze_step) : freeze_},
          {"freeze_window", automatic_ ? rule_.window : 0},
          {"freeze_threshold_bits", automatic_ ? threshold_bits : 0},
          {"max_freeze_step", automatic_ ? rule_.max_step : 0},
          {"deepspeed_schedule", deepspeed_ ? 1 : 0},
          {"bias_correction", bias_correction_ ? 1 : 0}};
}

AdamDriverState AdamDriver::state() const {
  return AdamDriverState{step_, freeze_, automatic_, bias_correction_ ? 1 : 0, deepspeed_ ? 1 : 0};
}

std::string AdamDriver::resume_refusal(const AdamDriverState& saved) const {
  const std::int64_t freeze = saved.freeze_step;
  if (saved.step < 0 || (freeze < -1 && freeze != AdamDriverState::kNotRecorded)) {
    return "the checkpoint's schedule is malformed (step " + std::to_string(saved.step) + ", freeze_step " +
           std::to_string(freeze) + ")";
  }
  if (saved.automatic != automatic_) {
    return automatic_ ? "this optimizer freezes automatically (freeze_step='auto') and the checkpoint was saved "
                        "with a fixed freeze_step (it holds no variance snapshot): make the optimizer as the run was "
                        "made"
                      : "the checkpoint was saved with freeze_step='auto' (it holds a variance snapshot), this "
                        "optimizer has a fixed freeze_step " +
                            std::to_string(freeze_) +
                            " (ONEBIT_FREEZE_STEP set?): make the optimizer with the automatic freeze the run was "
                            "made with";
  }
  if (automatic_ && saved.freeze_step == AdamDriverState::kNotRecorded) {
    return "this optimizer freezes automatically and the checkpoint does not record its freeze_step (-1 while "
           "undecided, else the step decided)";
  }
  const std::int64_t bias = saved.bias_correction == AdamDriverState::kNotRecorded ? 0 : saved.bias_correction;
  if ((bias != 0) != bias_correction_) {
    return "the checkpoint was saved with bias_correction=" + said(bias) + ", this optimizer has " +
           said(bias_correction_) + ": the steps would change size on resume; make the optimizer as the run was made";
  }
  if (saved.deepspeed_schedule != AdamDriverState::kNotRecorded && (saved.deepspeed_schedule != 0) != deepspeed_) {
    return "the checkpoint was saved with deepspeed_schedule=" + said(saved.deepspeed_schedule) +
           ", this optimizer has " + said(deepspeed_) +
           ": the steps would count from another origin on resume (the freeze one step off, the bias correction "
           "changed); make the optimizer as the run was made";
  }
  if (automatic_) return "";  // the checkpoint's decision goes on
  return optim::resume_refusal(saved.step, {{"freeze_step", saved.freeze_step, freeze_}}, /*freeze_inclusive=*/false);
}

void AdamDriver::resume(const AdamDriverState& saved, std::vector<std::pair<std::int64_t, double>> changes) {
  const std::string refusal = resume_refusal(saved);
  ONEBIT_CHECK(refusal.empty(), ONEBIT_INVALID_ARGUMENT, who_, ": ", refusal);
  step_ = saved.step;
  measure_due_ = false;
  if (automatic_) {
    freeze_ = decided_or_undecided(saved.freeze_step);
    changes_ = std::move(changes);
  }
}

}  // namespace onebit::optim
