// onebit-bench: allreduce bandwidth of onebit's compressed collective, onebit's full-precision ring
// and Gloo's allreduce, side by side (same ranks, same link, sizes interleaved), printed in
// nccl-tests' columns plus onebit's own. See docs/benchmarks.md.
//
//   onebit-bench --ranks 4 -b 1M -e 256M -f 4 -c 1            # 4 local ranks on loopback
//   RANK=.. WORLD_SIZE=.. ONEBIT_ROOT=.. onebit-bench --gloo-store DIR --host ADDR ...   # one rank
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/cpu_kernels.h"
#include "common/aligned_buffer.h"
#include "engine/communicator.h"
#include "tools/bench/bench_options.h"
#include "tools/bench/gloo_baseline.h"
#include "transport/tcp/socket.h"

namespace onebit::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Deterministic inputs any rank can regenerate: uniform in [-1, 1) plus a per-rank offset.
float input_value(int rank, std::uint64_t i) {
  std::uint64_t z = (i + 1) * 0x9E3779B97F4A7C15ull ^ (static_cast<std::uint64_t>(rank) << 56);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) / static_cast<float>(1 << 23) - 1.0f + 0.05f * static_cast<float>(rank);
}
// Integer-valued inputs whose sums are exact in fp32.
float integer_value(int rank, std::uint64_t i) { return static_cast<float>((i * 31 + rank * 17) % 1000) - 500.0f; }

struct Row {
  std::string algo;
  std::uint64_t bytes = 0;
  const char* redop = "avg";
  double time_us = 0;
  double algbw = 0, busbw = 0;  // GB/s, GB = 1e9
  double wrong = -1;            // -1: not checked
  double wire_bytes = 0;        // per rank per call (hierarchical: to other hosts only)
  double host_bytes = 0;        // hierarchical: per rank per call, to ranks of its own host
  double ratio = 0;             // fp32 ring bytes / wire bytes
  double relerr = NAN;          // vs the exact average, compressed with -c 1
  double wire_us = NAN, memory_us = NAN;  // lower bounds (compressed)
  StageTimes stages;                       // per call, rank 0 (compressed)
  int warmup_calls = 0;                    // warm-up calls made before the timed ones
  bool settled = true;                     // false: --warmup-max was reached first
  std::vector<double> warmup_us;           // each settling warm-up call's time, mean over ranks
  double steal = NAN;                      // share of CPU time the hypervisor took during the timed calls
};

// The machine's CPU time so far, from /proc/stat's first line: total and stolen (by the hypervisor of
// a virtual machine: time this machine's CPUs were runnable but not running). Zeros if unreadable.
struct CpuTimes {
  double total = 0, steal = 0;
  static CpuTimes now() {
    CpuTimes t;
    std::ifstream stat("/proc/stat");
    std::string cpu;
    stat >> cpu;
    if (cpu != "cpu") return t;
    for (int field = 0; field < 8; ++field) {  // user nice system idle iowait irq softirq steal
      double ticks = 0;
      if (!(stat >> ticks)) return CpuTimes{};
      t.total += ticks;
      if (field == 7) t.steal = ticks;
    }
    return t;
  }
};

class Bench {
 public:
  Bench(const BenchOptions& options, Communicator& comm, GlooAllreduce* gloo, Communicator* over_gloo)
      : o_(options), comm_(comm), gloo_(gloo), over_gloo_(over_gloo), world_(comm.size()), rank_(comm.rank()) {
    std::uint64_t largest = 0;
    for (std::uint64_t b : o_.sizes()) largest = std::max(largest, b);
    buffer_.resize(largest / 4);
    memcpy_rate_ = measure_memcpy();
  }

  int run() {
    header();
    double wrong_total = 0;
    std::vector<Row> rows;
    for (std::uint64_t bytes : o_.sizes()) {
      for (const std::string& algo : o_.algos) {
        Row row = run_one(algo, bytes);
        if (row.wrong > 0) wrong_total += row.wrong;
        print(row);
        rows.push_back(row);
      }
    }
    footer(rows);
    return wrong_total > 0 ? 1 : 0;
  }

