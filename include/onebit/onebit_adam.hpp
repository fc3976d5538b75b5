// onebit::OnebitAdam — 1-bit Adam for C++ trainers, over raw float arrays in host memory and a
// communicator of the C API (no CUDA path here: device arrays take onebit.h's _device steps).
// Header-only over libonebit.so: the phase logic and arithmetic are the C core's (onebit_adam_*),
// the very functions the PyTorch shim (python/onebit/optim.py) calls, so both shims take the same
// steps bit for bit.
//
//   onebit_comm_t comm;  onebit_comm_init_env(&comm);
//   onebit::OnebitAdam adam(comm, {{weights, n_weights, config}, {biases, n_biases, bias_config}});
//   for (...) { compute this rank's gradients into g_weights, g_biases; adam.step({g_weights, g_biases}); }
//
// step(): in warmup (t < freeze_step) the gradients are averaged over ranks in full precision
// (onebit's exact ring) and Adam runs; then the momentum is updated from the local gradients, its
// one flat buffer (tagged: compressed, error-compensated) is averaged, and the parameters move with
// the frozen variance. ONEBIT_FREEZE_STEP overrides the freeze step.
//
// Errors: the C API's code and message, thrown as onebit::CallError (a std::runtime_error). A failed
// step leaves the parameters, m, v and the step count as they were (a NaN in some rank's momentum
// fails every rank's step alike, naming the step and the likely causes — optimizer_report.hpp —
// and the communicator stays usable; after a transport failure it is broken, as the C API says).
//
// The compression stage follows onebit.h's "Steps under a frozen variance" (dormant elements held,
// steps within Adam's bound: the C core's apply step); at its first step rank 0 writes one line to
// stderr naming the dormant elements.
//
// Automatic freeze: pass an onebit_adam_auto_freeze_t and the groups' freeze_step is ignored (unless
// ONEBIT_FREEZE_STEP is set): the warmup ends by the C core's rule across ranks (onebit.h,
// "Automatic freeze": the largest of every rank's change, in float64, as the Python shim decides),
// measured on the one flat variance, every rank's change gathered exactly (rank_agreement.hpp's
// every_rank). freeze_step() is -1 until it fires.
//
// Checkpoints: save() → Checkpoint (step, m, v, freeze_step and this rank's error-feedback state);
// load() it into a OnebitAdam on the same rank of a job of the same size, with the same groups and
// freeze_step (a fixed one may move only from a checkpoint in warmup under both: resume_rules.hpp),
// before the next step; training continues bit for bit.
#ifndef ONEBIT_ONEBIT_ADAM_HPP_
#define ONEBIT_ONEBIT_ADAM_HPP_

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "onebit/call_error.hpp"
#include "onebit/flat_parameters.hpp"
#include "onebit/onebit.h"
#include "onebit/optimizer_report.hpp"
#include "onebit/rank_agreement.hpp"
#include "onebit/resume_rules.hpp"

namespace onebit {

class OnebitAdam {
 public:
  // A contiguous array of parameters and its hyper-parameters. Every group's freeze_step must be
  // the same: the stage is the optimizer's, not a group's.
  struct ParamGroup {
    float* params;
    std::size_t count;
    onebit_adam_config_t config;
  };

  struct Checkpoint {
    std::int64_t step = 0;
    std::vector<float> m, v;
    std::vector<float> worker_error, server_error;  // this rank's; zeros before the first compressed call
    std::int64_t freeze_step = kNotRecorded;        // as decided (automatic freeze: -1 while undecided)
    std::vector<float> v_then;                      // automatic freeze: v at its last measurement
    std::int64_t world_size = kNotRecorded, local_size = kNotRecorded;  // the layout it was saved in
  };

