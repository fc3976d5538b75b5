// onebit::OnebitLamb — 1-bit LAMB (Li et al., 2021) for C++ trainers, over raw float arrays in host
// memory and a communicator of the C API. Header-only over libonebit.so: the arithmetic is the C
// core's (onebit_lamb_*, the rule in onebit.h), the very functions python/onebit's OnebitLamb
// calls.
// Each parameter group is one layer: it has its own trust ratio (LAMB's coefficient), frozen at the
// end of the warmup and then scaled by the factor the fresh variance says.
//
//   onebit::OnebitLamb lamb(comm, {{weights, n_weights, config}, {biases, n_biases, config}});
//   for (...) { compute this rank's gradients; lamb.step({g_weights, g_biases}); }
//
// step(): in warmup (t < freeze_step) the gradients are averaged over ranks exactly and LAMB runs;
// then each layer's momentum is updated from the local gradient and scaled by the layer's
// scaling_coeff, the one flat momentum buffer (tagged: compressed, error-compensated) is averaged,
// and each layer moves with its frozen variance and coefficient × factor. Every group's
// freeze_step must agree.
//
// The compression stage holds dormant elements (onebit.h, "Steps under a frozen variance"; LAMB
// takes that rule, not the step bound); at its first step rank 0 writes one line to stderr naming
// them. Errors: onebit::CallError, a failed compressed step naming the step and the likely causes
// (optimizer_report.hpp); a failed step leaves the parameters, the state and the step count as
// they were. Checkpoints: save() → Checkpoint (step, freeze_step, m, v, v_fresh, the layers'
// scalars, this rank's error-feedback state); load() on the same rank of a job of the same size, with
// the same freeze_step unless the checkpoint is in warmup under both (resume_rules.hpp), before the
// next step; training continues bit for bit.
#ifndef ONEBIT_ONEBIT_LAMB_HPP_
#define ONEBIT_ONEBIT_LAMB_HPP_

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

class OnebitLamb {
 public:
  struct ParamGroup {
    float* params;
    std::size_t count;
    onebit_lamb_config_t config;
  };

  struct Checkpoint {
    std::int64_t step = 0;
    std::int64_t freeze_step = kNotRecorded;  // the one it was saved under (resume_rules.hpp)
    std::vector<float> m, v, v_fresh;
    std::vector<onebit_lamb_layer_t> layers;
    std::vector<float> worker_error, server_error;  // this rank's; zeros before the first compressed call
    std::int64_t world_size = kNotRecorded, local_size = kNotRecorded;  // the layout it was saved in
  };

  OnebitLamb(onebit_comm_t comm, std::vector<ParamGroup> groups, std::string name = "onebit_lamb/momentum")
      : comm_(comm),
        groups_(std::move(groups)),
        name_(std::move(name)),
        layout_(groups_, "onebit::OnebitLamb"),
        total_(layout_.total()) {
    for (std::size_t i = 0; i < groups_.size(); ++i) {
      if (groups_[i].config.freeze_step != groups_[0].config.freeze_step) {
        throw CallError(ONEBIT_INVALID_ARGUMENT,
                        "onebit::OnebitLamb: group " + std::to_string(i) + " has freeze_step " +
                            std::to_string(groups_[i].config.freeze_step) + ", group 0 has " +
                            std::to_string(groups_[0].config.freeze_step) + ": they must agree");
      }
    }
    // ONEBIT_FREEZE_STEP, when set, overrides every group's (as for OnebitAdam).
    const std::int64_t freeze = onebit_adam_freeze_step(groups_[0].config.freeze_step);
    for (ParamGroup& g : groups_) g.config.freeze_step = freeze;
    for (const ParamGroup& g : groups_) {
      if (onebit_lamb_compressing(&g.config, 0) < 0) check_call(ONEBIT_INVALID_ARGUMENT);
      onebit_lamb_layer_t layer;
      check_call(onebit_lamb_layer_init(&layer));
      layers_.push_back(layer);
    }
    agree_across_ranks(comm_, "onebit::OnebitLamb", agreed_fields(0));
    m_.assign(total_, 0.0f);
    v_.assign(total_, 0.0f);
    v_fresh_.assign(total_, 0.0f);
    m_last_.assign(total_, 0.0f);
    grad_.assign(total_, 0.0f);
    check_call(onebit_tag(name_.c_str(), m_.data(), total_, ONEBIT_FLOAT32));
  }

