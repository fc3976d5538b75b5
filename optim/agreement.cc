#include "optim/agreement.h"

#include <algorithm>

#include "common/error.h"
#include "optim/zero_one_adam.h"

namespace onebit::optim {

namespace {

std::string said(std::int64_t value) {
  return value == std::numeric_limits<std::int64_t>::max() ? "auto (undecided)" : std::to_string(value);
}

const char* hint(AgreedAt at) {
  switch (at) {
    case AgreedAt::kConstruction:
      return "ONEBIT_FREEZE_STEP set on some ranks only? different checkpoints loaded? different models?";
    case AgreedAt::kCheckpointLoad: return "every rank loads the checkpoint of the same step, of this model";
  }
  return "";
}

}  // namespace

std::string disagreement(const std::string& who, const std::vector<std::string>& fields, const std::int64_t* table,
                         std::size_t ranks, AgreedAt at) {
  const std::size_t width = fields.size();
  for (std::size_t f = 0; f < width; ++f) {
    bool alike = true;
    for (std::size_t r = 1; r < ranks; ++r) alike = alike && table[r * width + f] == table[f];
    if (alike) continue;
    std::string values;
    for (std::size_t r = 0; r < ranks; ++r) {
      values += (r == 0 ? "" : ", ") + std::string("rank ") + std::to_string(r) + " has " + said(table[r * width + f]);
    }
    return who + ": the ranks disagree on " + fields[f] + ": " + values +
           "; every rank must be given the same value (" + hint(at) + ")";
  }
  return "";
}

std::string resume_refusal(std::int64_t step, const std::vector<ResumedSetting>& settings, bool freeze_inclusive) {
  if (settings.empty()) return "";
  const ResumedSetting& freeze = settings[0];
  std::string refused;
  const auto refuse = [&](const ResumedSetting& s) {
    refused += (refused.empty() ? "" : ", ") + s.name + "=" + std::to_string(s.saved) +
               " (this optimizer: " + std::to_string(s.mine) + ")";
  };
  const std::int64_t first_frozen = std::min(freeze.saved, freeze.mine);
  const bool before_both = freeze_inclusive ? step <= first_frozen : step < first_frozen;
  if (freeze.saved != kNotRecorded && freeze.saved != freeze.mine && !before_both) refuse(freeze);
  for (std::size_t i = 1; i < settings.size(); ++i) {
    if (settings[i].saved != kNotRecorded && settings[i].saved != settings[i].mine) refuse(settings[i]);
  }
  if (refused.empty()) return "";
  return "the checkpoint (after step " + std::to_string(step) + ") was saved with " + refused +
         ": its stage and counters were made under those values (" + freeze.name +
         " can change on resume only from a checkpoint before the freeze under both). Make the optimizer with the "
         "checkpoint's values";
}

AgreedFields zero_one_adam_fields(const onebit_zero_one_adam_config_t& config,
                                  const onebit_zero_one_adam_schedule_t& schedule, std::size_t parameters,
                                  std::size_t groups) {
  return {{"parameters", static_cast<std::int64_t>(parameters)},
          {"groups", static_cast<std::int64_t>(groups)},
          {"step", schedule.step},
          {"var_interval", schedule.var_interval},
          {"var_counter", schedule.var_counter},
          {"local_step_interval", schedule.local_step_interval},
          {"local_step_counter", schedule.local_step_counter},
          {"var_freeze_step", config.var_freeze_step},
          {"var_update_scaler", config.var_update_scaler},
          {"local_step_scaler", config.local_step_scaler},
          {"local_step_clipper", config.local_step_clipper}};
}

AgreedFields lamb_fields(const onebit_lamb_config_t& config, std::int64_t step, std::size_t parameters,
                         std::size_t layers) {
  return {{"parameters", static_cast<std::int64_t>(parameters)},
          {"layers", static_cast<std::int64_t>(layers)},
          {"step", step},
          {"freeze_step", config.freeze_step}};
}

std::string zero_one_adam_resume_refusal(const onebit_zero_one_adam_config_t& mine,
                                         const onebit_zero_one_adam_schedule_t& saved,
                                         const onebit_zero_one_adam_config_t* saved_knobs) {
  try {
    zero_one_adam::check(saved);
  } catch (const Error& error) {
    return std::string("the checkpoint's schedule is malformed (") + error.what() + ")";
  }
  if (saved_knobs == nullptr) return "";  // a checkpoint from before they were recorded
  return resume_refusal(saved.step,
                        {{"var_freeze_step", saved_knobs->var_freeze_step, mine.var_freeze_step},
                         {"var_update_scaler", saved_knobs->var_update_scaler, mine.var_update_scaler},
                         {"local_step_scaler", saved_knobs->local_step_scaler, mine.local_step_scaler},
                         {"local_step_clipper", saved_knobs->local_step_clipper, mine.local_step_clipper}},
                        /*freeze_inclusive=*/true);
}

std::string zero_one_adam_sync_refusal(const float* lr_sums, std::size_t groups, std::int64_t step) {
  std::string idle;
  for (std::size_t i = 0; i < groups; ++i) {
    if (lr_sums[i] == 0.0f) idle += (idle.empty() ? "" : ", ") + std::to_string(i);
  }
  if (idle.empty()) return "";
  return "the learning rate of group " + idle + " was 0 at every step since the last sync (schedule step " +
         std::to_string(step) +
         "): 0/1 Adam's sync divides each group's accumulated update by its learning-rate sum. Give parameters "
         "frozen with lr=0 to another optimizer (or none), or keep every group's lr above 0";
}

std::string lamb_resume_refusal(const onebit_lamb_config_t& mine, std::int64_t step, std::int64_t saved_freeze_step) {
  return resume_refusal(step, {{"freeze_step", saved_freeze_step, mine.freeze_step}}, /*freeze_inclusive=*/false);
}

}  // namespace onebit::optim
