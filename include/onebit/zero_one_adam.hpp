// onebit::ZeroOneAdam — 0/1 Adam (Lu et al., 2022) for C++ trainers, over raw float arrays in host
// memory and a communicator of the C API. Header-only over libonebit.so: the schedule and
// arithmetic are the C core's (onebit_zero_one_adam_*, the rule in onebit.h), the very functions
// python/onebit's ZeroOneAdam calls, so both shims take the same steps bit for bit.
//
//   onebit::ZeroOneAdam adam(comm, {{weights, n_weights, config}, {biases, n_biases, bias_config}});
//   for (...) { compute this rank's gradients; adam.step({g_weights, g_biases}); }
//
// step() asks the C core what the step is and runs its collective on flat buffers:
// - a variance step averages the gradients exactly (onebit's ring, untagged);
// - a compressed step averages a copy of them in the tagged buffer (1-bit, error feedback);
// - a local step sends nothing;
// - a sync step averages the accumulated update u in the same tagged buffer.
// The buffer's error feedback restarts from zero when the local-step stage begins (it then carries
// u, not gradients), as DeepSpeed's does. Every group's schedule fields (var_freeze_step and the
// three scalers) must agree: the schedule is the optimizer's, not a group's.
//
// Steps that keep v follow onebit.h's "Steps under a frozen variance" (the C core's); when the
// local-step stage begins rank 0 writes one line to stderr naming the dormant elements.
//
// Errors: onebit::CallError; a failed compressed average names the step and its stage
// (optimizer_report.hpp). A failed step leaves the parameters, m, v, u and the schedule as they
// were (a failed sync step is undone from a snapshot taken before it).
//
// Checkpoints: save() → Checkpoint (schedule, m, v, u, the parameters at the last sync, each group's lr sum, this
// rank's error-feedback state, the schedule's settings); load() into a ZeroOneAdam on the same rank of a job of the
// same size, with the same groups and schedule settings (var_freeze_step may move only from a checkpoint in the
// variance stage under both: resume_rules.hpp), before the next step; training continues bit for bit.
#ifndef ONEBIT_ZERO_ONE_ADAM_HPP_
#define ONEBIT_ZERO_ONE_ADAM_HPP_

#include <algorithm>
#include <cstddef>
#include <cstdint>
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

class ZeroOneAdam {
 public:
  struct ParamGroup {
    float* params;
    std::size_t count;
    onebit_zero_one_adam_config_t config;
  };

  struct Checkpoint {
    onebit_zero_one_adam_schedule_t schedule{};
    // The schedule's settings it was saved under (resume_rules.hpp; kNotRecorded: not recorded).
    std::int64_t var_freeze_step = kNotRecorded, var_update_scaler = kNotRecorded, local_step_scaler = kNotRecorded,
                 local_step_clipper = kNotRecorded;
    std::vector<float> m, v, u, params_at_sync, lrs;                    // lrs: one per group
    std::vector<float> worker_error, server_error;                      // this rank's; zeros before any compressed call
    std::int64_t world_size = kNotRecorded, local_size = kNotRecorded;  // the layout it was saved in
  };

  ZeroOneAdam(onebit_comm_t comm, std::vector<ParamGroup> groups, std::string name = "zero_one_adam/buffer")
      : comm_(comm),
        groups_(std::move(groups)),
        name_(std::move(name)),
        layout_(groups_, "onebit::ZeroOneAdam"),
        total_(layout_.total()) {
    const onebit_zero_one_adam_config_t& first = groups_[0].config;
    for (std::size_t i = 0; i < groups_.size(); ++i) {
      const onebit_zero_one_adam_config_t& c = groups_[i].config;
      if (c.var_freeze_step != first.var_freeze_step || c.var_update_scaler != first.var_update_scaler ||
          c.local_step_scaler != first.local_step_scaler || c.local_step_clipper != first.local_step_clipper) {
        throw CallError(ONEBIT_INVALID_ARGUMENT, "onebit::ZeroOneAdam: group " + std::to_string(i) +
                                                     "'s schedule (var_freeze_step " +
                                                     std::to_string(c.var_freeze_step) +
                                                     ", scalers, clipper) differs from group 0's: they must agree");
      }
    }
    check_call(onebit_zero_one_adam_schedule_init(&schedule_));
    onebit_zero_one_adam_step_t kind;
    check_call(onebit_zero_one_adam_next(&first, &schedule_, &kind));  // validates the config
    agree_across_ranks(comm_, "onebit::ZeroOneAdam", agreed_fields(schedule_));
    m_.assign(total_, 0.0f);
    v_.assign(total_, 0.0f);
    grad_.assign(total_, 0.0f);
    buffer_.assign(total_, 0.0f);
    params_at_sync_.assign(total_, 0.0f);
    lrs_.assign(groups_.size(), 0.0f);
    check_call(onebit_tag(name_.c_str(), buffer_.data(), total_, ONEBIT_FLOAT32));
  }

