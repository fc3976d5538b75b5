#include "optim/onebit_lamb.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "optim/frozen_variance.h"

namespace onebit::optim::lamb {
namespace {

// sqrt of the fp64 sum of squares, in element order.
double norm(const float* x, std::size_t n) {
  double sum = 0;
  for (std::size_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return std::sqrt(sum);
}

// d = m/(√v+ε) + wd·p. Unbounded in the compression stage too: 1-bit LAMB takes the dormant rule of
// frozen_variance.h but not Adam's step bound — its frozen trust ratio and clamped factor set its
// steps, and on the ReLU MLP of tests/python/training_hazards_check.py the bound cost it its
// convergence (docs/design.md, "Steps under a frozen variance").
inline float direction(const Config& c, float p, float m, float v) {
  return m / (std::sqrt(v) + c.eps) + c.weight_decay * p;
}

// p ← p − float(lr·coefficient)·d, d recomputed exactly as it was for the norm.
void move(const Config& c, double coefficient, float* p, const float* m, const float* v, std::size_t n) {
  const float step = static_cast<float>(static_cast<double>(c.lr) * coefficient);
  for (std::size_t i = 0; i < n; ++i) p[i] = p[i] - step * direction(c, p[i], m[i], v[i]);
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

void warmup_step(const Config& c, Layer& layer, std::int64_t step, float* p, float* m, float* v, float* v_fresh,
                 const float* g, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    m[i] = c.beta1 * m[i] + (1.0f - c.beta1) * g[i];
    v[i] = c.beta2 * v[i] + (1.0f - c.beta2) * g[i] * g[i];
  }
  if (step + 1 == c.freeze_step) std::copy(v, v + n, v_fresh);
  double d2 = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double d = direction(c, p[i], m[i], v[i]);
    d2 += d * d;
  }
  const double weights = norm(p, n), update = std::sqrt(d2);
  double coefficient = 1.0;
  if (weights != 0 && update != 0) coefficient = std::clamp(weights / update, c.min_coeff, c.max_coeff);
  if (coefficient != 1.0) layer.coeff_freeze = c.coeff_beta * layer.coeff_freeze + (1.0 - c.coeff_beta) * coefficient;
  layer.lamb_coeff = coefficient;
  move(c, coefficient, p, m, v, n);
}

void scaling_coeffs(const float* m, const std::size_t* counts, std::size_t layers, Layer* states) {
  if (layers == 0) return;
  double total = 0;
  std::size_t offset = 0;
  for (std::size_t j = 0; j < layers; ++j) {
    const double scale = counts[j] == 0 ? 0.0 : norm(m + offset, counts[j]) / std::sqrt(static_cast<double>(counts[j]));
    states[j].scaling_coeff = scale;  // the scale for now; the coefficient below
    total += scale;
    offset += counts[j];
  }
  const double united = total / static_cast<double>(layers);
  for (std::size_t j = 0; j < layers; ++j) {
    states[j].scaling_coeff = states[j].scaling_coeff == 0 ? 1.0 : united / states[j].scaling_coeff;
  }
}

void momentum_step(const Config& c, const Layer& layer, float* m, float* m_last, const float* g, std::size_t n) {
  ONEBIT_CHECK(layer.scaling_coeff > 0, ONEBIT_INVALID_ARGUMENT, "1-bit LAMB layer has scaling_coeff ",
               layer.scaling_coeff, " (need > 0: set by onebit_lamb_scaling_coeffs at the first compression step)");
  const float scaling = static_cast<float>(layer.scaling_coeff);
  for (std::size_t i = 0; i < n; ++i) {
    m_last[i] = m[i];
    m[i] = (c.beta1 * m[i] + (1.0f - c.beta1) * g[i]) * scaling;
  }
}

void apply_step(const Config& c, Layer& layer, float* p, float* m, const float* m_last, const float* v, float* v_fresh,
                std::size_t n) {
  ONEBIT_CHECK(layer.scaling_coeff > 0 && layer.last_factor > 0, ONEBIT_INVALID_ARGUMENT,
               "1-bit LAMB layer has scaling_coeff ", layer.scaling_coeff, " and last_factor ", layer.last_factor,
               " (need both > 0: a layer from onebit_lamb_layer_init and onebit_lamb_scaling_coeffs)");
  const float scaling = static_cast<float>(layer.scaling_coeff);
  float factor_f = 0.0f;  // max over live i of (√v+ε)/(√v_fresh+ε); every term is > 0
  double prelim2 = 0, update2 = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const bool asleep = dormant(v[i], c.eps);
    m[i] = asleep ? 0.0f : m[i] / scaling;
    const float g = (m[i] - m_last[i] * c.beta1) / (1.0f - c.beta1);
    v_fresh[i] = c.beta2 * v_fresh[i] + (1.0f - c.beta2) * g * g;
    const float denominator = std::sqrt(v[i]) + c.eps;
    const float prelim = m[i] / denominator;
    const double d = prelim + c.weight_decay * p[i];
    prelim2 += static_cast<double>(prelim) * prelim;
    update2 += d * d;
    // A dormant element's ratio compares ε with ε: it says nothing of the variance moving.
    if (!asleep) factor_f = std::max(factor_f, denominator / (std::sqrt(v_fresh[i]) + c.eps));
  }
  double factor = factor_f == 0.0f ? 1.0 : factor_f;  // no live element (or none at all)
  if (c.weight_decay > 0) {
    const double ratio = update2 == 0 ? 1.0 : std::min(1.0, std::sqrt(prelim2) / std::sqrt(update2));
    factor = factor * ratio + (1.0 - ratio);
  }
  factor = std::clamp(factor, c.factor_min, c.factor_max);
  factor = std::clamp(factor, layer.last_factor * (1.0 - c.factor_threshold),
                      layer.last_factor * (1.0 + c.factor_threshold));
  layer.last_factor = factor;
  layer.lamb_coeff = layer.coeff_freeze * factor;
  move(c, layer.lamb_coeff, p, m, v, n);
}

}  // namespace onebit::optim::lamb
