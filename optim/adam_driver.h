// OnebitAdam's driver: everything of the optimizer that is not arithmetic and not I/O, written once
// for the C++ and the Python shim (onebit.h, "OnebitAdam's driver"). It owns the step count and the
// stage machine (DeepSpeed's counting first call, warmup, compression), the freeze step and its
// automatic decision with the history of measured changes, each group's step settings (bias
// correction folded in), the fields the ranks must agree on, and what a checkpoint of the schedule
// holds and when it may go on. It never touches an array or a peer: the shim moves the data, runs
// the collectives over its own channel and measures the variance (on the CPU or the device), and
// asks the driver what comes next. That split keeps one rule for both languages and every device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "onebit/onebit_types.h"
#include "optim/onebit_adam.h"

namespace onebit::optim {

struct AdamSchedule {
  std::int64_t freeze_step = 100;  // -1: automatic (the `automatic` rule decides)
  AutoFreeze automatic;
  bool deepspeed_schedule = false;  // the first call only counts (docs/deepspeed.md)
  bool bias_correction = false;
};

// A group's hyper-parameters as the user gave them (float64: Python's floats, C++'s widened).
struct AdamHyper {
  double lr, beta1, beta2, eps, weight_decay;
};

// A checkpoint of the schedule; kNotRecorded marks a field a checkpoint did not record.
struct AdamDriverState {
  static constexpr std::int64_t kNotRecorded = std::numeric_limits<std::int64_t>::min();
  std::int64_t step = 0;
  std::int64_t freeze_step = kNotRecorded;  // as decided; -1 or INT64_MAX: automatic, undecided
  bool automatic = false;                   // saved with freeze_step "auto" (it holds a variance snapshot)
  std::int64_t bias_correction = kNotRecorded;
  std::int64_t deepspeed_schedule = kNotRecorded;
};

class AdamDriver {
 public:
  static constexpr std::int64_t kUndecided = std::numeric_limits<std::int64_t>::max();

  // Throws Error(ONEBIT_INVALID_ARGUMENT) naming `who` and the setting for a schedule that cannot
  // run. ONEBIT_FREEZE_STEP, when set, overrides the requested freeze step ("auto" too).
  AdamDriver(std::string who, const AdamSchedule& schedule, std::size_t parameters, std::size_t groups);

  std::int64_t step() const { return step_; }
  std::int64_t freeze_step() const { return freeze_; }  // kUndecided until the automatic rule fires
  bool automatic() const { return automatic_; }
  // The updates made: under DeepSpeed's schedule the first call made none.
  std::int64_t steps_taken() const { return step_ > 0 && deepspeed_ ? step_ - 1 : step_; }
  bool compressing() const { return step_ >= freeze_; }
  onebit_adam_step_kind_t next() const;
  bool freezes_now() const { return step_ == freeze_; }  // the next step is the first compressed one

  // The C core's config of one group for the next step. With bias correction, Adam's corrected
  // rule lr m̂/(sqrt(v̂) + eps) + lr wd p in the uncorrected one: lr sqrt(c2)/c1, eps sqrt(c2),
  // wd c1/sqrt(c2), with c1 = 1 - beta1^t, c2 = 1 - beta2^min(t, max(freeze_step, 1)), t the updates
  // so far this one included: the variance's correction freezes with it.
  onebit_adam_config_t config(const AdamHyper& group) const;

  // The step was taken. True when the automatic rule wants the variance change measured now: the
  // shim measures it (onebit_adam_variance_change), gathers every rank's exactly and calls decide().
  bool taken();
  void decide(const double* changes, std::size_t ranks);
  // What rank 0 logs of the last step: the automatic freeze's decision, or "" (the next taken() clears it).
  const std::string& news() const { return news_; }
  // (step, the change the ranks decided on) of every measurement.
  const std::vector<std::pair<std::int64_t, double>>& changes() const { return changes_; }

  // What every rank must hold alike, named; `state` (nullable) gives a checkpoint's step and freeze.
  std::vector<std::pair<const char*, std::int64_t>> agreed_fields(const AdamDriverState* state) const;

  AdamDriverState state() const;
  // Why a checkpoint of `saved` cannot go on under this schedule, or "".
  std::string resume_refusal(const AdamDriverState& saved) const;
  // Goes on from `saved` (resume_refusal() said ""): its step, and with "auto" its decision and history.
  void resume(const AdamDriverState& saved, std::vector<std::pair<std::int64_t, double>> changes);

 private:
  void decide_on(double change, bool measured);

  std::string who_;
  std::size_t parameters_, groups_;
  bool automatic_ = false, deepspeed_, bias_correction_;
  AutoFreeze rule_{};
  std::int64_t step_ = 0, freeze_ = 0;
  bool measure_due_ = false;  // taken() asked for a measurement that decide() has not had yet
  std::vector<std::pair<std::int64_t, double>> changes_;
  std::string news_;
};

}  // namespace onebit::optim
