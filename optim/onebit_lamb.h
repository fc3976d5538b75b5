// 1-bit LAMB (Li et al., 2021; DeepSpeed's OnebitLamb) over flat fp32 arrays, one layer at a time:
// the one implementation behind the C ABI's onebit_lamb_* calls, which both shims use. The rule is
// written out in include/onebit/onebit.h and docs/design/optimizer-rules.md ("1-bit LAMB"). A layer is one
// contiguous range with its own trust ratio (a tensor in the Python shim, a group in the C++ one).
#pragma once

#include <cstddef>
#include <cstdint>

#include "onebit/onebit_types.h"
#include "optim/lamb_rules.h"

namespace onebit::optim::lamb {

using Config = onebit_lamb_config_t;
using Layer = onebit_lamb_layer_t;

void check(const Config& config);  // throws Error(ONEBIT_INVALID_ARGUMENT) naming the field
Layer initial_layer();

bool compressing(const Config& config, std::int64_t step);  // step >= freeze_step

// The host's part of a step, between the pass over the layer that sums (lamb_rules.h) and the one
// that moves p: what the CPU steps below and the CUDA ones (optim/cuda/lamb_device.h) share.
// warmup_coefficient: the trust ratio from (‖d‖², ‖p‖²), folded into the layer; apply_coefficient:
// the frozen coefficient times the factor from (‖prelim‖², ‖d‖², the largest ratio), into the layer;
// each returns the coefficient, and move_step gives p's step float(lr·coefficient).
double warmup_coefficient(const Config& c, Layer& layer, const Sums& sums);
double apply_coefficient(const Config& c, Layer& layer, const Sums& sums);
float move_step(const Config& c, double coefficient);
// scaling_coeffs from each layer's sum of squared momentum (squares[j]).
void set_scaling_coeffs(const double* squares, const std::size_t* counts, std::size_t layers, Layer* states);
// The refusals of momentum_step and apply_step, for a layer not (fully) set up.
void check_momentum(const Layer& layer);
void check_apply(const Layer& layer);

// Warmup step `step`, g averaged over ranks: m, v as Adam's; at the last warmup step v_fresh ← v;
// d = m/(√v+ε) + wd·p; coefficient = clip(‖p‖/‖d‖, min_coeff, max_coeff) (1 if a norm is 0), folded
// into coeff_freeze unless it is exactly 1; p ← p − float(lr·coefficient)·d.
void warmup_step(const Config& c, Layer& layer, std::int64_t step, float* p, float* m, float* v, float* v_fresh,
                 const float* g, std::size_t n);

// At the first compression step, from the warmup's final momentum, for every layer at once:
// scale_j = ‖m_j‖/√n_j, scaling_coeff_j = mean(scale) / scale_j (1 where scale_j is 0).
void scaling_coeffs(const float* m, const std::size_t* counts, std::size_t layers, Layer* states);

// Compression stage, before the allreduce: m_last ← m; m ← (β1·m + (1−β1)·g)·scaling_coeff.
void momentum_step(const Config& c, const Layer& layer, float* m, float* m_last, const float* g, std::size_t n);

// After the allreduce averaged m: m ← m/scaling_coeff (0 for a dormant element, optim/frozen_variance.h,
// which also takes no part in the factor's maximum; Adam's step bound is not applied: see
// onebit_lamb.cc), the frozen-variance update with its
// coefficient coeff_freeze × factor (docs/design/optimizer-rules.md, "1-bit LAMB"). Both momentum_step and
// apply_step refuse a layer whose scaling_coeff (or last_factor) is not > 0, before changing anything.
void apply_step(const Config& c, Layer& layer, float* p, float* m, const float* m_last, const float* v, float* v_fresh,
                std::size_t n);

}  // namespace onebit::optim::lamb
