// What the C++ optimizer shims' load() refuses, and how every rank learns it. agree_on_checkpoint:
// whether each rank's checkpoint fits its optimizer — its arrays, its error feedback, and its
// schedule by the C core's rule (each optimizer's *_resume_refusal, docs/usage/restarting.md
// "Restarting a job") — and the checkpoint's schedule, agreed before anything is loaded.
#ifndef ONEBIT_RESUME_RULES_HPP_
#define ONEBIT_RESUME_RULES_HPP_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "onebit/call_error.hpp"
#include "onebit/onebit.h"
#include "onebit/optimizer_report.hpp"
#include "onebit/rank_agreement.hpp"

namespace onebit {

// A checkpoint's schedule field that holds this: not recorded (a Checkpoint filled by hand, or
// read from a file written before the field existed) — taken as this optimizer's value.
constexpr std::int64_t kNotRecorded = std::numeric_limits<std::int64_t>::min();

// load()'s first, collective step: the ranks agree on whether each one's checkpoint fits its
// optimizer (`unfit`: why this rank's does not — sizes, a missing field —, or empty) and on the
// checkpoint's `fields` (step, freeze step, counters), in one exact allreduce. A rank whose
// checkpoint does not fit throws its reason (ONEBIT_INVALID_ARGUMENT); the others throw
// ONEBIT_MISMATCH naming it — where a rank that threw before agreeing would leave the others
// waiting in the agreement until the timeout (each rank may load its own file).
inline void agree_on_checkpoint(onebit_comm_t comm, const std::string& who, const std::string& unfit,
                                const std::vector<AgreedField>& fields) {
  std::vector<AgreedField> all{{"whether their checkpoint fits (1: it does not)", unfit.empty() ? 0 : 1}};
  all.insert(all.end(), fields.begin(), fields.end());
  const auto refuse = [&] { throw CallError(ONEBIT_INVALID_ARGUMENT, who + ": " + unfit + "; nothing was loaded"); };
  try {
    agree_across_ranks(comm, who, all, ONEBIT_AGREED_AT_CHECKPOINT_LOAD);
  } catch (const CallError& error) {
    if (!unfit.empty() && error.code() == ONEBIT_MISMATCH) refuse();  // a transport failure stays one
    throw;
  }
  if (!unfit.empty()) refuse();
}

// The layout `comm` compresses over, {ranks, ranks per host (1: flat)}: the chunks each rank's
// error feedback belongs to. A checkpoint records it (world_size, local_size).
inline std::pair<std::int64_t, std::int64_t> compression_layout(onebit_comm_t comm) {
  int size = 1, local = 1;
  check_call(onebit_comm_size(comm, &size));
  check_call(onebit_comm_local_size(comm, &local));
  return {size, local > 1 && local < size ? local : 1};
}

// Why a checkpoint's error feedback (`worker`, `server`, saved by a job of `saved_size` ranks,
// `saved_local` per host) cannot be loaded into tag `name` on `comm` now, or "": the C core's
// refusals (onebit_tag_state_check: another count, a tag that has already run;
// onebit_tag_state_check_layout: another layout). None at all fits any tag; zeros and no server
// error (saved before the first compressed call: a fresh tag's state, onebit_tag_state_load) fit
// any layout.
inline std::string error_state_unfit(onebit_comm_t comm, const std::string& name, const std::vector<float>& worker,
                                     const std::vector<float>& server, std::int64_t saved_size,
                                     std::int64_t saved_local) {
  if (worker.empty() && server.empty()) return "";
  if (onebit_tag_state_check(name.c_str(), worker.size()) != ONEBIT_SUCCESS) return onebit_last_error();
  const bool fresh = server.empty() && std::all_of(worker.begin(), worker.end(), [](float e) { return e == 0.0f; });
  if (fresh || saved_size == kNotRecorded) return "";  // kNotRecorded: filled by hand, or saved before the field
  const auto layout = compression_layout(comm);
  const int saved_local_size = saved_local == kNotRecorded ? 0 : static_cast<int>(saved_local);
  const onebit_result_t fits = onebit_tag_state_check_layout(
      static_cast<int>(saved_size), saved_local_size, static_cast<int>(layout.first), static_cast<int>(layout.second));
  return fits == ONEBIT_SUCCESS ? "" : onebit_last_error();
}

}  // namespace onebit

#endif  // ONEBIT_RESUME_RULES_HPP_