 private:
  float reduce_sum(float value) {
    comm_.ring_allreduce(&value, 1, kernels::Dtype::kFloat32, ReduceOp::kSum);
    return value;
  }
  void barrier() { reduce_sum(0.0f); }

  // Every rank copies 64 MiB five times, all at once; the bytes of all ranks over the slowest
  // rank's time is what the machine's memory gives all ranks together — the denominator of the
  // memory-time bound (they share its cores).
  double measure_memcpy() {
    const std::size_t bytes = std::size_t{64} << 20;
    const int copies = 5;
    AlignedBuffer<std::uint8_t> a(bytes), b(bytes);
    std::memset(a.data(), 1, bytes);
    std::memcpy(b.data(), a.data(), bytes);  // fault every page in first
    barrier();
    const auto t0 = Clock::now();
    for (int i = 0; i < copies; ++i) {
      std::memcpy(i % 2 ? a.data() : b.data(), i % 2 ? b.data() : a.data(), bytes);
    }
    std::vector<float> seconds(world_, 0.0f);
    seconds[rank_] = static_cast<float>(std::chrono::duration<double>(Clock::now() - t0).count());
    comm_.ring_allreduce(seconds.data(), world_, kernels::Dtype::kFloat32, ReduceOp::kSum);
    const float slowest = *std::max_element(seconds.begin(), seconds.end());
    return 2.0 * bytes * copies * world_ / slowest;
  }

  void fill(std::size_t n, bool integers) {
    float* x = buffer_.data();
    for (std::size_t i = 0; i < n; ++i) x[i] = integers ? integer_value(rank_, i) : input_value(rank_, i);
  }

  static bool compressed(const std::string& algo) {
    return algo == "compressed" || algo == "compressed-gloo" || algo == "hierarchical";
  }
  // The communicator an algorithm's calls and counters belong to.
  Communicator& comm_for(const std::string& algo) { return algo == "compressed-gloo" ? *over_gloo_ : comm_; }

  // One call of the algorithm on the first n floats of the buffer; `tag` set for compressed.
  void call(const std::string& algo, std::size_t n) {
    if (compressed(algo)) {
      Tag& tag = *TagRegistry::instance().find(buffer_.data());
      if (algo == "hierarchical") {
        comm_.hierarchical_allreduce(tag, buffer_.data(), n, kernels::Dtype::kFloat32, ReduceOp::kAvg);
      } else {
        comm_for(algo).flat_compressed_allreduce(tag, buffer_.data(), n, kernels::Dtype::kFloat32, ReduceOp::kAvg);
      }
    } else if (algo == "ring") comm_.ring_allreduce(buffer_.data(), n, kernels::Dtype::kFloat32, ReduceOp::kAvg);
    else gloo_->sum(buffer_.data(), n);
  }

  // -w calls; then, for the compressed algorithms (whose first calls size and fault in the tag's
  // state and settle the transport), more until one call's time is within --settle of the call
  // before, or --warmup-max calls in all. The time compared is the mean over ranks, so every rank
  // takes the same decision; each call starts after a barrier, so one rank's lag is not another's.
  void warm_up(Row& row, const std::string& algo, std::size_t n) {
    const bool settle = compressed(algo) && o_.settle > 0;
    double last = -1;
    row.settled = !settle;
    for (int i = 0; i < (settle ? o_.warmup_max : o_.warmup); ++i) {
      if (!settle) {
        call(algo, n);
        ++row.warmup_calls;
        continue;
      }
      barrier();
      const auto t0 = Clock::now();
      call(algo, n);
      ++row.warmup_calls;
      const double seconds =
          reduce_sum(static_cast<float>(std::chrono::duration<double>(Clock::now() - t0).count())) / world_;
      row.warmup_us.push_back(seconds * 1e6);
      if (i + 1 >= o_.warmup && last > 0 && std::fabs(seconds - last) <= o_.settle * last) {
        row.settled = true;
        break;
      }
      last = seconds;
    }
  }

