// onebit-bench's driver: the Bench sweeps every size and algorithm, measures the machine's memcpy
// rate, warms each algorithm up until it settles, times the calls and derives the row: bandwidth,
// bytes on the wire, the lower bounds and the compressed stages (bench.h).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "tools/bench/bench.h"

namespace onebit::bench {
namespace {

using Clock = std::chrono::steady_clock;

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

}  // namespace

Bench::Bench(const BenchOptions& options, Communicator& comm, GlooAllreduce* gloo, Communicator* over_gloo)
    : o_(options), comm_(comm), gloo_(gloo), over_gloo_(over_gloo), world_(comm.size()), rank_(comm.rank()) {
  std::uint64_t largest = 0;
  for (std::uint64_t b : o_.sizes()) largest = std::max(largest, b);
  buffer_.resize(largest / 4);
  memcpy_rate_ = measure_memcpy();
}

int Bench::run() {
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

// Every rank copies 64 MiB five times, all at once; the bytes of all ranks over the slowest
// rank's time is what the machine's memory gives all ranks together — the denominator of the
// memory-time bound (they share its cores).
double Bench::measure_memcpy() {
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

void Bench::fill(std::size_t n, bool integers) {
  float* x = buffer_.data();
  for (std::size_t i = 0; i < n; ++i) x[i] = integers ? integer_value(rank_, i) : input_value(rank_, i);
}

// One call of the algorithm on the first n floats of the buffer; `tag` set for compressed.
void Bench::call(const std::string& algo, std::size_t n) {
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
void Bench::warm_up(Row& row, const std::string& algo, std::size_t n) {
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

Row Bench::run_one(const std::string& algo, std::uint64_t bytes) {
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
  row.wire_bytes = algo == "gloo"
                       ? ring_bytes
                       : static_cast<double>(after.bytes_sent - before.bytes_sent) / o_.iters - row.host_bytes;
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

}  // namespace onebit::bench
