#include "optim/onebit_lamb.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/error.h"
#include "optim/frozen_variance.h"
#include "optim/lamb_rules.h"
#include "optim/vector_clones.h"

namespace onebit::optim::lamb {
namespace {

// p ← p − float(lr·coefficient)·d, d recomputed exactly as it was for the norm. This and the
// passes below are compute-bound (a square root and a division per element): vector_clones.h.
ONEBIT_VECTOR_CLONES void move(const Config& c, double coefficient, float* p, const float* m, const float* v,
                               std::size_t n) {
  const float step = move_step(c, coefficient);
  for (std::size_t i = 0; i < n; ++i) p[i] = p[i] - step * direction(c, p[i], m[i], v[i]);
}

// The fp64 sum of squares, in tiled_sums.h's order.
double sum_of_squares(const float* x, std::size_t n) {
  return tiled::sum(n, [x](std::size_t i) { return square_terms(x[i]); }).first;
}

}  // namespace

void check(const Config& c) {
  ONEBIT_CHECK(c.lr >= 0 && c.beta1 >= 0 && c.beta1 < 1 && c.beta2 >= 0 && c.beta2 < 1 && c.eps > 0 &&
                   c.weight_decay >= 0 && c.freeze_step >= 0,
               ONEBIT_INVALID_ARGUMENT, "1-bit LAMB config out of range: lr ", c.lr, ", betas (", c.beta1, ", ",
               c.beta2, "), eps ", c.eps, ", weight_decay ", c.weight_decay, ", freeze_step ", c.freeze_step,
               " (need lr, weight_decay >= 0; 0 <= beta < 1; eps > 0; freeze_step >= 0)");
  ONEBIT_CHECK(c.min_coeff > 0 && c.min_coeff <= c.max_coeff && c.coeff_beta >= 0 && c.coeff_beta < 1 &&
                   c.factor_min > 0 && c.factor_min <= c.factor_max && c.factor_threshold >= 0 &&
                   c.factor_threshold < 1,
               ONEBIT_INVALID_ARGUMENT, "1-bit LAMB coefficients out of range: min_coeff ", c.min_coeff, ", max_coeff ",
               c.max_coeff, ", coeff_beta ", c.coeff_beta, ", factor_min ", c.factor_min, ", factor_max ", c.factor_max,
               ", factor_threshold ", c.factor_threshold,
               " (need 0 < min <= max for both pairs, 0 <= coeff_beta < 1, 0 <= factor_threshold < 1)");
}

Layer initial_layer() { return Layer{0.0, 1.0, 0.0, 1.0}; }

bool compressing(const Config& c, std::int64_t step) { return step >= c.freeze_step; }

float move_step(const Config& c, double coefficient) {
  return static_cast<float>(static_cast<double>(c.lr) * coefficient);
}

double warmup_coefficient(const Config& c, Layer& layer, const Sums& sums) {
  const double weights = std::sqrt(sums.second), update = std::sqrt(sums.first);
  double coefficient = 1.0;
  if (weights != 0 && update != 0) coefficient = std::clamp(weights / update, c.min_coeff, c.max_coeff);
  if (coefficient != 1.0) layer.coeff_freeze = c.coeff_beta * layer.coeff_freeze + (1.0 - c.coeff_beta) * coefficient;
  layer.lamb_coeff = coefficient;
  return coefficient;
}

ONEBIT_VECTOR_CLONES void warmup_step(const Config& c, Layer& layer, std::int64_t step, float* p, float* m, float* v,
                                      float* v_fresh, const float* g, std::size_t n) {
  const bool last = step + 1 == c.freeze_step;
  const Sums sums =
      tiled::sum(n, [&](std::size_t i) { return warmup_element(c, last, p[i], m[i], v[i], v_fresh[i], g[i]); });
  move(c, warmup_coefficient(c, layer, sums), p, m, v, n);
}

void set_scaling_coeffs(const double* squares, const std::size_t* counts, std::size_t layers, Layer* states) {
  if (layers == 0) return;
  double sum_of_scales = 0;
  for (std::size_t j = 0; j < layers; ++j) {
    const double scale = counts[j] == 0 ? 0.0 : std::sqrt(squares[j]) / std::sqrt(static_cast<double>(counts[j]));
    states[j].scaling_coeff = scale;  // the scale for now; the coefficient below
    sum_of_scales += scale;
  }
  const double united = sum_of_scales / static_cast<double>(layers);
  for (std::size_t j = 0; j < layers; ++j) {
    states[j].scaling_coeff = states[j].scaling_coeff == 0 ? 1.0 : united / states[j].scaling_coeff;
  }
}

void scaling_coeffs(const float* m, const std::size_t* counts, std::size_t layers, Layer* states) {
  std::vector<double> squares(layers);
  std::size_t offset = 0;
  for (std::size_t j = 0; j < layers; ++j) {
    squares[j] = sum_of_squares(m + offset, counts[j]);
    offset += counts[j];
  }
  set_scaling_coeffs(squares.data(), counts, layers, states);
}

void check_momentum(const Layer& layer) {
  ONEBIT_CHECK(layer.scaling_coeff > 0, ONEBIT_INVALID_ARGUMENT, "1-bit LAMB layer has scaling_coeff ",
               layer.scaling_coeff, " (need > 0: set by onebit_lamb_scaling_coeffs at the first compression step)");
}

ONEBIT_VECTOR_CLONES void momentum_step(const Config& c, const Layer& layer, float* m, float* m_last, const float* g,
                                        std::size_t n) {
  check_momentum(layer);
  const float scaling = static_cast<float>(layer.scaling_coeff);
  for (std::size_t i = 0; i < n; ++i) {
    m_last[i] = m[i];
    m[i] = scaled_momentum(c, scaling, m_last[i], g[i]);
  }
}

void check_apply(const Layer& layer) {
  ONEBIT_CHECK(layer.scaling_coeff > 0 && layer.last_factor > 0, ONEBIT_INVALID_ARGUMENT,
               "1-bit LAMB layer has scaling_coeff ", layer.scaling_coeff, " and last_factor ", layer.last_factor,
               " (need both > 0: a layer from onebit_lamb_layer_init and onebit_lamb_scaling_coeffs)");
}

double apply_coefficient(const Config& c, Layer& layer, const Sums& sums) {
  double factor = sums.peak == 0.0f ? 1.0 : sums.peak;  // no live element (or none at all)
  if (c.weight_decay > 0) {
    const double ratio = sums.second == 0 ? 1.0 : std::min(1.0, std::sqrt(sums.first) / std::sqrt(sums.second));
    factor = factor * ratio + (1.0 - ratio);
  }
  factor = std::clamp(factor, c.factor_min, c.factor_max);
  factor = std::clamp(factor, layer.last_factor * (1.0 - c.factor_threshold),
                      layer.last_factor * (1.0 + c.factor_threshold));
  layer.last_factor = factor;
  layer.lamb_coeff = layer.coeff_freeze * factor;
  return layer.lamb_coeff;
}

ONEBIT_VECTOR_CLONES void apply_step(const Config& c, Layer& layer, float* p, float* m, const float* m_last,
                                     const float* v, float* v_fresh, std::size_t n) {
  check_apply(layer);
  const float scaling = static_cast<float>(layer.scaling_coeff);
  const Sums sums =
      tiled::sum(n, [&](std::size_t i) { return apply_element(c, scaling, p[i], m[i], m_last[i], v[i], v_fresh[i]); });
  move(c, apply_coefficient(c, layer, sums), p, m, v, n);
}

}  // namespace onebit::optim::lamb
