// The compressed allreduce of docs/algorithm.md computed the way onebit computes it: fp32 elementwise
// operations in the kernels' order (one IEEE operation each, no fused multiply-add), fp64 sums of
// squares. Over many calls the float64 reference and an fp32 implementation part ways wherever a
// value lies within rounding of zero and its sign goes the other way — legitimately, and then for
// good, through the error feedback — so long soaks compare against this instead, exactly: every
// output bit must match. (Sums of squares are added in another order than the kernels' blocks; a
// scale can then differ in its last bit only if its fp64 value lies within ~1e-16 of a float
// rounding boundary.)
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace onebit::testing {

class Float32Oracle {
 public:
  Float32Oracle(int world, std::size_t n)
      : world_(world), n_(n), stored_(world, std::vector<float>(n, 0.0f)), worker_scale_(world, 0.0f) {
    chunk_ = ((n + world - 1) / world + 7) / 8 * 8;
    for (int j = 0; j < world; ++j) server_.emplace_back(length(j), 0.0f), server_scale_.push_back(0.0f);
  }
  std::size_t begin(int j) const { return std::min(n_, j * chunk_); }
  std::size_t length(int j) const { return std::min(n_, begin(j) + chunk_) - begin(j); }

  // Every rank's input of one call; returns what every rank's buffer must hold afterwards.
  std::vector<float> step(const std::vector<std::vector<float>>& x, bool sum) {
    if (world_ == 1) return x[0];
    std::vector<float> a(world_);
    std::vector<std::vector<float>> y(world_, std::vector<float>(n_));
    for (int r = 0; r < world_; ++r) {
      double squares = 0;
      for (std::size_t i = 0; i < n_; ++i) {
        y[r][i] = x[r][i] + true_error(stored_[r][i], worker_scale_[r]);
        squares += static_cast<double>(y[r][i]) * y[r][i];
      }
      a[r] = n_ == 0 ? 0.0f : static_cast<float>(std::sqrt(squares / static_cast<double>(n_)));
    }
    const float inv_world = 1.0f / static_cast<float>(world_);
    const float factor = sum ? static_cast<float>(world_) : 1.0f;
    std::vector<float> out(n_);
    for (int j = 0; j < world_; ++j) {
      std::vector<float> z(length(j));
      double squares = 0;
      for (std::size_t k = 0; k < length(j); ++k) {
        const std::size_t i = begin(j) + k;
        float total = 0.0f;
        for (int r = 0; r < world_; ++r) total += y[r][i] >= 0.0f ? a[r] : -a[r];
        const float scaled = total * inv_world;
        z[k] = scaled + true_error(server_[j][k], server_scale_[j]);
        squares += static_cast<double>(z[k]) * z[k];
      }
      const float b = length(j) == 0 ? 0.0f : static_cast<float>(std::sqrt(squares / static_cast<double>(length(j))));
      const float scale = b * factor;
      for (std::size_t k = 0; k < length(j); ++k) out[begin(j) + k] = z[k] >= 0.0f ? scale : -scale;
      server_[j] = z;
      server_scale_[j] = b;
    }
    stored_ = y;
    worker_scale_ = a;
    return out;
  }

 private:
  static float true_error(float stored, float scale) { return stored >= 0.0f ? stored - scale : stored + scale; }
  int world_;
  std::size_t n_, chunk_;
  std::vector<std::vector<float>> stored_, server_;
  std::vector<float> worker_scale_, server_scale_;
};

// The hierarchical rule computed as onebit computes it: host h's fp32 mean of shard q,
// ((x_{hL} + x_{hL+1}) + …) / L added left to right, then a Float32Oracle of H ranks per shard.
class HierarchicalOracle {
 public:
  HierarchicalOracle(int hosts, int local_size, std::size_t n)
      : hosts_(hosts), local_size_(local_size), n_(n), shard_((((n + local_size - 1) / local_size) + 7) / 8 * 8) {
    for (int q = 0; q < local_size; ++q) rails_.emplace_back(hosts, length(q));
  }
  std::size_t begin(int q) const { return std::min(n_, q * shard_); }
  std::size_t length(int q) const { return std::min(n_, begin(q) + shard_) - begin(q); }

  std::vector<float> step(const std::vector<std::vector<float>>& x, bool sum) {
    const float count = static_cast<float>(local_size_);
    const float factor = sum ? static_cast<float>(hosts_ * local_size_) : 1.0f;
    std::vector<float> out(n_);
    for (int q = 0; q < local_size_; ++q) {
      std::vector<std::vector<float>> means(hosts_, std::vector<float>(length(q)));
      for (int h = 0; h < hosts_; ++h) {
        for (std::size_t k = 0; k < length(q); ++k) {
          float total = x[h * local_size_][begin(q) + k];
          for (int l = 1; l < local_size_; ++l) total += x[h * local_size_ + l][begin(q) + k];
          means[h][k] = total / count;
        }
      }
      const std::vector<float> rail = rails_[q].step(means, false);
      for (std::size_t k = 0; k < length(q); ++k) out[begin(q) + k] = rail[k] * factor;
    }
    return out;
  }

 private:
  int hosts_, local_size_;
  std::size_t n_, shard_;
  std::vector<Float32Oracle> rails_;
};

}  // namespace onebit::testing
