// What the C++ shims (onebit_adam.hpp, zero_one_adam.hpp, onebit_lamb.hpp) tell their user, in the
// C core's words, which the Python shims use too (onebit.h, "What the shims say"): report_freeze,
// the one line rank 0 writes to stderr when the variance freezes (how many elements are dormant,
// onebit.h "Dormant elements", and in which groups); step_failure, the message of a compressed
// step that failed.
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

// A text the C core writes (onebit.h, "What the shims say"): `write(text, size, &length)`.
template <typename Write>
std::string core_text(Write write) {
  std::string text(256, '\0');
  std::size_t length = 0;
  check_call(write(&text[0], text.size(), &length));
  if (length >= text.size()) {
    text.assign(length + 1, '\0');
    check_call(write(&text[0], text.size(), &length));
  }
  text.resize(length);
  return text;
}

// The line itself (no newline), for rank 0 to print.
inline std::string freeze_report(const char* who, std::int64_t step, const std::vector<FrozenVariance>& groups) {
  std::vector<std::size_t> dormant(groups.size(), 0), counts(groups.size(), 0);
  for (std::size_t i = 0; i < groups.size(); ++i) {
    check_call(onebit_dormant_count(groups[i].v, groups[i].count, groups[i].eps, &dormant[i]));
    counts[i] = groups[i].count;
  }
  return "onebit: " + core_text([&](char* text, std::size_t size, std::size_t* length) {
           return onebit_freeze_report(who, step, dormant.data(), counts.data(), groups.size(), text, size, length);
         });
}

// Prints freeze_report on rank 0 of `comm`.
inline void report_freeze(onebit_comm_t comm, const char* who, std::int64_t step,
                          const std::vector<FrozenVariance>& groups) {
  int rank = 0;
  check_call(onebit_comm_rank(comm, &rank));
  const std::string line = freeze_report(who, step, groups);
  if (rank == 0) std::fprintf(stderr, "%s\n", line.c_str());
}

// A compressed step's failure, with the step and (for NaN or Inf) the likely causes, in the C
// core's words. `stage` says which stage the step is in ("compression stage since step 20").
inline CallError step_failure(onebit_result_t code, const std::string& message, const char* who, std::int64_t step,
                              const std::string& stage) {
  return CallError(code, core_text([&](char* text, std::size_t size, std::size_t* length) {
                     return onebit_step_failure_text(who, step, stage.c_str(), code, message.c_str(), text, size,
                                                     length);
                   }));
}

}  // namespace onebit

#endif  // ONEBIT_OPTIMIZER_REPORT_HPP_
