// 0/1 Adam (Lu et al., 2022; DeepSpeed's ZeroOneAdam) over flat fp32 arrays: its step schedule and
// arithmetic, the one implementation behind the C ABI's onebit_zero_one_adam_* calls, which both
// shims use. The rule is written out in include/onebit/onebit.h and docs/design/optimizer-rules.md ("0/1 Adam");
// the collectives between the halves of a step are the caller's.
#pragma once

#include <cstddef>
#include <cstdint>

#include "onebit/onebit_types.h"

namespace onebit::optim::zero_one_adam {

using Config = onebit_zero_one_adam_config_t;
using Schedule = onebit_zero_one_adam_schedule_t;
using StepKind = onebit_zero_one_adam_step_t;

void check(const Config& config);  // throws Error(ONEBIT_INVALID_ARGUMENT) naming the field
Schedule initial_schedule();
void check(const Schedule& schedule);

// The kind of step number schedule.step (0-based).
StepKind next(const Config& config, const Schedule& schedule);
// After a step: its policy counters, then step + 1.
void advance(const Config& config, Schedule& schedule);

// Variance stage, with g averaged over ranks (exactly on variance steps, compressed on the others):
// [v ← β2·v + (1−β2)·g² only if update_variance]; m ← β1·m + (1−β1)·g; p ← p − lr·(m/(√v+ε) + wd·p).
// When v was kept (optim/frozen_variance.h) a dormant element's m is 0 and m/(√v+ε) is clipped
// to Adam's own bound C.
void gradient_step(const Config& c, float* p, float* m, float* v, const float* g, std::size_t n, bool update_variance);

// Local-step stage, no communication, g local: m ← β1·m + (1−β1)·g (0 if dormant); d = clip(m/(√v+ε), ±C) + wd·p;
// p ← p − lr·d; u ← u − lr·d; lrs ← lrs + lr.
void local_step(const Config& c, float* p, float* m, const float* v, float* u, float* lrs, const float* g,
                std::size_t n);
// A sync's learning-rate sum must be > 0 (sync_end divides by it); throws naming it otherwise.
void check_sync(float lrs);
// A sync step, after its local_step: u ← u·(√v+ε). Refuses lrs <= 0 before changing anything.
void sync_begin(const Config& c, float* u, const float* v, float lrs, std::size_t n);
// After u was averaged over ranks (compressed): m ← −(u/lrs); p ← p_sync + clip(u/(√v+ε), ±lrs·(C +
// wd·|p_sync|)) (a dormant element: m ← 0, p kept); p_sync ← p; u ← 0; lrs ← 0. Refuses lrs <= 0
// before changing anything. p_sync holds the parameters of the last sync (at the local stage's
// start, p).
void sync_end(const Config& c, float* p, float* p_sync, float* m, float* u, const float* v, float* lrs, std::size_t n);

}  // namespace onebit::optim::zero_one_adam