  ~OnebitLamb() { onebit_untag(m_.data()); }
  OnebitLamb(const OnebitLamb&) = delete;
  OnebitLamb& operator=(const OnebitLamb&) = delete;

  void step(const std::vector<const float*>& grads) {
    layout_.gather(grads, grad_, "onebit::OnebitLamb::step");
    if (!compressing()) {
      check_call(onebit_allreduce(comm_, grad_.data(), total_, ONEBIT_FLOAT32, ONEBIT_AVG));  // untagged: exact
      for (std::size_t i = 0; i < groups_.size(); ++i) {
        const std::size_t o = layout_.offset(i);
        check_call(onebit_lamb_warmup_step(&groups_[i].config, layers_.data() + i, step_, groups_[i].params,
                                           m_.data() + o, v_.data() + o, v_fresh_.data() + o, grad_.data() + o,
                                           groups_[i].count));
      }
    } else {
      const std::string stage = "compression stage since step " + std::to_string(groups_[0].config.freeze_step);
      share_step_settings(name_, groups_, step_, stage);  // before anything changes: it may throw
      const std::vector<onebit_lamb_layer_t> layers_before = layers_;
      if (layers_[0].scaling_coeff == 0) {  // the first compression step
        report_freeze(comm_, "onebit::OnebitLamb", step_, layout_.frozen_variance(v_.data(), groups_));
        check_call(onebit_lamb_scaling_coeffs(m_.data(), layout_.counts().data(), layout_.groups(), layers_.data()));
      }
      for (std::size_t i = 0; i < groups_.size(); ++i) {
        const std::size_t o = layout_.offset(i);
        check_call(onebit_lamb_momentum_step(&groups_[i].config, layers_.data() + i, m_.data() + o, m_last_.data() + o,
                                             grad_.data() + o, groups_[i].count));
      }
      const onebit_result_t reduced = onebit_allreduce(comm_, m_.data(), total_, ONEBIT_FLOAT32, ONEBIT_AVG);  // tagged
      if (reduced != ONEBIT_SUCCESS) {
        const std::string message = onebit_last_error();
        std::copy(m_last_.begin(), m_last_.end(), m_.begin());
        layers_ = layers_before;
        throw step_failure(reduced, message, "onebit::OnebitLamb", step_, stage);
      }
      for (std::size_t i = 0; i < groups_.size(); ++i) {
        const std::size_t o = layout_.offset(i);
        check_call(onebit_lamb_apply_step(&groups_[i].config, layers_.data() + i, groups_[i].params, m_.data() + o,
                                          m_last_.data() + o, v_.data() + o, v_fresh_.data() + o, groups_[i].count));
      }
    }
    ++step_;
  }

  std::int64_t steps() const { return step_; }
  bool compressing() const { return step_ >= groups_[0].config.freeze_step; }
  // Each layer's coefficient in its last step (LAMB's trust ratio; coeff_freeze × factor after the warmup).
  std::vector<double> lamb_coeffs() const {
    std::vector<double> out;
    for (const onebit_lamb_layer_t& l : layers_) out.push_back(l.lamb_coeff);
    return out;
  }
  const std::vector<onebit_lamb_layer_t>& layers() const { return layers_; }

  Checkpoint save() const {
    Checkpoint c;
    c.step = step_;
    c.freeze_step = groups_[0].config.freeze_step;
    c.m = m_;
    c.v = v_;
    c.v_fresh = v_fresh_;
    c.layers = layers_;
    std::tie(c.world_size, c.local_size) = compression_layout(comm_);
    // Required once a compressed call ran (the first compression step is freeze_step itself).
    save_tag_state(name_, c.worker_error, c.server_error, /*required=*/step_ > groups_[0].config.freeze_step);
    return c;
  }

