// What the optimizer shims (C++ and Python) tell their users, written once: the line rank 0 logs
// when the variance freezes, and the message of a compressed step that failed. The shims count and
// catch; the words are these (onebit.h, "What the shims say").
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "onebit/onebit_types.h"

namespace onebit::optim {

// "<who>: variance frozen from step S; D of N elements are dormant", and for D > 0 why and which
// groups: `dormant[g]` of `counts[g]` elements of group g.
std::string freeze_report(const std::string& who, std::int64_t step, const std::size_t* dormant,
                          const std::size_t* counts, std::size_t groups);

// "<who> step S (<stage>): <error>", and for ONEBIT_NUMERIC_ERROR the likely causes and that
// nothing changed.
std::string step_failure(const std::string& who, std::int64_t step, const std::string& stage, onebit_result_t code,
                         const std::string& error);

}  // namespace onebit::optim