  Row run_one(const std::string& algo, std::uint64_t bytes) {
    const std::size_t n = bytes / 4;
    Row row;
    row.algo = algo;
    row.bytes = bytes;
    row.redop = algo == "gloo" ? "sum" : "avg";
    const std::string tag = "bench/" + std::to_string(bytes);
    if (compressed(algo)) TagRegistry::instance().tag(tag, buffer_.data(), n, kernels::Dtype::kFloat32);
    fill(n, false);
    warm_up(row, algo, n);
    barrier();
    const onebit_stats_t before = comm_for(algo).stats();
    const std::uint64_t host_before = comm_for(algo).intra_host_bytes();
    const StageTimes stages_before = comm_for(algo).compressed_stage_times();
    const CpuTimes cpu_before = CpuTimes::now();
    const auto t0 = Clock::now();
    for (int i = 0; i < o_.iters; ++i) call(algo, n);
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count() / o_.iters;
    const CpuTimes cpu_after = CpuTimes::now();
    if (cpu_after.total > cpu_before.total) {
      row.steal = (cpu_after.steal - cpu_before.steal) / (cpu_after.total - cpu_before.total);
    }
    const onebit_stats_t after = comm_for(algo).stats();
    const std::uint64_t host_after = comm_for(algo).intra_host_bytes();
    const StageTimes stages_after = comm_for(algo).compressed_stage_times();
    row.stages.worker = (stages_after.worker - stages_before.worker) / o_.iters;
    row.stages.wait_inputs = (stages_after.wait_inputs - stages_before.wait_inputs) / o_.iters;
    row.stages.server = (stages_after.server - stages_before.server) / o_.iters;
    row.stages.wait_results = (stages_after.wait_results - stages_before.wait_results) / o_.iters;
    row.stages.unpack = (stages_after.unpack - stages_before.unpack) / o_.iters;
    if (compressed(algo)) TagRegistry::instance().untag(buffer_.data());
    // The stats calls' own barrier traffic is outside [before, after].
    const double ring_bytes = world_ > 1 ? 2.0 * (world_ - 1) / world_ * bytes : 0.0;
    row.host_bytes = static_cast<double>(host_after - host_before) / o_.iters;
    row.wire_bytes = algo == "gloo" ? ring_bytes : static_cast<double>(after.bytes_sent - before.bytes_sent) / o_.iters - row.host_bytes;
    row.wire_bytes = reduce_sum(static_cast<float>(row.wire_bytes)) / world_;
    row.host_bytes = reduce_sum(static_cast<float>(row.host_bytes)) / world_;
    row.ratio = row.wire_bytes > 0 ? ring_bytes / row.wire_bytes : 0;
    row.time_us = reduce_sum(static_cast<float>(seconds)) / world_ * 1e6;
    row.algbw = bytes / (row.time_us * 1e-6) / 1e9;
    row.busbw = row.algbw * (world_ > 1 ? 2.0 * (world_ - 1) / world_ : 0.0);
    if (compressed(algo)) {
      // With L ranks per host they share its link: it carries L ranks' bytes to the other hosts
      // (the flat call's traffic spread evenly over its W−1 peers, W−L of them on other hosts).
      const int local = comm_.local_size();
      const double off_host = algo == "hierarchical" || local <= 1 || world_ <= 1
                                  ? row.wire_bytes
                                  : row.wire_bytes * (world_ - local) / (world_ - 1);
      if (o_.link_bits_per_second > 0) row.wire_us = off_host * local / (o_.link_bits_per_second / 8) * 1e6;
      // Bytes the kernels must touch on each rank: worker pass (read x, e; write e; bits), server
      // pass over its chunk (W chunks of bits in; read, write s; bits out), unpack (bits in, x out).
      const double chunk = std::ceil(static_cast<double>(n) / world_ / 8) * 8;
      const double per_rank = 12.125 * n + (world_ * chunk / 8 + 8 * chunk + chunk / 8) + (n / 8.0 + 4.0 * n);
      row.memory_us = per_rank * world_ / memcpy_rate_ * 1e6;
      if (algo == "hierarchical") row.memory_us = NAN;  // the model above is the flat call's
    }
    if (o_.check) {
      if (row.algo == "hierarchical") check_hierarchical(row, n);
      else check(row, n);
    }
    return row;
  }

