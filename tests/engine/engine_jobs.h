// What the engine's C-ABI tests share: each rank's deterministic input, the comparison with the
// float64 reference, and the loopback root (ranks are real processes joining through
// tests/support/loopback_comm.h).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "onebit/onebit.h"
#include "tests/support/loopback_comm.h"

namespace onebit::testing {

// Rank `rank`'s input of call `call`: normal values, shifted by the rank, reproducible by `salt`.
inline std::vector<float> input(int rank, int call, std::size_t n, unsigned salt) {
  std::mt19937 rng(static_cast<unsigned>(rank * 7919 + call * 104729) ^ salt);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = normal(rng) + 0.1f * static_cast<float>(rank);
  return x;
}

// Compares one rank's output with the reference; returns the number of ambiguous elements seen.
inline std::size_t expect_matches(const float* out, const std::vector<double>& ref, const std::vector<char>& ambiguous,
                                  const std::string& where) {
  std::size_t skipped = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    if (ambiguous[i]) {
      ++skipped;
      continue;
    }
    if (std::fabs(out[i] - ref[i]) > 1e-4 * std::fabs(ref[i]) + 1e-30) {
      ADD_FAILURE() << where << ": element " << i << " is " << out[i] << ", the float64 reference says " << ref[i];
      return skipped;
    }
  }
  return skipped;
}

inline std::string root_at(int port) { return "127.0.0.1:" + std::to_string(port); }

}  // namespace onebit::testing
