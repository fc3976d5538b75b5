// The float64 reference of docs/algorithm.md: W ranks' error feedback for one tag, in float64. Shared by
// the engine tests and the soak tool.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace onebit::testing {

// W ranks' error feedback for one tag, in float64. step() takes every rank's input of one call and
// returns the output every rank must get. Elements whose sign is ambiguous in the reference (|y| or
// |z| within 1e-6 of its scale), where float32 may legitimately choose the other sign, are marked
// and excluded from later comparisons; tests check that they are rare.
class Reference {
 public:
  Reference(int world, std::size_t n) : world_(world), n_(n), e_(world, std::vector<double>(n, 0.0)), ambiguous_(n, 0) {
    chunk_ = ((n + world - 1) / world + 7) / 8 * 8;
    for (int j = 0; j < world; ++j) s_.emplace_back(length(j), 0.0);
  }
  std::size_t begin(int j) const { return std::min(n_, j * chunk_); }
  std::size_t length(int j) const { return std::min(n_, begin(j) + chunk_) - begin(j); }

  // x: float inputs, or double ones (the hierarchical reference's host means).
  template <typename T>
  std::vector<double> step(const std::vector<std::vector<T>>& x, bool sum) {
    if (world_ == 1) return std::vector<double>(x[0].begin(), x[0].end());
    std::vector<double> a(world_);
    std::vector<std::vector<double>> y(world_, std::vector<double>(n_));
    for (int r = 0; r < world_; ++r) {
      double squares = 0;
      for (std::size_t i = 0; i < n_; ++i) y[r][i] = x[r][i] + e_[r][i], squares += y[r][i] * y[r][i];
      a[r] = n_ == 0 ? 0 : std::sqrt(squares / n_);
      for (std::size_t i = 0; i < n_; ++i) {
        if (std::fabs(y[r][i]) <= 1e-6 * a[r]) ambiguous_[i] = 1;
        e_[r][i] = y[r][i] - a[r] * sign(y[r][i]);
      }
    }
    std::vector<double> out(n_);
    for (int j = 0; j < world_; ++j) {
      std::vector<double> z(length(j));
      double squares = 0;
      for (std::size_t k = 0; k < length(j); ++k) {
        const std::size_t i = begin(j) + k;
        double mean = 0;
        for (int r = 0; r < world_; ++r) mean += a[r] * sign(y[r][i]);
        z[k] = mean / world_ + s_[j][k];
        squares += z[k] * z[k];
      }
      const double b = length(j) == 0 ? 0 : std::sqrt(squares / length(j));
      for (std::size_t k = 0; k < length(j); ++k) {
        const std::size_t i = begin(j) + k;
        if (std::fabs(z[k]) <= 1e-6 * b) ambiguous_[i] = 1;
        s_[j][k] = z[k] - b * sign(z[k]);
        out[i] = b * sign(z[k]) * (sum ? world_ : 1);
      }
    }
    return out;
  }
  const std::vector<char>& ambiguous() const { return ambiguous_; }
  std::vector<char>& ambiguous() { return ambiguous_; }

 private:
  static double sign(double v) { return v >= 0 ? 1.0 : -1.0; }
  int world_;
  std::size_t n_, chunk_;
  std::vector<std::vector<double>> e_, s_;
  std::vector<char> ambiguous_;
};

// The hierarchical rule (docs/design/engine.md, "Hierarchical compression") in float64: H hosts of L
// ranks; host h's mean m_h = (1/L)·Σ_l x_{hL+l}; shard q of the buffer (ChunkGeometry's rule over L)
// goes through docs/algorithm.md over the H hosts' means, with its own error state (a Reference of H
// ranks per shard); every rank gets the concatenation.
class HierarchicalReference {
 public:
  HierarchicalReference(int hosts, int local_size, std::size_t n)
      : hosts_(hosts),
        local_size_(local_size),
        n_(n),
        shard_((((n + local_size - 1) / local_size) + 7) / 8 * 8),
        ambiguous_(n, 0) {
    for (int q = 0; q < local_size; ++q) rails_.emplace_back(hosts, length(q));
  }
  std::size_t begin(int q) const { return std::min(n_, q * shard_); }
  std::size_t length(int q) const { return std::min(n_, begin(q) + shard_) - begin(q); }

  std::vector<double> step(const std::vector<std::vector<float>>& x, bool sum) {
    std::vector<double> out(n_);
    for (int q = 0; q < local_size_; ++q) {
      std::vector<std::vector<double>> means(hosts_, std::vector<double>(length(q)));
      for (int h = 0; h < hosts_; ++h) {
        for (std::size_t k = 0; k < length(q); ++k) {
          double total = 0;
          for (int l = 0; l < local_size_; ++l) total += x[h * local_size_ + l][begin(q) + k];
          means[h][k] = total / local_size_;
        }
      }
      const std::vector<double> rail = rails_[q].step(means, false);
      for (std::size_t k = 0; k < length(q); ++k) {
        out[begin(q) + k] = rail[k] * (sum ? hosts_ * local_size_ : 1);
        ambiguous_[begin(q) + k] = rails_[q].ambiguous()[k];
      }
    }
    return out;
  }
  const std::vector<char>& ambiguous() const { return ambiguous_; }

 private:
  int hosts_, local_size_;
  std::size_t n_, shard_;
  std::vector<Reference> rails_;
  std::vector<char> ambiguous_;
};

}  // namespace onebit::testing
