// onebit-bench's checks (-c 1): each algorithm's result against its reference — exact sums for the
// full-precision ones, the float64 rule of one compressed round (flat or hierarchical) for a fresh
// tag — giving a row's #wrong and relative error (bench.h).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "tools/bench/bench.h"

namespace onebit::bench {

void Bench::check(Row& row, std::size_t n) {
  if (!compressed(row.algo)) {
    float wrong = 0;
    fill(n, true);
    call(row.algo, n);
    for (std::size_t i = 0; i < n; ++i) {
      float sum = 0;
      for (int r = 0; r < world_; ++r) sum += integer_value(r, i);
      const float expected = row.algo == "gloo" ? sum : sum / static_cast<float>(world_);
      if (buffer_.data()[i] != expected) ++wrong;
    }
    row.wrong = reduce_sum(wrong);
    return;
  }
  // A fresh tag (zero error state): the result of one call is the float64 reference below. Each
  // rank checks the chunk it serves; the worker scales are shared first.
  const std::string tag = "bench-check/" + std::to_string(row.bytes);
  fill(n, false);
  double squares = 0;
  for (std::size_t i = 0; i < n; ++i) squares += static_cast<double>(buffer_.data()[i]) * buffer_.data()[i];
  std::vector<float> scales(world_, 0.0f);
  scales[rank_] = static_cast<float>(std::sqrt(squares / n));
  comm_.ring_allreduce(scales.data(), world_, kernels::Dtype::kFloat32, ReduceOp::kSum);
  TagRegistry::instance().tag(tag, buffer_.data(), n, kernels::Dtype::kFloat32);
  call(row.algo, n);
  TagRegistry::instance().untag(buffer_.data());
  const std::size_t chunk = ((n + world_ - 1) / world_ + 7) / 8 * 8;
  const std::size_t begin = std::min(n, rank_ * chunk), end = std::min(n, begin + chunk);
  std::vector<double> z(end - begin), mean(end - begin);
  for (std::size_t i = begin; i < end; ++i) {
    double signed_sum = 0, value_sum = 0;
    for (int r = 0; r < world_; ++r) {
      const float x = input_value(r, i);
      signed_sum += x >= 0 ? scales[r] : -scales[r];
      value_sum += x;
    }
    z[i - begin] = signed_sum / world_;
    mean[i - begin] = value_sum / world_;
  }
  score(row, begin, z, mean, std::vector<char>(end - begin, 1));
}

// The checks' common end: this rank's served elements [begin, begin + z.size()) against sign(z)·b,
// b = ||z|| / sqrt(len) (`certain[k]` = 0: a sign the engine may legitimately round the other
// way), then #wrong and the relative error against the exact mean, over every rank.
void Bench::score(Row& row, std::size_t begin, const std::vector<double>& z, const std::vector<double>& mean,
                  const std::vector<char>& certain) {
  double z_squares = 0;
  for (double v : z) z_squares += v * v;
  const double b = z.empty() ? 0 : std::sqrt(z_squares / z.size());
  float wrong = 0;
  double error_squares = 0, mean_squares = 0;
  for (std::size_t k = 0; k < z.size(); ++k) {
    const double reference = z[k] >= 0 ? b : -b;
    const double out = buffer_.data()[begin + k];
    if (certain[k] && std::fabs(z[k]) > 1e-6 * b && std::fabs(out - reference) > 1e-5 * std::fabs(reference)) ++wrong;
    error_squares += (out - mean[k]) * (out - mean[k]);
    mean_squares += mean[k] * mean[k];
  }
  row.wrong = reduce_sum(wrong);
  const double err = reduce_sum(static_cast<float>(error_squares));
  const double norm = reduce_sum(static_cast<float>(mean_squares));
  row.relerr = norm > 0 ? std::sqrt(err / norm) : 0;
}

// The float64 reference of the hierarchical rule (docs/design/engine.md), for a fresh tag (zero error
// state). With L ranks per host and H hosts: host h's mean m_h = (1/L)·Σ_l x_{hL+l}; on rail q
// (shard q of the buffer, chunks of ChunkGeometry's rule at both levels) host h's worker scale is
// a_hq = ||m_h on shard q|| / sqrt(|shard q|); on chunk p of shard q, z = (1/H)·Σ_h sign(m_h)·a_hq,
// b = ||z on the chunk|| / sqrt(|chunk|), and every rank's result is sign(z)·b. Each rank checks
// the chunk it serves: chunk `host` of shard `local`; the scales are shared first.
void Bench::check_hierarchical(Row& row, std::size_t n) {
  const int local_size = comm_.local_size();
  const int hosts = world_ / local_size;
  const int host = rank_ / local_size, local = rank_ % local_size;
  auto chunk_of = [](std::size_t elements, int parts) { return ((elements + parts - 1) / parts + 7) / 8 * 8; };
  const std::size_t shard_chunk = chunk_of(n, local_size);
  const std::size_t shard_begin = std::min(n, local * shard_chunk);
  const std::size_t shard_end = std::min(n, shard_begin + shard_chunk);
  auto host_mean = [&](int h, std::size_t i) {
    double sum = 0;
    for (int l = 0; l < local_size; ++l) sum += input_value(h * local_size + l, i);
    return sum / local_size;
  };
  double squares = 0;
  for (std::size_t i = shard_begin; i < shard_end; ++i) squares += host_mean(host, i) * host_mean(host, i);
  std::vector<float> scales(world_, 0.0f);  // [h·L + q]: a_hq
  scales[rank_] = shard_end > shard_begin ? static_cast<float>(std::sqrt(squares / (shard_end - shard_begin))) : 0.0f;
  comm_.ring_allreduce(scales.data(), world_, kernels::Dtype::kFloat32, ReduceOp::kSum);

  const std::string tag = "bench-check/" + std::to_string(row.bytes);
  fill(n, false);
  TagRegistry::instance().tag(tag, buffer_.data(), n, kernels::Dtype::kFloat32);
  call(row.algo, n);
  TagRegistry::instance().untag(buffer_.data());

  const std::size_t rail_chunk = chunk_of(shard_end - shard_begin, hosts);
  const std::size_t begin = std::min(shard_end, shard_begin + host * rail_chunk);
  const std::size_t end = std::min(shard_end, begin + rail_chunk);
  std::vector<double> z(end - begin), mean(end - begin);
  std::vector<char> sign_certain(end - begin, 1);
  for (std::size_t i = begin; i < end; ++i) {
    double signed_sum = 0, value_sum = 0;
    for (int h = 0; h < hosts; ++h) {
      const double m = host_mean(h, i);
      const double a = scales[h * local_size + local];
      signed_sum += m >= 0 ? a : -a;
      value_sum += m;
      // The engine's fp32 mean may round a value this close to 0 to the other sign.
      if (std::fabs(m) <= 1e-6 * a) sign_certain[i - begin] = 0;
    }
    z[i - begin] = signed_sum / hosts;
    mean[i - begin] = value_sum / hosts;
  }
  score(row, begin, z, mean, sign_certain);
}

}  // namespace onebit::bench
