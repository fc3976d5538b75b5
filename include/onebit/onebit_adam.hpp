// onebit::OnebitAdam — 1-bit Adam for C++ trainers, over raw float arrays in host memory and a
// communicator of the C API (no CUDA path here: device arrays take onebit.h's _device steps).
// An adapter, as the PyTorch shim (python/onebit/onebit_adam.py) is: the schedule — what each step
// is, the freeze and its automatic decision, the step settings, what the ranks agree on, when a
// checkpoint may go on, and every message — is the C core's driver (onebit.h, "OnebitAdam's
// driver"), the arithmetic its onebit_adam_* steps; this class holds the arrays, gathers the
// gradients and runs the collectives on `comm`. Both languages take the same steps bit for bit.
//
//   onebit_comm_t comm;  onebit_comm_init_env(&comm);
//   onebit::OnebitAdam adam(comm, {{weights, n_weights, config}, {biases, n_biases, bias_config}});
//   for (...) { compute this rank's gradients into g_weights, g_biases; adam.step({g_weights, g_biases}); }
//
// Errors: the C API's code and message, thrown as onebit::CallError (a std::runtime_error). A failed
// step leaves the parameters, m, v and the step count as they were (a NaN in some rank's momentum
// fails every rank's step alike, naming the step and the likely causes, and the communicator stays
// usable; after a transport failure it is broken, as the C API says). Rank 0 writes one line to
// stderr at the freeze (the dormant elements) and when the automatic freeze fires.
//
// Checkpoints: save() → Checkpoint (the schedule, m, v and this rank's error-feedback state); load()
// it into a OnebitAdam on the same rank of a job of the same layout, before the next step: training
// continues bit for bit. load() is collective and refuses, on every rank alike, what cannot go on.
#ifndef ONEBIT_ONEBIT_ADAM_HPP_
#define ONEBIT_ONEBIT_ADAM_HPP_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
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
    std::vector<std::pair<std::int64_t, double>> variance_changes;      // automatic freeze: its measurements
    std::int64_t world_size = kNotRecorded, local_size = kNotRecorded;  // the layout it was saved in
    std::int64_t bias_correction = kNotRecorded, deepspeed_schedule = kNotRecorded;
  };

  // The schedule from the groups' freeze_step, or the automatic freeze when `auto_freeze` is given.
  OnebitAdam(onebit_comm_t comm, std::vector<ParamGroup> groups, std::string name = "onebit_adam/momentum",
             const onebit_adam_auto_freeze_t* auto_freeze = nullptr)
      : OnebitAdam(comm, groups, std::move(name), schedule_of(groups, auto_freeze)) {}

  // Any schedule of the C core's driver: also DeepSpeed's schedule and bias correction (onebit.h,
  // "OnebitAdam's driver"); the groups' freeze_step is not read.
  OnebitAdam(onebit_comm_t comm, std::vector<ParamGroup> groups, std::string name,
             const onebit_adam_schedule_t& schedule)
      : comm_(comm),
        groups_(std::move(groups)),
        name_(std::move(name)),
        layout_(groups_, kWho),
        total_(layout_.total()),
        driver_(make_driver(schedule, total_, groups_.size())) {
    agree_across_ranks(comm_, kWho, agreed_fields(nullptr));
    if (schedule_state().automatic != 0) v_then_.assign(total_, 0.0f);
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
    const onebit_adam_driver_status_t now = status();
    if (now.next == ONEBIT_ADAM_WARMUP_STEP) warmup_step();
    if (now.next == ONEBIT_ADAM_COMPRESSED_STEP) compressed_step(now);
    int measure = 0;  // the step is taken; the driver decides the next one's stage
    check(onebit_adam_driver_taken(driver_.get(), &measure));
    if (measure != 0) measure_variance();
    say_news();
  }

  std::int64_t steps() const { return status().step; }
  std::int64_t freeze_step() const { return status().freeze_step; }  // -1 while undecided
  bool compressing() const { return status().next == ONEBIT_ADAM_COMPRESSED_STEP; }
  // Automatic freeze: (step, change) of every measurement, the change the ranks decided on (the largest).
  std::vector<std::pair<std::int64_t, double>> variance_changes() const {
    std::size_t count = 0;
    check(onebit_adam_driver_changes(driver_.get(), nullptr, nullptr, 0, &count));
    std::vector<std::int64_t> steps(count);
    std::vector<double> changes(count);
    check(onebit_adam_driver_changes(driver_.get(), steps.data(), changes.data(), count, &count));
    std::vector<std::pair<std::int64_t, double>> made;
    for (std::size_t i = 0; i < count; ++i) made.emplace_back(steps[i], changes[i]);
    return made;
  }
  const std::vector<float>& momentum() const { return m_; }
  const std::vector<float>& variance() const { return v_; }

  Checkpoint save() const {
    const onebit_adam_driver_state_t s = schedule_state();
    Checkpoint c;
    c.step = s.step;
    c.m = m_;
    c.v = v_;
    c.freeze_step = freeze_step();
    c.v_then = v_then_;
    c.variance_changes = variance_changes();
    c.bias_correction = s.bias_correction;
    c.deepspeed_schedule = s.deepspeed_schedule;
    std::tie(c.world_size, c.local_size) = compression_layout(comm_);
    save_tag_state(name_, c.worker_error, c.server_error, /*required=*/compressing());  // none yet in warmup
    return c;
  }

  void load(const Checkpoint& c) {
    const onebit_adam_driver_state_t saved{c.step, c.freeze_step, c.v_then.empty() ? 0 : 1, c.bias_correction,
                                           c.deepspeed_schedule};
    // Every rank resumes at the same step and freeze, or they part at the freeze (load is collective).
    std::string unfit = arrays_unfit(c);
    if (unfit.empty()) {
      unfit = core_text([&](char* text, std::size_t size, std::size_t* length) {
        return onebit_adam_driver_resume_refusal(driver_.get(), &saved, text, size, length);
      });
    }
    agree_on_checkpoint(comm_, "onebit::OnebitAdam::load", unfit, agreed_fields(&saved));
    load_tag_state(name_, c.worker_error, c.server_error);
    std::vector<std::int64_t> steps;
    std::vector<double> changes;
    for (const auto& [step, change] : c.variance_changes) {
      steps.push_back(step);
      changes.push_back(change);
    }
    check(onebit_adam_driver_resume(driver_.get(), &saved, steps.data(), changes.data(), steps.size()));
    std::copy(c.m.begin(), c.m.end(), m_.begin());  // in place: the tag holds m_'s address
    std::copy(c.v.begin(), c.v.end(), v_.begin());
    if (!v_then_.empty()) v_then_ = c.v_then;
  }

  // save() as this rank's checkpoint file (onebit.h, "Checkpoint files"): what
  // the Python optimizers' load_file() resumes too; load_file(): a file either language wrote.
  void save_file(const std::string& path) const {
    const Checkpoint c = save();
    CheckpointFile file;
    put_common_records(file, "OnebitAdam", comm_, c);
    file.put("step", c.step);
    file.put("freeze_step", c.freeze_step);
    file.put("bias_correction", c.bias_correction);
    file.put("deepspeed_schedule", c.deepspeed_schedule);
    if (!c.v_then.empty()) {
      file.put("v_then", c.v_then);
      std::vector<std::int64_t> steps;
      std::vector<double> changes;
      for (const auto& [step, change] : c.variance_changes) {
        steps.push_back(step);
        changes.push_back(change);
      }
      file.put("variance_changes.step", steps);
      file.put("variance_changes.change", changes);
    }
    file.write(path);
  }

  void load_file(const std::string& path) {
    Checkpoint c;
    const std::string unreadable = read_checkpoint_file(comm_, path, [&](const CheckpointFile& file) {
      get_common_records(file, path, "OnebitAdam", c);
      c.step = file.get("step", 0);
      c.freeze_step = file.get("freeze_step", kNotRecorded);
      c.v_then = file.floats("v_then");
      const std::vector<std::int64_t> steps = file.ints("variance_changes.step");
      const std::vector<double> changes = file.doubles("variance_changes.change");
      if (steps.size() != changes.size()) {
        throw CallError(ONEBIT_INVALID_ARGUMENT, path + ": variance_changes.step and .change are not of one length");
      }
      for (std::size_t i = 0; i < steps.size(); ++i) c.variance_changes.emplace_back(steps[i], changes[i]);
      c.bias_correction = file.get("bias_correction", kNotRecorded);
      c.deepspeed_schedule = file.get("deepspeed_schedule", kNotRecorded);
    });
    if (!unreadable.empty()) agree_on_checkpoint(comm_, "onebit::OnebitAdam::load", unreadable, agreed_fields(nullptr));
    load(c);
  }

 private:
  static constexpr const char* kWho = "onebit::OnebitAdam";
  struct DriverRelease {
    void operator()(onebit_adam_driver_t driver) const { onebit_adam_driver_destroy(driver); }
  };
  using Driver = std::unique_ptr<onebit_adam_driver, DriverRelease>;

  static void check(onebit_result_t result) { check_call(result); }

  static onebit_adam_schedule_t schedule_of(const std::vector<ParamGroup>& groups,
                                            const onebit_adam_auto_freeze_t* auto_freeze) {
    if (groups.empty()) throw CallError(ONEBIT_INVALID_ARGUMENT, std::string(kWho) + ": no parameter groups");
    const std::int64_t freeze = groups[0].config.freeze_step;
    for (std::size_t i = 0; i < groups.size(); ++i) {
      if (groups[i].config.freeze_step != freeze) {
        throw CallError(ONEBIT_INVALID_ARGUMENT, std::string(kWho) + ": group " + std::to_string(i) +
                                                     " has freeze_step " +
                                                     std::to_string(groups[i].config.freeze_step) + ", group 0 has " +
                                                     std::to_string(freeze) + ": they must agree");
      }
    }
    onebit_adam_schedule_t schedule{};
    schedule.freeze_step = auto_freeze != nullptr ? -1 : freeze;
    if (auto_freeze != nullptr) schedule.automatic = *auto_freeze;
    return schedule;
  }

  static Driver make_driver(const onebit_adam_schedule_t& schedule, std::size_t total, std::size_t groups) {
    onebit_adam_driver_t made = nullptr;
    check(onebit_adam_driver_create(kWho, &schedule, total, groups, &made));
    return Driver(made);
  }

  onebit_adam_driver_status_t status() const {
    onebit_adam_driver_status_t s{};
    check(onebit_adam_driver_status(driver_.get(), &s));
    return s;
  }

  onebit_adam_driver_state_t schedule_state() const {
    onebit_adam_driver_state_t s{};
    check(onebit_adam_driver_state(driver_.get(), &s));
    return s;
  }

  std::vector<AgreedField> agreed_fields(const onebit_adam_driver_state_t* saved) const {
    return core_fields([&](const char** names, std::int64_t* values, std::size_t capacity, std::size_t* count) {
      return onebit_adam_driver_agreed_fields(driver_.get(), saved, names, values, capacity, count);
    });
  }

  // Group i's step settings from the driver (bias correction folded in).
  onebit_adam_config_t config(std::size_t i) const {
    const onebit_adam_config_t& c = groups_[i].config;
    const onebit_adam_hyper_t hyper{c.lr, c.beta1, c.beta2, c.eps, c.weight_decay};
    onebit_adam_config_t made{};
    check(onebit_adam_driver_config(driver_.get(), &hyper, &made));
    return made;
  }

  void warmup_step() {
    check(onebit_allreduce(comm_, grad_.data(), total_, ONEBIT_FLOAT32, ONEBIT_AVG));  // untagged: exact ring
    for (std::size_t i = 0; i < groups_.size(); ++i) {
      const onebit_adam_config_t c = config(i);
      const std::size_t at = layout_.offset(i);
      check(onebit_adam_warmup_step(&c, groups_[i].params, m_.data() + at, v_.data() + at, grad_.data() + at,
                                    groups_[i].count));
    }
  }

  void compressed_step(const onebit_adam_driver_status_t& now) {
    if (now.freezes_now != 0) {  // each group with the eps its steps divide by (bias correction folded in)
      report_freeze(comm_, kWho, now.step,
                    layout_.frozen_variance(v_.data(), groups_.size(), [&](std::size_t i) { return config(i).eps; }));
    }
    const std::string stage = "compression stage since step " + std::to_string(now.freeze_step);
    share_step_settings(name_, groups_, now.step, stage);  // before anything changes: it may throw
    for (std::size_t i = 0; i < groups_.size(); ++i) {
      const onebit_adam_config_t c = config(i);
      const std::size_t at = layout_.offset(i);
      check(onebit_adam_momentum_step_keeping(&c, m_.data() + at, m_before_.data() + at, grad_.data() + at,
                                              groups_[i].count));
    }
    const onebit_result_t reduced = onebit_allreduce(comm_, m_.data(), total_, ONEBIT_FLOAT32, ONEBIT_AVG);  // tagged
    if (reduced != ONEBIT_SUCCESS) {
      const std::string message = onebit_last_error();
      std::copy(m_before_.begin(), m_before_.end(), m_.begin());
      throw step_failure(reduced, message, kWho, now.step, stage);
    }
    for (std::size_t i = 0; i < groups_.size(); ++i) {
      const onebit_adam_config_t c = config(i);
      const std::size_t at = layout_.offset(i);
      check(onebit_adam_apply_step(&c, groups_[i].params, m_.data() + at, v_.data() + at, groups_[i].count));
    }
  }

  // The automatic freeze's measurement: this rank's change, every rank's gathered exactly, decided on.
  void measure_variance() {
    double change = 0.0;
    check(onebit_adam_variance_change(v_.data(), v_then_.data(), total_, &change));
    std::int64_t bits = 0;
    std::memcpy(&bits, &change, sizeof bits);
    std::vector<double> changes;
    for (const auto& row : every_rank(comm_, {bits})) {
      std::memcpy(&change, &row[0], sizeof change);
      changes.push_back(change);
    }
    v_then_ = v_;
    check(onebit_adam_driver_decide(driver_.get(), changes.data(), changes.size()));
  }

  // Rank 0 writes what the driver says of the last step (the automatic freeze fired) to stderr.
  void say_news() const {
    const std::string news = core_text([&](char* text, std::size_t size, std::size_t* length) {
      return onebit_adam_driver_news(driver_.get(), text, size, length);
    });
    int rank = 0;
    check(onebit_comm_rank(comm_, &rank));
    if (rank == 0 && !news.empty()) std::fprintf(stderr, "onebit: %s\n", news.c_str());
  }

  // Why the arrays of checkpoint `c` do not fit this optimizer, or "".
  std::string arrays_unfit(const Checkpoint& c) const {
    if (c.m.size() != total_ || c.v.size() != total_) {
      return "the checkpoint holds " + std::to_string(c.m.size()) + " + " + std::to_string(c.v.size()) +
             " floats of m and v; this optimizer has " + std::to_string(total_);
    }
    if (!c.v_then.empty() && !v_then_.empty() && c.v_then.size() != total_) {
      return "the checkpoint holds " + std::to_string(c.v_then.size()) +
             " floats of the variance snapshot; this "
             "optimizer has " +
             std::to_string(total_);
    }
    return error_state_unfit(comm_, name_, c.worker_error, c.server_error, c.world_size, c.local_size);
  }

  onebit_comm_t comm_;
  std::vector<ParamGroup> groups_;
  std::string name_;
  FlatLayout layout_;
  std::size_t total_;  // layout_.total()
  Driver driver_;
  std::vector<float> m_, v_, grad_, m_before_;
  std::vector<float> v_then_;  // automatic freeze: v at its last measurement
};

}  // namespace onebit

#endif  // ONEBIT_ONEBIT_ADAM_HPP_
