#include "optim/agreement.h"

#include <algorithm>

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

}  // namespace onebit::optim