  ~ZeroOneAdam() { onebit_untag(buffer_.data()); }
  ZeroOneAdam(const ZeroOneAdam&) = delete;
  ZeroOneAdam& operator=(const ZeroOneAdam&) = delete;

  // The kind of the next step (the C core's answer for steps()).
  onebit_zero_one_adam_step_t next_step() const {
    onebit_zero_one_adam_step_t kind;
    check_call(onebit_zero_one_adam_next(&groups_[0].config, &schedule_, &kind));
    return kind;
  }

  void step(const std::vector<const float*>& grads) {
    layout_.gather(grads, grad_, "onebit::ZeroOneAdam::step");
    const onebit_zero_one_adam_step_t kind = next_step();
    switch (kind) {
      case ONEBIT_ZERO_ONE_ADAM_VARIANCE_STEP:
        check_call(onebit_allreduce(comm_, grad_.data(), total_, ONEBIT_FLOAT32, ONEBIT_AVG));  // untagged: exact
        for_each_group([&](std::size_t i, float* p, std::size_t o, std::size_t n) {
          check_call(onebit_zero_one_adam_gradient_step(&groups_[i].config, p, m_.data() + o, v_.data() + o,
                                                        grad_.data() + o, n, 1));
        });
        break;
      case ONEBIT_ZERO_ONE_ADAM_COMPRESSED_STEP:
        std::copy(grad_.begin(), grad_.end(), buffer_.begin());
        compressed_average("a compressed-gradient step of the variance stage");
        for_each_group([&](std::size_t i, float* p, std::size_t o, std::size_t n) {
          check_call(onebit_zero_one_adam_gradient_step(&groups_[i].config, p, m_.data() + o, v_.data() + o,
                                                        buffer_.data() + o, n, 0));
        });
        break;
      case ONEBIT_ZERO_ONE_ADAM_LOCAL_STEP: local_steps(); break;
      default: sync_step(); break;
    }
    const bool entering_local_stage = schedule_.step == groups_[0].config.var_freeze_step;
    check_call(onebit_zero_one_adam_advance(&groups_[0].config, &schedule_));
    if (entering_local_stage) {
      report_freeze(comm_, "onebit::ZeroOneAdam", schedule_.step, layout_.frozen_variance(v_.data(), groups_));
      // The buffer carries u from now on: zero, with its error feedback started afresh.
      check_call(onebit_untag(buffer_.data()));
      std::fill(buffer_.begin(), buffer_.end(), 0.0f);
      check_call(onebit_tag(name_.c_str(), buffer_.data(), total_, ONEBIT_FLOAT32));
      for_each_group([&](std::size_t, float* p, std::size_t o, std::size_t n) {
        std::copy(p, p + n, params_at_sync_.begin() + static_cast<std::ptrdiff_t>(o));
      });
    }
  }

  std::int64_t steps() const { return schedule_.step; }
  const onebit_zero_one_adam_schedule_t& schedule() const { return schedule_; }
  const std::vector<float>& momentum() const { return m_; }
  const std::vector<float>& variance() const { return v_; }

  Checkpoint save() const {
    Checkpoint c;
    c.schedule = schedule_;
    const onebit_zero_one_adam_config_t& knobs = groups_[0].config;
    c.var_freeze_step = knobs.var_freeze_step;
    c.var_update_scaler = knobs.var_update_scaler;
    c.local_step_scaler = knobs.local_step_scaler;
    c.local_step_clipper = knobs.local_step_clipper;
    c.m = m_;
    c.v = v_;
    c.u = buffer_;
    c.params_at_sync = params_at_sync_;
    c.lrs = lrs_;
    std::tie(c.world_size, c.local_size) = compression_layout(comm_);
    // None when no compressed call ran since the tag was (re)made.
    save_tag_state(name_, c.worker_error, c.server_error, /*required=*/false);
    return c;
  }

