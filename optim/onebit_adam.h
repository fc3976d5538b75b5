// The phase logic and arithmetic of the 1-bit Adam optimizer (docs/algorithm.md, "The
// 1-bit Adam optimizer"), over flat fp32 arrays: the one implementation behind the C ABI's onebit_adam_*
// calls, which the PyTorch shim (python/onebit/optim.py) and C++ trainers both use. The collective between
// the two halves of a compression-stage step is the caller's (a tagged allreduce of the momentum).
#pragma once

#include <cstddef>
#include <cstdint>

namespace onebit::optim {

struct AdamConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  std::int64_t freeze_step = 0;  // steps t < freeze_step are warmup (full-precision Adam)
};

// ONEBIT_FREEZE_STEP if set (>= 0), else `requested`.
std::int64_t freeze_step(std::int64_t requested);

// Step t (0-based) is in the compression stage: the variance is frozen and the momentum is
// allreduced compressed.
bool compressing(const AdamConfig& config, std::int64_t step);

// Warmup, with g the gradient averaged over ranks: m ← β1·m + (1−β1)·g; v ← β2·v + (1−β2)·g²;
// p ← p − lr·(m / (sqrt(v) + eps) + wd·p).
void warmup_step(const AdamConfig& config, float* p, float* m, float* v, const float* g, std::size_t n);

// Compression stage, before the allreduce: m ← β1·m + (1−β1)·g with the local gradient.
void momentum_step(const AdamConfig& config, float* m, const float* g, std::size_t n);
// momentum_step, writing m as it was into m_before in the same pass (to undo a failed average).
void momentum_step_keeping(const AdamConfig& config, float* m, float* m_before, const float* g, std::size_t n);

// Compression stage, after the allreduce averaged m (optim/frozen_variance.h): m ← 0 where
// the element is dormant (√v ≤ eps); p ← p − lr·(clip(m / (sqrt(v) + eps), ±C) + wd·p) with C
// Adam's own largest step, adam_step_bound(β1, β2).
void apply_step(const AdamConfig& config, float* p, float* m, const float* v, std::size_t n);

// Automatic freeze (include/onebit/onebit.h, "Automatic freeze"): the rule both shims follow.
struct AutoFreeze {
  std::int64_t window = 10;
  double threshold = 0.1;
  std::int64_t max_step = 0;  // 0: none
};
void check(const AutoFreeze& config);  // throws Error(ONEBIT_INVALID_ARGUMENT) naming the field
bool measures(const AutoFreeze& config, std::int64_t step);
// sum |v - v_then| / sum |v| in fp64, in tiled_sums.h's order (the device's: variance_measures.h);
// 0 when both sums are 0.
double variance_change(const float* v, const float* v_then, std::size_t n);
// step + 1 if the warmup ends after `step`, else -1.
std::int64_t decide(const AutoFreeze& config, std::int64_t step, double change);
// The change the ranks decide on: the largest of every rank's, NaN if any is NaN.
double largest_change(const double* changes, std::size_t ranks);

}  // namespace onebit::optim