  OnebitAdam(onebit_comm_t comm, std::vector<ParamGroup> groups, std::string name = "onebit_adam/momentum",
             const onebit_adam_auto_freeze_t* auto_freeze = nullptr)
      : comm_(comm),
        groups_(std::move(groups)),
        name_(std::move(name)),
        layout_(groups_, "onebit::OnebitAdam"),
        total_(layout_.total()) {
    const std::int64_t freeze = groups_[0].config.freeze_step;
    for (std::size_t i = 0; i < groups_.size(); ++i) {
      if (groups_[i].config.freeze_step != freeze) {
        throw CallError(ONEBIT_INVALID_ARGUMENT, "onebit::OnebitAdam: group " + std::to_string(i) +
                                                     " has freeze_step " +
                                                     std::to_string(groups_[i].config.freeze_step) + ", group 0 has " +
                                                     std::to_string(freeze) + ": they must agree");
      }
    }
    std::int64_t effective = onebit_adam_freeze_step(auto_freeze != nullptr ? -1 : freeze);
    if (effective < 0) {  // automatic, and ONEBIT_FREEZE_STEP does not say otherwise
      auto_ = *auto_freeze;
      if (onebit_adam_auto_freeze_measures(&auto_, 0) < 0) check(ONEBIT_INVALID_ARGUMENT);
      automatic_ = true;
      effective = kUndecided;
      v_then_.assign(total_, 0.0f);
    }
    for (ParamGroup& g : groups_) g.config.freeze_step = effective;
    agree_across_ranks(comm_, "onebit::OnebitAdam",
                       {{"the parameter count", static_cast<std::int64_t>(total_)},
                        {"the number of groups", static_cast<std::int64_t>(groups_.size())},
                        {"freeze_step", effective},
                        {"the automatic freeze's window", automatic_ ? auto_.window : 0},
                        {"the automatic freeze's max_step", automatic_ ? auto_.max_step : 0}});
    m_.assign(total_, 0.0f);
    v_.assign(total_, 0.0f);
    grad_.assign(total_, 0.0f);
    m_before_.assign(total_, 0.0f);
    check(onebit_tag(name_.c_str(), m_.data(), total_, ONEBIT_FLOAT32));
  }

  ~OnebitAdam() { onebit_untag(m_.data()); }
  OnebitAdam(const OnebitAdam&) = delete;
  OnebitAdam& operator=(const OnebitAdam&) = delete;

  // One step with this rank's gradients, one array per group (each of the group's count).
  void step(const std::vector<const float*>& grads) {
    layout_.gather(grads, grad_, "onebit::OnebitAdam::step");
    const int compressing = onebit_adam_compressing(&groups_[0].config, step_);
    if (compressing < 0) check(ONEBIT_INVALID_ARGUMENT);
    if (!compressing) {
      check(onebit_allreduce(comm_, grad_.data(), total_, ONEBIT_FLOAT32, ONEBIT_AVG));  // untagged: exact ring
      for (std::size_t i = 0; i < groups_.size(); ++i) {
        check(onebit_adam_warmup_step(&groups_[i].config, groups_[i].params, m_.data() + layout_.offset(i),
                                      v_.data() + layout_.offset(i), grad_.data() + layout_.offset(i),
                                      groups_[i].count));
      }
    } else {
      if (step_ == groups_[0].config.freeze_step) report_freeze(comm_, "onebit::OnebitAdam", step_, frozen_variance());
      const std::string stage = "compression stage since step " + std::to_string(groups_[0].config.freeze_step);
      share_step_settings(name_, groups_, step_, stage);  // before anything changes: it may throw
      for (std::size_t i = 0; i < groups_.size(); ++i) {
        check(onebit_adam_momentum_step_keeping(&groups_[i].config, m_.data() + layout_.offset(i),
                                                m_before_.data() + layout_.offset(i), grad_.data() + layout_.offset(i),
                                                groups_[i].count));
      }
      const onebit_result_t reduced = onebit_allreduce(comm_, m_.data(), total_, ONEBIT_FLOAT32, ONEBIT_AVG);  // tagged
      if (reduced != ONEBIT_SUCCESS) {
        const std::string message = onebit_last_error();
        std::copy(m_before_.begin(), m_before_.end(), m_.begin());
        throw step_failure(reduced, message, "onebit::OnebitAdam", step_, stage);
      }
      for (std::size_t i = 0; i < groups_.size(); ++i) {
        check(onebit_adam_apply_step(&groups_[i].config, groups_[i].params, m_.data() + layout_.offset(i),
                                     v_.data() + layout_.offset(i), groups_[i].count));
      }
    }
    ++step_;
    // The step is taken; this decides the next one's stage. A failure here (the allreduce) leaves
    // the decision to the next measurement, the step counted.
    if (automatic_ && groups_[0].config.freeze_step == kUndecided) decide_freeze(step_ - 1);
  }

  std::int64_t steps() const { return step_; }
  std::int64_t freeze_step() const {
    return groups_[0].config.freeze_step == kUndecided ? -1 : groups_[0].config.freeze_step;
  }
  bool compressing() const { return step_ >= groups_[0].config.freeze_step; }
  // Automatic freeze: (step, change) of every measurement, the change the ranks decided on (the largest).
  const std::vector<std::pair<std::int64_t, double>>& variance_changes() const { return changes_; }
  const std::vector<float>& momentum() const { return m_; }
  const std::vector<float>& variance() const { return v_; }

  Checkpoint save() const {
    Checkpoint c;
    c.step = step_;
    c.m = m_;
    c.v = v_;
    c.freeze_step = freeze_step();
    c.v_then = v_then_;
    std::tie(c.world_size, c.local_size) = compression_layout(comm_);
    save_tag_state(name_, c.worker_error, c.server_error, /*required=*/compressing());  // none yet in warmup
    return c;
  }