  void load(const Checkpoint& c) {
    std::string unfit;
    if (c.m.size() != total_ || c.v.size() != total_ || c.u.size() != total_ || c.params_at_sync.size() != total_ ||
        c.lrs.size() != groups_.size()) {
      unfit = "the checkpoint holds " + std::to_string(c.m.size()) + " floats of m and " +
              std::to_string(c.lrs.size()) + " lr sums; this optimizer has " + std::to_string(total_) + " and " +
              std::to_string(groups_.size()) + " groups";
    } else {
      unfit = error_state_unfit(comm_, name_, c.worker_error, c.server_error, c.world_size, c.local_size);
    }
    if (unfit.empty()) {
      onebit_zero_one_adam_config_t saved = groups_[0].config;  // the knobs the checkpoint was saved under
      saved.var_freeze_step = c.var_freeze_step;
      saved.var_update_scaler = c.var_update_scaler;
      saved.local_step_scaler = c.local_step_scaler;
      saved.local_step_clipper = c.local_step_clipper;
      unfit = core_text([&](char* text, std::size_t size, std::size_t* length) {
        return onebit_zero_one_adam_resume_refusal(&groups_[0].config, &c.schedule, &saved, text, size, length);
      });
    }
    // Every rank resumes at the same point of the schedule (load is collective).
    agree_on_checkpoint(comm_, "onebit::ZeroOneAdam::load", unfit, agreed_fields(c.schedule));
    load_tag_state(name_, c.worker_error, c.server_error);
    schedule_ = c.schedule;
    std::copy(c.m.begin(), c.m.end(), m_.begin());
    std::copy(c.v.begin(), c.v.end(), v_.begin());
    std::copy(c.u.begin(), c.u.end(), buffer_.begin());  // in place: the tag holds buffer_'s address
    params_at_sync_ = c.params_at_sync;
    lrs_ = c.lrs;
  }

  // save() as this rank's checkpoint file (onebit.h, "Checkpoint files"), which Python's
  // the Python optimizers' load_file() resumes too; load_file(): a file either language wrote.
  void save_file(const std::string& path) const {
    Checkpoint c = save();
    CheckpointFile file;
    put_common_records(file, "ZeroOneAdam", comm_, c);
    for (const auto& [name, value] : schedule_records(c.schedule)) file.put(name, *value);
    file.put("schedule_config.var_freeze_step", c.var_freeze_step);
    file.put("schedule_config.var_update_scaler", c.var_update_scaler);
    file.put("schedule_config.local_step_scaler", c.local_step_scaler);
    file.put("schedule_config.local_step_clipper", c.local_step_clipper);
    file.put("u", c.u);
    file.put("params_at_sync", c.params_at_sync);
    file.put("lrs", c.lrs);
    file.write(path);
  }

  void load_file(const std::string& path) {
    Checkpoint c;
    const std::string unreadable = read_checkpoint_file(comm_, path, [&](const CheckpointFile& file) {
      get_common_records(file, path, "ZeroOneAdam", c);
      for (const auto& [name, value] : schedule_records(c.schedule)) *value = file.get(name, 0);
      c.var_freeze_step = file.get("schedule_config.var_freeze_step", kNotRecorded);
      c.var_update_scaler = file.get("schedule_config.var_update_scaler", kNotRecorded);
      c.local_step_scaler = file.get("schedule_config.local_step_scaler", kNotRecorded);
      c.local_step_clipper = file.get("schedule_config.local_step_clipper", kNotRecorded);
      c.u = file.floats("u");
      c.params_at_sync = file.floats("params_at_sync");
      c.lrs = file.floats("lrs");
    });
    if (!unreadable.empty())
      agree_on_checkpoint(comm_, "onebit::ZeroOneAdam::load", unreadable, agreed_fields(schedule_));
    load(c);
  }

 private:
  // The schedule's counters under their names in a checkpoint file.
  static std::vector<std::pair<const char*, std::int64_t*>> schedule_records(onebit_zero_one_adam_schedule_t& s) {
    return {{"schedule.step", &s.step},
            {"schedule.var_interval", &s.var_interval},
            {"schedule.var_counter", &s.var_counter},
            {"schedule.local_step_interval", &s.local_step_interval},
            {"schedule.local_step_counter", &s.local_step_counter}};
  }