  void check(Row& row, std::size_t n) {
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
  void score(Row& row, std::size_t begin, const std::vector<double>& z, const std::vector<double>& mean,
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

  // The float64 reference of the hierarchical rule (docs/design.md), for a fresh tag (zero error
  // state). With L ranks per host and H hosts: host h's mean m_h = (1/L)·Σ_l x_{hL+l}; on rail q
  // (shard q of the buffer, chunks of ChunkGeometry's rule at both levels) host h's worker scale is
  // a_hq = ||m_h on shard q|| / sqrt(|shard q|); on chunk p of shard q, z = (1/H)·Σ_h sign(m_h)·a_hq,
  // b = ||z on the chunk|| / sqrt(|chunk|), and every rank's result is sign(z)·b. Each rank checks
  // the chunk it serves: chunk `host` of shard `local`; the scales are shared first.
  void check_hierarchical(Row& row, std::size_t n) {
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

  void header() {
    if (rank_ != 0) return;
    std::printf("# onebit-bench: %d ranks (%d per host), link %s, memcpy %.1f GB/s (all ranks together, measured now)\n",
                world_, comm_.local_size(), o_.link_name.empty() ? "(not emulated)" : o_.link_name.c_str(),
                memcpy_rate_ / 1e9);
    // What the kernel times depend on: the SIMD set that ran, and how many CPUs the ranks share
    // (rank 0's view; with --ranks every rank is on this machine).
    cpu_set_t cpus;
    const int cpu_count = ::sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 0;
    std::printf("# kernels: %s (ONEBIT_SIMD chooses); this rank may run on %d CPU(s)", kernels::cpu_kernels().name,
                cpu_count);
    if (o_.ranks > cpu_count && cpu_count > 0) {
      std::printf(": %d local ranks share them, so stage times include waiting for a CPU", o_.ranks);
    }
    std::printf("\n# warm-up: at least %d call(s)", o_.warmup);
    if (o_.settle > 0) {
      std::printf("; compressed until a call is within %.0f%% of the one before (at most %d)", o_.settle * 100,
                  o_.warmup_max);
    }
    std::printf("\n");
    std::printf("# in-place allreduce of float32; GB = 1e9; busbw = algbw * 2(n-1)/n of the uncompressed size\n");
    std::printf("# wire: bytes each rank sends per call (onebit: measured, headers included; gloo: ring payload)\n");
    std::printf("# ratio: fp32 ring bytes / wire; relerr: |out - exact average| / |exact average| (compressed, -c 1)\n");
    std::printf("# bound: max(wire time at the link rate, kernel memory time at the measured memcpy rate)\n#\n");
    // nccl-tests' columns, in its order (in-place only), so its parsers read the table unchanged;
    // the algorithm and onebit's extras come after #wrong.
    std::printf("#                                                     in-place\n");
    std::printf("# %10s %12s %8s %6s %6s %9s %7s %7s %6s  %-15s %12s %7s %7s %10s %6s\n", "size", "count", "type", "redop",
                "root", "time", "algbw", "busbw", "#wrong", "algo", "wire/rank", "ratio", "relerr", "bound", "t/bnd");
    std::printf("# %10s %12s %8s %6s %6s %9s %7s %7s %6s  %-15s %12s %7s %7s %10s %6s\n", "(B)", "(elements)", "", "", "",
                "(us)", "(GB/s)", "(GB/s)", "", "", "(B)", "", "", "(us)", "");
    std::fflush(stdout);
    if (!o_.json_path.empty()) json_.open(o_.json_path, std::ios::app);
    if (!o_.csv_path.empty()) {
      csv_.open(o_.csv_path, std::ios::app);
      csv_ << "link,ranks,algo,size,count,type,redop,time_us,algbw,busbw,wrong,wire_bytes,ratio,relerr,wire_us,memory_us\n";
    }
  }

  void print(const Row& r) {
    if (rank_ != 0) return;
    const double bound = std::isnan(r.wire_us) ? r.memory_us : std::max(r.wire_us, r.memory_us);
    char wrong[16], relerr[16], bound_text[16], ratio_to_bound[16];
    std::snprintf(wrong, sizeof(wrong), r.wrong < 0 ? "N/A" : "%.0f", r.wrong);
    std::snprintf(relerr, sizeof(relerr), std::isnan(r.relerr) ? "-" : "%.3f", r.relerr);
    std::snprintf(bound_text, sizeof(bound_text), std::isnan(bound) ? "-" : "%.0f", bound);
    std::snprintf(ratio_to_bound, sizeof(ratio_to_bound), std::isnan(bound) ? "-" : "%.2f", r.time_us / bound);
    std::printf("  %10llu %12llu %8s %6s %6d %9.1f %7.2f %7.2f %6s  %-15s %12.0f %6.1fx %7s %10s %6s\n",
                static_cast<unsigned long long>(r.bytes), static_cast<unsigned long long>(r.bytes / 4), "float", r.redop, -1,
                r.time_us, r.algbw, r.busbw, wrong, r.algo.c_str(), r.wire_bytes, r.ratio, relerr, bound_text,
                ratio_to_bound);
    if (compressed(r.algo)) {
      std::printf("#   %s stages on rank 0 (us): worker %.0f | wait for inputs %.0f | server %.0f | wait for results %.0f"
                  " | unpack %.0f; after %d warm-up call(s)%s", r.algo.c_str(), r.stages.worker * 1e6,
                  r.stages.wait_inputs * 1e6, r.stages.server * 1e6, r.stages.wait_results * 1e6, r.stages.unpack * 1e6,
                  r.warmup_calls, r.settled ? "" : ", NOT settled (--warmup-max reached)");
      // Stolen CPU time slows the kernels but not the wire: on a virtual machine it is the first
      // suspect when a compressed row is slower than the last run's.
      if (!std::isnan(r.steal)) std::printf("; CPU steal %.0f%%", r.steal * 100);
      if (r.algo == "hierarchical") std::printf("; %.0f B/rank to its own host", r.host_bytes);
      std::printf("\n");
      if (!r.warmup_us.empty()) {
        std::printf("#   %s warm-up calls (us):", r.algo.c_str());
        for (double us : r.warmup_us) std::printf(" %.0f", us);
        std::printf("\n");
      }
    }
    std::fflush(stdout);
    auto num = [](double v) { return std::isnan(v) ? std::string("null") : std::to_string(v); };
    if (json_.is_open()) {
      json_ << "{\"link\":\"" << o_.link_name << "\",\"link_bits_per_second\":" << o_.link_bits_per_second
            << ",\"ranks\":" << world_ << ",\"algo\":\"" << r.algo << "\",\"size\":" << r.bytes << ",\"count\":" << r.bytes / 4
            << ",\"redop\":\"" << r.redop << "\",\"time_us\":" << r.time_us << ",\"algbw\":" << r.algbw
            << ",\"busbw\":" << r.busbw << ",\"wrong\":" << num(r.wrong < 0 ? NAN : r.wrong) << ",\"wire_bytes\":" << r.wire_bytes << ",\"host_bytes\":" << r.host_bytes
            << ",\"ratio\":" << r.ratio << ",\"relerr\":" << num(r.relerr) << ",\"wire_us\":" << num(r.wire_us)
            << ",\"memory_us\":" << num(r.memory_us) << ",\"memcpy_bytes_per_second\":" << memcpy_rate_
            << ",\"stages_us\":{\"worker\":" << r.stages.worker * 1e6 << ",\"wait_inputs\":" << r.stages.wait_inputs * 1e6
            << ",\"server\":" << r.stages.server * 1e6 << ",\"wait_results\":" << r.stages.wait_results * 1e6
            << ",\"unpack\":" << r.stages.unpack * 1e6 << "},\"warmup_calls\":" << r.warmup_calls
            << ",\"settled\":" << (r.settled ? "true" : "false") << ",\"cpu_steal\":" << num(r.steal) << ",\"kernels\":\"" << kernels::cpu_kernels().name << "\"}\n";
      json_.flush();
    }
    if (csv_.is_open()) {
      auto cell = [](double v) { return std::isnan(v) ? std::string() : std::to_string(v); };  // empty: not measured
      csv_ << o_.link_name << "," << world_ << "," << r.algo << "," << r.bytes << "," << r.bytes / 4 << ",float," << r.redop
           << "," << r.time_us << "," << r.algbw << "," << r.busbw << "," << cell(r.wrong < 0 ? NAN : r.wrong) << ","
           << r.wire_bytes << "," << r.ratio << "," << cell(r.relerr) << "," << cell(r.wire_us) << "," << cell(r.memory_us)
           << "\n";
    }
  }

  void footer(const std::vector<Row>& rows) {
    if (rank_ != 0) return;
    // nccl-tests' footer: the out-of-bounds line (onebit checks every value: #wrong), then the
    // average bus bandwidth, one line per algorithm (the first algorithm's line comes first).
    double wrong_total = 0;
    for (const Row& r : rows) wrong_total += std::max(0.0, r.wrong);
    std::printf("# Out of bounds values : %.0f %s\n", wrong_total, wrong_total > 0 ? "FAILED" : "OK");
    for (const std::string& algo : o_.algos) {
      double sum = 0;
      int count = 0;
      for (const Row& r : rows) {
        if (r.algo == algo) sum += r.busbw, ++count;
      }
      std::printf("# Avg bus bandwidth    : %g  (%s)\n", count ? sum / count : 0.0, algo.c_str());
    }
    const std::uint64_t largest = rows.empty() ? 0 : rows.back().bytes;
    auto time_of = [&](const std::string& algo) -> double {
      for (const Row& r : rows) {
        if (r.algo == algo && r.bytes == largest) return r.time_us;
      }
      return NAN;
    };
    const double compressed = time_of("compressed"), ring = time_of("ring"), gloo = time_of("gloo");
    const double hierarchical = time_of("hierarchical");
    std::printf("# At %llu bytes:", static_cast<unsigned long long>(largest));
    if (!std::isnan(compressed) && !std::isnan(gloo)) std::printf(" compressed is %.2fx faster than gloo;", gloo / compressed);
    if (!std::isnan(compressed) && !std::isnan(ring)) std::printf(" compressed is %.2fx faster than ring;", ring / compressed);
    if (!std::isnan(ring) && !std::isnan(gloo)) std::printf(" ring time / gloo time = %.3f;", ring / gloo);
    if (!std::isnan(hierarchical) && !std::isnan(compressed)) {
      std::printf(" hierarchical time / compressed time = %.3f;", hierarchical / compressed);
    }
    if (!std::isnan(hierarchical) && !std::isnan(gloo)) std::printf(" hierarchical is %.2fx faster than gloo;", gloo / hierarchical);
    const double over_pairs = time_of("compressed-gloo");
    if (!std::isnan(over_pairs) && !std::isnan(compressed)) {
      std::printf(" compressed over gloo's pairs / over onebit's TCP = %.3f;", over_pairs / compressed);
    }
    if (!std::isnan(over_pairs) && !std::isnan(gloo)) std::printf(" compressed over gloo's pairs is %.2fx faster than gloo", gloo / over_pairs);
    std::printf("\n");
    std::fflush(stdout);
  }

  const BenchOptions& o_;
  Communicator& comm_;
  GlooAllreduce* gloo_;
  Communicator* over_gloo_;  // --algo compressed-gloo: the same engine over the Gloo context's pairs
  const int world_;
  const int rank_;
  AlignedBuffer<float> buffer_;
  double memcpy_rate_ = 0;
  std::ofstream json_, csv_;
};

bool wants(const BenchOptions& o, const std::string& algo) {
  for (const auto& a : o.algos) {
    if (a == algo) return true;
  }
  return false;
}
bool wants_gloo(const BenchOptions& o) { return wants(o, "gloo") || wants(o, "compressed-gloo"); }

int run_rank(const BenchOptions& options, CommSetup setup, const std::string& gloo_store) {
  setup.local_size = options.local_size;
  Communicator comm(setup);
  ONEBIT_CHECK(!wants(options, "hierarchical") || comm.hierarchical(), ONEBIT_INVALID_ARGUMENT,
               "--algo hierarchical needs several ranks per host and several hosts: this rank has ", comm.local_size(),
               " per host of ", comm.size(), " (--local-size L or ONEBIT_LOCAL_SIZE)");
  std::unique_ptr<GlooAllreduce> gloo;
  if (wants_gloo(options)) gloo = std::make_unique<GlooAllreduce>(setup.rank, setup.size, gloo_store, options.host);
  std::unique_ptr<Communicator> over_gloo;
  if (wants(options, "compressed-gloo")) over_gloo = std::make_unique<Communicator>(gloo->pairs_transport(), comm.local_size());
  return Bench(options, comm, gloo.get(), over_gloo.get()).run();
}

int free_loopback_port() {
  tcp::Address any = tcp::parse_host_port("127.0.0.1:0", "loopback");
  tcp::Fd fd = tcp::listen_on(any, 1);
  return tcp::local_address(fd.get()).port();
}

// --ranks N: fork N ranks on loopback, each its own process, as a launcher would.
int spawn_local(const BenchOptions& options) {
  char store_template[] = "/tmp/onebit-bench-gloo-XXXXXX";
  ONEBIT_CHECK(::mkdtemp(store_template) != nullptr, ONEBIT_SYSTEM_ERROR, "mkdtemp: ", std::strerror(errno));
  const std::string store = store_template;
  const std::string root = "127.0.0.1:" + std::to_string(free_loopback_port());
  std::vector<pid_t> children;
  for (int r = 0; r < options.ranks; ++r) {
    const pid_t pid = ::fork();
    ONEBIT_CHECK(pid >= 0, ONEBIT_SYSTEM_ERROR, "fork: ", std::strerror(errno));
    if (pid == 0) {
      int code = 1;
      try {
        CommSetup setup;
        setup.rank = r;
        setup.size = options.ranks;
        setup.root = root;
        code = run_rank(options, setup, store);
      } catch (const std::exception& error) {
        std::fprintf(stderr, "onebit-bench: rank %d: %s\n", r, error.what());
        code = 2;
      }
      std::fflush(stdout);
      ::_exit(code);
    }
    children.push_back(pid);
  }
  int worst = 0;
  for (pid_t pid : children) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    worst = std::max(worst, code);
  }
  std::string command = "rm -rf '" + store + "'";
  [[maybe_unused]] int rc = std::system(command.c_str());
  return worst;
}

}  // namespace
}  // namespace onebit::bench

int main(int argc, char** argv) {
  using namespace onebit::bench;
  try {
    const BenchOptions options = parse_options(std::vector<std::string>(argv + 1, argv + argc));
    if (options.help) {
      std::fputs(usage(), stdout);
      return 0;
    }
    if (options.ranks > 0) return spawn_local(options);
    ONEBIT_CHECK(!wants_gloo(options) || !options.gloo_store.empty(), ONEBIT_INVALID_ARGUMENT,
                 "--algo gloo in launcher mode needs --gloo-store DIR (a directory every rank sees)");
    return run_rank(options, onebit::CommSetup::from_environment(), options.gloo_store);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "onebit-bench: error: %s\n", error.what());
    return 2;
  }
}