  void load(const Checkpoint& c) {
    // Every rank resumes at the same step and freeze, or they part at the freeze (load is collective).
    agree_on_checkpoint(comm_, "onebit::OnebitAdam::load", unfit(c),
                        {{"the checkpoint's step", c.step}, {"the checkpoint's freeze_step", c.freeze_step}});
    // A fixed freeze step goes on only where the checkpoint's stage allows; "auto" takes the checkpoint's decision.
    if (!automatic_) {
      check_resumed_schedule("onebit::OnebitAdam::load", c.step,
                             {"freeze_step", c.freeze_step, groups_[0].config.freeze_step}, /*freeze_inclusive=*/false);
    }
    load_tag_state(name_, c.worker_error, c.server_error);
    step_ = c.step;
    std::copy(c.m.begin(), c.m.end(), m_.begin());  // in place: the tag holds m_'s address
    std::copy(c.v.begin(), c.v.end(), v_.begin());
    if (automatic_) {
      v_then_ = c.v_then;
      for (ParamGroup& g : groups_) g.config.freeze_step = c.freeze_step < 0 ? kUndecided : c.freeze_step;
    }
  }

 private:
  static constexpr std::int64_t kUndecided = INT64_MAX;  // every step is warmup until the rule fires

  static void check(onebit_result_t result) { check_call(result); }

  // Why checkpoint `c` cannot be loaded into this optimizer whatever its step, or "".
  std::string unfit(const Checkpoint& c) const {
    if (c.m.size() != total_ || c.v.size() != total_) {
      return "the checkpoint holds " + std::to_string(c.m.size()) + " + " + std::to_string(c.v.size()) +
             " floats of m and v; this optimizer has " + std::to_string(total_);
    }
    const std::string error_state =
        error_state_unfit(comm_, name_, c.worker_error, c.server_error, c.world_size, c.local_size);
    if (!error_state.empty()) return error_state;
    if (automatic_ && c.v_then.size() != total_) {
      return "this optimizer freezes automatically and the checkpoint holds no variance snapshot (saved by one with "
             "a fixed freeze_step?)";
    }
    if (automatic_ && c.freeze_step == kNotRecorded) {
      return "this optimizer freezes automatically and the checkpoint does not record its freeze_step (-1 while "
             "undecided, else the step decided)";
    }
    if (!automatic_ && !c.v_then.empty()) {
      return "the checkpoint was saved with an automatic freeze (it holds a variance snapshot), this optimizer has "
             "a fixed freeze_step " +
             std::to_string(groups_[0].config.freeze_step) +
             " (ONEBIT_FREEZE_STEP set?): make it with the automatic freeze the run was made with";
    }
    return "";
  }

  std::vector<FrozenVariance> frozen_variance() const { return layout_.frozen_variance(v_.data(), groups_); }

  // After warmup step `taken` under automatic freeze: measure when due, average, decide.
  void decide_freeze(std::int64_t taken) {
    const int due = onebit_adam_auto_freeze_measures(&auto_, taken);
    if (due < 0) check(ONEBIT_INVALID_ARGUMENT);
    std::vector<double> changes;  // every rank's
    if (due == 1) {
      double change = 0.0;
      check(onebit_adam_variance_change(v_.data(), v_then_.data(), total_, &change));
      std::int64_t bits = 0;
      std::memcpy(&bits, &change, sizeof bits);
      for (const auto& row : every_rank(comm_, {bits})) {
        std::memcpy(&change, &row[0], sizeof change);
        changes.push_back(change);
      }
      v_then_ = v_;
    }
    double decided = 0.0;
    const std::int64_t first =
        onebit_adam_auto_freeze_decide_ranks(&auto_, taken, changes.data(), changes.size(), &decided);
    if (first == -2) check(ONEBIT_INVALID_ARGUMENT);
    if (due == 1) changes_.emplace_back(taken, decided);
    if (first >= 0) {
      for (ParamGroup& g : groups_) g.config.freeze_step = first;
    }
  }

  onebit_comm_t comm_;
  std::vector<ParamGroup> groups_;
  std::string name_;
  FlatLayout layout_;
  std::size_t total_;  // layout_.total()
  std::int64_t step_ = 0;
  std::vector<float> m_, v_, grad_, m_before_;
  bool automatic_ = false;
  onebit_adam_auto_freeze_t auto_{};
  std::vector<float> v_then_;
  std::vector<std::pair<std::int64_t, double>> changes_;
};

}  // namespace onebit

#endif  // ONEBIT_ONEBIT_ADAM_HPP_
