// 1-bit LAMB's CPU steps over one 25 M-element layer, through the C ABI of whichever libonebit.so
// it is linked against: the best of 5 of onebit_lamb_warmup_step and of onebit_lamb_apply_step.
// Built by hand against two libraries to compare them side by side in one run (docs/benchmarks/optimizer-steps.md,
// "1-bit LAMB's CPU steps"):
//
//   g++ -O2 -Iinclude tools/optim-bench/lamb_steps.cc -LDIR -lonebit -Wl,-rpath,DIR -o lamb_steps
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "onebit/onebit.h"

int main() {
  const std::size_t n = 25'000'000;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<float> p(n), m(n), v(n), fresh(n), last(n), g(n);
  for (std::size_t i = 0; i < n; ++i) {
    p[i] = normal(rng);
    m[i] = normal(rng);
    v[i] = 1e-3f * static_cast<float>(1 + i % 5);
    fresh[i] = v[i];
    last[i] = m[i];
    g[i] = normal(rng);
  }
  const onebit_lamb_config_t c{0.003f, 0.9f, 0.999f, 1e-8f, 0.01f, 100, 10.0, 0.01, 0.9, 4.0, 0.5, 0.1};
  onebit_lamb_layer_t layer{1.0, 1.0, 1.0, 1.0};
  double warmup = 1e9, apply = 1e9;
  for (int repetition = 0; repetition < 5; ++repetition) {
    const auto t0 = std::chrono::steady_clock::now();
    if (onebit_lamb_warmup_step(&c, &layer, 0, p.data(), m.data(), v.data(), fresh.data(), g.data(), n) != 0) return 1;
    const auto t1 = std::chrono::steady_clock::now();
    if (onebit_lamb_apply_step(&c, &layer, p.data(), m.data(), last.data(), v.data(), fresh.data(), n) != 0) return 1;
    const auto t2 = std::chrono::steady_clock::now();
    warmup = std::min(warmup, std::chrono::duration<double>(t1 - t0).count());
    apply = std::min(apply, std::chrono::duration<double>(t2 - t1).count());
  }
  std::printf("warmup %.3f s, apply %.3f s (best of 5, %zu elements)\n", warmup, apply, n);
  return 0;
}
