// The automatic freeze's variance change on the CPU over 25.2 M elements: summed in element order
// (onebit_adam_variance_change before the tiled order, its loop kept here for the comparison) and
// in optim/tiled_sums.h's order (the core's now, optim/variance_measures.h), side by side in one
// run, alternating, best of 5 each (docs/benchmarks/optimizer-steps.md, "The variance change in the tiled order"):
//
//   g++ -O3 -ffp-contract=off -fno-math-errno -std=c++20 -I. -Iinclude \
//       tools/optim-bench/variance_change_order.cc -o variance_change_order
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "optim/tiled_sums.h"
#include "optim/variance_measures.h"

namespace {

using onebit::optim::tiled::sum;
namespace measures = onebit::optim::variance_measures;

__attribute__((noinline)) double element_order(const float* v, const float* v_then, std::size_t n) {
  double moved = 0, total = 0;
  for (std::size_t i = 0; i < n; ++i) {
    moved += std::fabs(static_cast<double>(v[i]) - static_cast<double>(v_then[i]));
    total += std::fabs(static_cast<double>(v[i]));
  }
  if (total == 0) return moved == 0 ? 0.0 : 1.0;
  return moved / total;
}

__attribute__((noinline)) double tiled_order(const float* v, const float* v_then, std::size_t n) {
  return measures::variance_change(
      sum(n, [&](std::size_t i) { return measures::variance_change_terms(v[i], v_then[i]); }));
}

template <typename Measure>
double best_of_5(Measure measure, const std::vector<float>& v, const std::vector<float>& v_then, double& kept) {
  double best = 1e9;
  for (int r = 0; r < 5; ++r) {
    const auto start = std::chrono::steady_clock::now();
    kept += measure(v.data(), v_then.data(), v.size());
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

}  // namespace

int main() {
  const std::size_t n = 25'165'824;
  std::vector<float> v(n), v_then(n);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> uniform(0.0f, 1e-3f);
  for (std::size_t i = 0; i < n; ++i) {
    v[i] = uniform(rng);
    v_then[i] = uniform(rng);
  }
  double kept = 0;  // the answers used, so that no measurement is optimized away
  for (int round = 0; round < 3; ++round) {
    const double element = best_of_5(element_order, v, v_then, kept);
    const double tiled = best_of_5(tiled_order, v, v_then, kept);
    std::printf("round %d: element order %.4f s, tiled order %.4f s (tiled / element %.2f)\n", round, element, tiled,
                tiled / element);
  }
  std::printf("the change: element order %.17g, tiled order %.17g (%g)\n", element_order(v.data(), v_then.data(), n),
              tiled_order(v.data(), v_then.data(), n), kept);
}
