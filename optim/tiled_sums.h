// The order of the optimizers' fp64 sums, written once for the CPU loops and the CUDA kernels
// (optim/cuda/tiled_sums.h), so that a sum on the device gives the CPU core's bits — a sum's bits
// depend on its order, and a GPU cannot sum in element order. Used by 1-bit LAMB's norms
// (lamb_rules.h) and by 1-bit Adam's automatic freeze's variance change (variance_measures.h), and
// by the device's dormant count (a count, exact in any order, so the CPU's loop agrees).
//
// The order, one a GPU runs in parallel and a CPU runs in a loop:
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

#include "optim/adam_elementwise.h"

namespace onebit::optim::tiled {

constexpr int kLanes = 256;
constexpr int kRounds = 8;
constexpr std::size_t kTile = std::size_t{kLanes} * kRounds;

// What one pass sums: two fp64 sums and a float maximum. Zero is the identity of every field: the
// terms summed are never negative (squares, absolute values, counts), and the maximum is of ratios
// > 0 (a NaN ratio is never taken, as std::max(factor, NaN) keeps factor).
struct Sums {
  double first;
  double second;
  float peak;
};

ONEBIT_ELEMENTWISE Sums combine(const Sums& x, const Sums& y) {
  return Sums{x.first + y.first, x.second + y.second, x.peak < y.peak ? y.peak : x.peak};
}

// The halving tree over one tile's lanes (lanes[0] holds the result).
inline void tile_of_lanes(Sums* lanes) {
  for (int s = kLanes / 2; s > 0; s /= 2) {
    for (int j = 0; j < s; ++j) lanes[j] = combine(lanes[j], lanes[j + s]);
  }
}

// The tiles of n elements (their partial sums on the device).
inline std::size_t tiles_of(std::size_t n) { return (n + kTile - 1) / kTile; }

// The tiles' sums of term(i) over [0, n), each tile in the order above; term(i) is called once
// per element, in index order (it may update the element). The lanes are kept as three arrays
// rather than as Sums: the same operations in the same order (combine's), in a form the compiler
// vectorizes — 3.5× faster on the CPU (docs/benchmarks/optimizer-steps.md, "The variance change in the
// tiled order").
template <typename Term>
std::vector<Sums> tile_sums(std::size_t n, Term&& term) {
  std::vector<Sums> tiles(tiles_of(n));
  double first[kLanes], second[kLanes];
  float peak[kLanes];
  Sums lanes[kLanes];
  for (std::size_t t = 0; t < tiles.size(); ++t) {
    for (int j = 0; j < kLanes; ++j) {
      first[j] = 0.0;
      second[j] = 0.0;
      peak[j] = 0.0f;
    }
    for (int r = 0; r < kRounds; ++r) {
      const std::size_t row = t * kTile + std::size_t(r) * kLanes;  // element of lane 0 this round
      const int in_row = row >= n ? 0 : static_cast<int>(n - row < kLanes ? n - row : kLanes);
      for (int j = 0; j < in_row; ++j) {
        const Sums x = term(row + j);
        first[j] = first[j] + x.first;
        second[j] = second[j] + x.second;
        peak[j] = peak[j] < x.peak ? x.peak : peak[j];
      }
    }
    for (int j = 0; j < kLanes; ++j) lanes[j] = Sums{first[j], second[j], peak[j]};
    tile_of_lanes(lanes);
    tiles[t] = lanes[0];
  }
  return tiles;
}

// The bytes of partial sums the device keeps for ranges of counts[0], …, counts[ranges-1]
// elements summed at once (one sum's at least).
inline std::size_t workspace_bytes(const std::size_t* counts, std::size_t ranges) {
  std::size_t tiles = 0;
  for (std::size_t j = 0; j < ranges; ++j) tiles += tiles_of(counts[j]);
  return (tiles > 0 ? tiles : 1) * sizeof(Sums);
}

// The sum of the tiles' sums, folded the same way until one remains (zero for no tile).
inline Sums total(std::vector<Sums> tiles) {
  while (tiles.size() > 1) tiles = tile_sums(tiles.size(), [&tiles](std::size_t i) { return tiles[i]; });
  return tiles.empty() ? Sums{0.0, 0.0, 0.0f} : tiles[0];
}

// The sum of term(i) over [0, n) in this order, on the CPU.
template <typename Term>
Sums sum(std::size_t n, Term&& term) {
  return total(tile_sums(n, term));
}

}  // namespace onebit::optim::tiled
