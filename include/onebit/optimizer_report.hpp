// What the C++ shims (onebit_adam.hpp, zero_one_adam.hpp, onebit_lamb.hpp) tell their user, in the
// words the Python shims use too: report_freeze, the one line rank 0 writes to stderr when the
// variance freezes (how many elements are dormant, onebit.h "Dormant elements", and in which
// groups); numeric_failure, the message of a compressed step that failed on NaN or Inf.
#ifndef ONEBIT_OPTIMIZER_REPORT_HPP_
#define ONEBIT_OPTIMIZER_REPORT_HPP_

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "onebit/call_error.hpp"
#include "onebit/onebit.h"

namespace onebit {

// One group's frozen variance: `count` floats at `v`, divided by with `eps`.
struct FrozenVariance {
  const float* v;
  std::size_t count;
  float eps;
};

// The line itself (no newline), for rank 0 to print.
inline std::string freeze_report(const char* who, std::int64_t step, const std::vector<FrozenVariance>& groups) {
  std::size_t dormant_total = 0, total = 0;
  std::string which;
  for (std::size_t i = 0; i < groups.size(); ++i) {
    std::size_t dormant = 0;
    check_call(onebit_dormant_count(groups[i].v, groups[i].count, groups[i].eps, &dormant));
    dormant_total += dormant;
    total += groups[i].count;
    if (dormant != 0) {
      which += (which.empty() ? "" : ", ") + std::string("group ") + std::to_string(i) + " (" +
               std::to_string(dormant) + " of " + std::to_string(groups[i].count) + ")";
    }
  }
  std::string line = std::string("onebit: ") + who + ": variance frozen from step " + std::to_string(step) + "; " +
                     std::to_string(dormant_total) + " of " + std::to_string(total) + " elements are dormant";
  if (dormant_total == 0) return line;
  return line + " (sqrt(v) <= eps: no gradient reached them) and take no momentum step, only weight decay: " + which;
}

// Prints freeze_report on rank 0 of `comm`.
inline void report_freeze(onebit_comm_t comm, const char* who, std::int64_t step,
                          const std::vector<FrozenVariance>& groups) {
  int rank = 0;
  check_call(onebit_comm_rank(comm, &rank));
  const std::string line = freeze_report(who, step, groups);
  if (rank == 0) std::fprintf(stderr, "%s\n", line.c_str());
}

// A compressed step's failure, with the step and (for NaN or Inf) the likely causes; docs/usage.md,
// "A step fails on NaN or Inf", says more.
// `stage` says which stage the step is in ("compression stage since step 20").
inline CallError step_failure(onebit_result_t code, const std::string& message, const char* who, std::int64_t step,
                              const std::string& stage) {
  std::string text = std::string(who) + " step " + std::to_string(step) + " (" + stage + "): " + message;
  if (code == ONEBIT_NUMERIC_ERROR) {
    text +=
        ". A momentum turned non-finite: the loss diverged (learning rate too high for the compression stage, "
        "or the variance frozen before it settled: a later freeze_step), a non-finite gradient (fp16 overflow, "
        "bad data), or a NaN in the parameters. Nothing changed in this step; see docs/usage.md, \"A step fails "
        "on NaN or Inf\"";
  }
  return CallError(code, text);
}

}  // namespace onebit

#endif  // ONEBIT_OPTIMIZER_REPORT_HPP_
