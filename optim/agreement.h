// What the optimizer shims (C++ and Python) hold their ranks and their checkpoints to, written
// once: every rank's schedule and parameters alike (ranks_agree), and a checkpoint's schedule going
// on only under the settings it was made with (resume_refusal). The shims exchange the values over
// their own channel (the C++ shims' communicator, the Python shims' process group) and ask these
// for the verdict and its words (onebit.h, "What the shims say").
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "onebit/onebit_types.h"

namespace onebit::optim {

// Where the ranks are compared, which decides the hint their disagreement ends with.
enum class AgreedAt { kConstruction, kCheckpointLoad };

// "" when every rank's row of `table` (ranks x fields, row r rank r's) is alike; else "<who>: the
// ranks disagree on <field>: rank 0 has X, rank 1 has Y, ...; every rank must be given the same
// value (<hint>)" for the first field that differs. INT64_MAX is said "auto (undecided)" (an
// automatic freeze that has not fired).
std::string disagreement(const std::string& who, const std::vector<std::string>& fields, const std::int64_t* table,
                         std::size_t ranks, AgreedAt at);

// A schedule setting of a checkpoint: its name, the value saved (kNotRecorded: not recorded, taken
// as this optimizer's) and this optimizer's.
constexpr std::int64_t kNotRecorded = std::numeric_limits<std::int64_t>::min();
struct ResumedSetting {
  std::string name;
  std::int64_t saved;
  std::int64_t mine;
};

// "" when a checkpoint saved after `step` steps can go on under this optimizer's schedule, else why
// not. settings[0] is the freeze step: it may differ where the checkpoint is before the freeze
// under both — step < both, or step <= both where `freeze_inclusive` (0/1 Adam's var_freeze_step
// is the last step of its variance stage) —, as when a run that diverged after its freeze resumes
// from a warmup checkpoint with a later one. Every other setting must be the same: the
// checkpoint's stage and counters were made under those values.
std::string resume_refusal(std::int64_t step, const std::vector<ResumedSetting>& settings, bool freeze_inclusive);

// What every rank of an optimizer must hold alike, named in the words the disagreement says. The
// shims exchange the values and ask disagreement() for the verdict; at a load, the checkpoint's
// schedule state stands for this optimizer's.
using AgreedFields = std::vector<std::pair<const char*, std::int64_t>>;
AgreedFields zero_one_adam_fields(const onebit_zero_one_adam_config_t& config,
                                  const onebit_zero_one_adam_schedule_t& schedule, std::size_t parameters,
                                  std::size_t groups);
AgreedFields lamb_fields(const onebit_lamb_config_t& config, std::int64_t step, std::size_t parameters,
                         std::size_t layers);

// Why a checkpoint cannot go on under this optimizer's schedule, or "". 0/1 Adam: the saved
// schedule state must be one the rule can reach (else "the checkpoint's schedule is malformed"),
// and the knobs follow resume_refusal() (var_freeze_step the inclusive freeze; `saved_knobs` NULL,
// or a knob kNotRecorded: not recorded). 1-bit LAMB: its freeze step, as OnebitAdam's.
std::string zero_one_adam_resume_refusal(const onebit_zero_one_adam_config_t& mine,
                                         const onebit_zero_one_adam_schedule_t& saved,
                                         const onebit_zero_one_adam_config_t* saved_knobs);
// Why a 0/1 Adam sync at schedule step `step` cannot run, or "": a group whose learning-rate sum
// since the last sync is 0 (lr 0 at every step) has no update to divide by it.
std::string zero_one_adam_sync_refusal(const float* lr_sums, std::size_t groups, std::int64_t step);
std::string lamb_resume_refusal(const onebit_lamb_config_t& mine, std::int64_t step, std::int64_t saved_freeze_step);

}  // namespace onebit::optim