  void load(const Checkpoint& c) {
    std::string unfit;
    if (c.m.size() != total_ || c.v.size() != total_ || c.v_fresh.size() != total_ ||
        c.layers.size() != groups_.size()) {
      unfit = "the checkpoint holds " + std::to_string(c.m.size()) + " floats of m and " +
              std::to_string(c.layers.size()) + " layers; this optimizer has " + std::to_string(total_) + " and " +
              std::to_string(groups_.size());
    } else {
      unfit = error_state_unfit(comm_, name_, c.worker_error, c.server_error, c.world_size, c.local_size);
    }
    if (unfit.empty()) {
      unfit = core_text([&](char* text, std::size_t size, std::size_t* length) {
        return onebit_lamb_resume_refusal(&groups_[0].config, c.step, c.freeze_step, text, size, length);
      });
    }
    // Every rank resumes at the same step, or they part at the freeze (load is collective).
    agree_on_checkpoint(comm_, "onebit::OnebitLamb::load", unfit, agreed_fields(c.step));
    load_tag_state(name_, c.worker_error, c.server_error);
    step_ = c.step;
    std::copy(c.m.begin(), c.m.end(), m_.begin());  // in place: the tag holds m_'s address
    v_ = c.v;
    v_fresh_ = c.v_fresh;
    layers_ = c.layers;
  }

  // save() as this rank's checkpoint file (onebit.h, "Checkpoint files"), which Python's
  // the Python optimizers' load_file() resumes too; load_file(): a file either language wrote.
  void save_file(const std::string& path) const {
    const Checkpoint c = save();
    CheckpointFile file;
    put_common_records(file, "OnebitLamb", comm_, c);
    file.put("step", c.step);
    file.put("freeze_step", c.freeze_step);
    file.put("v_fresh", c.v_fresh);
    for (const auto& [name, field] : kLayerRecords) {
      std::vector<double> values;
      for (const onebit_lamb_layer_t& layer : c.layers) values.push_back(layer.*field);
      file.put(name, values);
    }
    file.write(path);
  }

  void load_file(const std::string& path) {
    Checkpoint c;
    const std::string unreadable = read_checkpoint_file(comm_, path, [&](const CheckpointFile& file) {
      get_common_records(file, path, "OnebitLamb", c);
      c.step = file.get("step", 0);
      c.freeze_step = file.get("freeze_step", kNotRecorded);
      c.v_fresh = file.floats("v_fresh");
      for (const auto& [name, field] : kLayerRecords) {
        const std::vector<double> values = file.doubles(name);
        c.layers.resize(std::max(c.layers.size(), values.size()));
        for (std::size_t i = 0; i < values.size(); ++i) c.layers[i].*field = values[i];
      }
    });
    if (!unreadable.empty()) agree_on_checkpoint(comm_, "onebit::OnebitLamb::load", unreadable, agreed_fields(step_));
    load(c);
  }

 private:
  // Each layer scalar under its name in a checkpoint file, one value a layer.
  static constexpr std::pair<const char*, double onebit_lamb_layer_t::*> kLayerRecords[] = {
      {"layers.coeff_freeze", &onebit_lamb_layer_t::coeff_freeze},
      {"layers.last_factor", &onebit_lamb_layer_t::last_factor},
      {"layers.scaling_coeff", &onebit_lamb_layer_t::scaling_coeff},
      {"layers.lamb_coeff", &onebit_lamb_layer_t::lamb_coeff}};

  // What every rank must hold alike (the C core's fields), at `step`.
  std::vector<AgreedField> agreed_fields(std::int64_t step) const {
    return core_fields([&](const char** names, std::int64_t* values, std::size_t capacity, std::size_t* count) {
      return onebit_lamb_agreed_fields(&groups_[0].config, step, total_, groups_.size(), names, values, capacity,
                                       count);
    });
  }

  onebit_comm_t comm_;
  std::vector<ParamGroup> groups_;
  std::string name_;
  FlatLayout layout_;
  std::size_t total_;  // layout_.total()
  std::int64_t step_ = 0;
  std::vector<onebit_lamb_layer_t> layers_;
  std::vector<float> m_, v_, v_fresh_, m_last_, grad_;
};

}  // namespace onebit

#endif  // ONEBIT_ONEBIT_LAMB_HPP_