  // What every rank must hold alike (the C core's fields), at schedule state `at`.
  std::vector<AgreedField> agreed_fields(const onebit_zero_one_adam_schedule_t& at) const {
    return core_fields([&](const char** names, std::int64_t* values, std::size_t capacity, std::size_t* count) {
      return onebit_zero_one_adam_agreed_fields(&groups_[0].config, &at, total_, groups_.size(), names, values,
                                                capacity, count);
    });
  }

  template <typename Body>
  void for_each_group(Body&& body) {
    for (std::size_t i = 0; i < groups_.size(); ++i) body(i, groups_[i].params, layout_.offset(i), layout_.count(i));
  }

  // The tagged buffer (a gradient, or u) averaged 1-bit compressed; a failure names the step.
  void compressed_average(const char* stage) {
    share_step_settings(name_, groups_, schedule_.step, stage);
    const onebit_result_t reduced = onebit_allreduce(comm_, buffer_.data(), total_, ONEBIT_FLOAT32, ONEBIT_AVG);
    if (reduced != ONEBIT_SUCCESS)
      throw step_failure(reduced, onebit_last_error(), "onebit::ZeroOneAdam", schedule_.step, stage);
  }

  void local_steps() {
    for_each_group([&](std::size_t i, float* p, std::size_t o, std::size_t n) {
      check_call(onebit_zero_one_adam_local_step(&groups_[i].config, p, m_.data() + o, v_.data() + o,
                                                 buffer_.data() + o, lrs_.data() + i, grad_.data() + o, n));
    });
  }

  // A group whose learning-rate sum since the last sync is 0 cannot sync (the C core's rule and words).
  void refuse_zero_learning_rates() const {
    const std::string refusal = core_text([&](char* text, std::size_t size, std::size_t* length) {
      return onebit_zero_one_adam_sync_refusal(lrs_.data(), lrs_.size(), schedule_.step, text, size, length);
    });
    if (!refusal.empty())
      throw CallError(ONEBIT_INVALID_ARGUMENT, "onebit::ZeroOneAdam: " + refusal + "; nothing was changed");
  }

  void sync_step() {
    // Parameters, m, u and the lr sums change before the allreduce: keep them to undo a failure
    // (params_at_sync changes only after it), in one buffer every sync reuses (fresh copies at
    // every sync cost page faults on 3n floats).
    snapshot_.resize(3 * total_);
    float* const params_before = snapshot_.data();
    float* const m_before = params_before + total_;
    float* const u_before = m_before + total_;
    for_each_group(
        [&](std::size_t, float* p, std::size_t o, std::size_t n) { std::copy(p, p + n, params_before + o); });
    std::copy(m_.begin(), m_.end(), m_before);
    std::copy(buffer_.begin(), buffer_.end(), u_before);
    const std::vector<float> lrs_before = lrs_;
    try {
      local_steps();
      refuse_zero_learning_rates();
      for_each_group([&](std::size_t i, float*, std::size_t o, std::size_t n) {
        check_call(onebit_zero_one_adam_sync_begin(&groups_[i].config, buffer_.data() + o, v_.data() + o, lrs_[i], n));
      });
      compressed_average("a sync step of the local-step stage");
    } catch (const CallError&) {
      for_each_group([&](std::size_t, float* p, std::size_t o, std::size_t n) {
        std::copy(params_before + o, params_before + o + n, p);
      });
      std::copy(m_before, m_before + total_, m_.begin());
      std::copy(u_before, u_before + total_, buffer_.begin());
      lrs_ = lrs_before;
      throw;
    }
    for_each_group([&](std::size_t i, float* p, std::size_t o, std::size_t n) {
      check_call(onebit_zero_one_adam_sync_end(&groups_[i].config, p, params_at_sync_.data() + o, m_.data() + o,
                                               buffer_.data() + o, v_.data() + o, lrs_.data() + i, n));
    });
  }

  onebit_comm_t comm_;
  std::vector<ParamGroup> groups_;
  std::string name_;
  FlatLayout layout_;
  std::size_t total_;  // layout_.total()
  onebit_zero_one_adam_schedule_t schedule_{};
  std::vector<float> m_, v_, grad_, buffer_, params_at_sync_, lrs_;
  std::vector<float> snapshot_;  // sync_step's undo: parameters, m and u before the sync
};

}  // namespace onebit

#endif  // ONEBIT_ZERO_ONE_ADAM_HPP_
