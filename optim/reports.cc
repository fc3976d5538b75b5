#include "optim/reports.h"

namespace onebit::optim {

std::string freeze_report(const std::string& who, std::int64_t step, const std::size_t* dormant,
                          const std::size_t* counts, std::size_t groups) {
  std::size_t dormant_total = 0, total = 0;
  std::string which;
  for (std::size_t g = 0; g < groups; ++g) {
    dormant_total += dormant[g];
    total += counts[g];
    if (dormant[g] != 0) {
      which += (which.empty() ? "" : ", ") + std::string("group ") + std::to_string(g) + " (" +
               std::to_string(dormant[g]) + " of " + std::to_string(counts[g]) + ")";
    }
  }
  std::string line = who + ": variance frozen from step " + std::to_string(step) + "; " +
                     std::to_string(dormant_total) + " of " + std::to_string(total) + " elements are dormant";
  if (dormant_total == 0) return line;
  return line + " (sqrt(v) <= eps: no gradient reached them) and take no momentum step, only weight decay: " + which;
}

std::string step_failure(const std::string& who, std::int64_t step, const std::string& stage, onebit_result_t code,
                         const std::string& error) {
  std::string text = who + " step " + std::to_string(step) + " (" + stage + "): " + error;
  if (code == ONEBIT_NUMERIC_ERROR) {
    text +=
        ". A momentum turned non-finite: the loss diverged (learning rate too high for the compression stage, "
        "or the variance frozen before it settled: a later freeze_step), a non-finite gradient (fp16 overflow, "
        "bad data), or a NaN in the parameters. Nothing changed in this step; see docs/usage/optimizers.md, "
        "\"A step fails on NaN or Inf\"";
  }
  return text;
}

}  // namespace onebit::optim
