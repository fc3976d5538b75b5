// 1-bit LAMB's rules for one element and the order of its sums, written once for the CPU loops
// (optim/onebit_lamb.cc) and the CUDA kernels (optim/cuda/lamb_device.cu), so that both give the
// same bits (optim/adam_elementwise.h says how: no fused multiply-adds on either side).
//
// A layer's norms are fp64 sums, and a sum's bits depend on its order; so the order is fixed here,
// one a GPU runs in parallel and a CPU runs in a loop:
//   - the elements fall into tiles of kTile = kLanes × kRounds; lane j of a tile sums the terms of
//     elements j, j + kLanes, j + 2·kLanes, … of the tile, in that order, from zero;
//   - the tile's kLanes lane sums are folded as a halving tree: for s = kLanes/2, …, 2, 1, lane j
//     (j < s) takes lane j + s (tile_of_lanes);
//   - the tiles' sums are then summed the same way, as terms, until one remains (total).
// A GPU block is a tile (one thread a lane); the tiles' sums go to the host, which finishes them
// with total(), the CPU's own code.
#pragma once

#include <cstddef>
#include <vector>

#include "onebit/onebit.h"
#include "optim/adam_elementwise.h"

namespace onebit::optim::lamb {

constexpr int kLanes = 256;
constexpr int kRounds = 8;
constexpr std::size_t kTile = std::size_t{kLanes} * kRounds;

// What a layer's pass sums: two fp64 sums and a float maximum (warmup: ‖d‖², ‖p‖²; the compression
// stage: ‖prelim‖², ‖d‖², the largest variance ratio). Zero is the identity of every field: the sums
// are of squares, and the maximum is of ratios > 0 (a NaN ratio is never taken, as std::max(factor,
// NaN) keeps factor).
struct Sums {
  double first;
  double second;
  float peak;
};

ONEBIT_ELEMENTWISE Sums combine(const Sums& x, const Sums& y) {
  return Sums{x.first + y.first, x.second + y.second, x.peak < y.peak ? y.peak : x.peak};
}

// d = m/(√v+ε) + wd·p. Unbounded in the compression stage too (onebit_lamb.cc says why).
ONEBIT_ELEMENTWISE float direction(const onebit_lamb_config_t& c, float p, float m, float v) {
  return m / (sqrtf(v) + c.eps) + c.weight_decay * p;
}

// An element's square in the first sum (the momentum's norm, for the layers' scaling coefficients).
ONEBIT_ELEMENTWISE Sums square_terms(float x) {
  const double value = x;
  return Sums{value * value, 0.0, 0.0f};
}

// The compression stage's momentum before the average: (β1·m + (1−β1)·g)·scaling.
ONEBIT_ELEMENTWISE float scaled_momentum(const onebit_lamb_config_t& c, float scaling, float m, float g) {
  return elementwise::momentum(c.beta1, m, g) * scaling;
}

// A warmup element: m and v as Adam's (v_fresh ← v at the last warmup step); its terms (d², p²).
ONEBIT_ELEMENTWISE Sums warmup_element(const onebit_lamb_config_t& c, bool last_warmup_step, float p, float& m,
                                       float& v, float& v_fresh, float g) {
  m = elementwise::momentum(c.beta1, m, g);
  v = elementwise::variance(c.beta2, v, g);
  if (last_warmup_step) v_fresh = v;
  const double d = direction(c, p, m, v);
  const double weight = p;
  return Sums{d * d, weight * weight, 0.0f};
}

// A compression-stage element after the average: m ← m/scaling (0 if dormant, frozen_variance.h);
// the gradient it implies updates v_fresh; its terms (prelim², d², the variance ratio unless dormant).
ONEBIT_ELEMENTWISE Sums apply_element(const onebit_lamb_config_t& c, float scaling, float p, float& m, float m_last,
                                      float v, float& v_fresh) {
  const bool asleep = elementwise::dormant(v, c.eps);
  m = asleep ? 0.0f : m / scaling;
  const float g = (m - m_last * c.beta1) / (1.0f - c.beta1);
  v_fresh = c.beta2 * v_fresh + (1.0f - c.beta2) * g * g;
  const float denominator = sqrtf(v) + c.eps;
  const float prelim = m / denominator;
  const double d = prelim + c.weight_decay * p;
  // A dormant element's ratio compares ε with ε: it says nothing of the variance moving.
  const float ratio = asleep ? 0.0f : denominator / (sqrtf(v_fresh) + c.eps);
  return Sums{static_cast<double>(prelim) * prelim, d * d, ratio};
}

// The halving tree over one tile's lanes (lanes[0] holds the result).
inline void tile_of_lanes(Sums* lanes) {
  for (int s = kLanes / 2; s > 0; s /= 2) {
    for (int j = 0; j < s; ++j) lanes[j] = combine(lanes[j], lanes[j + s]);
  }
}

// The tiles of a layer of n elements (its partial sums on the device).
inline std::size_t tiles_of(std::size_t n) { return (n + kTile - 1) / kTile; }

// The tiles' sums of term(i) over [0, n), each tile in the order above; term(i) is called once
// per element (it may update the element).
template <typename Term>
std::vector<Sums> tile_sums(std::size_t n, Term&& term) {
  std::vector<Sums> tiles(tiles_of(n));
  Sums lanes[kLanes];
  for (std::size_t t = 0; t < tiles.size(); ++t) {
    for (Sums& lane : lanes) lane = Sums{0.0, 0.0, 0.0f};
    for (int r = 0; r < kRounds; ++r) {
      for (int j = 0; j < kLanes; ++j) {
        const std::size_t i = t * kTile + std::size_t(r) * kLanes + j;
        if (i < n) lanes[j] = combine(lanes[j], term(i));
      }
    }
    tile_of_lanes(lanes);
    tiles[t] = lanes[0];
  }
  return tiles;
}

// The bytes of partial sums the device steps keep for `layers` layers (one sum's at least).
inline std::size_t workspace_bytes(const std::size_t* counts, std::size_t layers) {
  std::size_t tiles = 0;
  for (std::size_t j = 0; j < layers; ++j) tiles += tiles_of(counts[j]);
  return (tiles > 0 ? tiles : 1) * sizeof(Sums);
}

// The sum of the tiles' sums, folded the same way until one remains (zero for no tile).
inline Sums total(std::vector<Sums> tiles) {
  while (tiles.size() > 1) tiles = tile_sums(tiles.size(), [&tiles](std::size_t i) { return tiles[i]; });
  return tiles.empty() ? Sums{0.0, 0.0, 0.0f} : tiles[0];
}

}  // namespace onebit::optim::lamb
