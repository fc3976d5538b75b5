// onebit-bench's parts (internal to the tool): the deterministic inputs every rank can regenerate,
// one row of the table, and the Bench that measures each algorithm and size. Its methods live in
// driver.cc (the sweep, warm-up and timing), check.cc (the results against float64 references)
// and report.cc (nccl-tests' table, JSON and CSV); onebit_bench.cc launches the ranks.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "common/aligned_buffer.h"
#include "engine/communicator.h"
#include "kernels/cpu/cpu_kernels.h"
#include "tools/bench/bench_options.h"
#include "tools/bench/gloo_baseline.h"

namespace onebit::bench {

// Deterministic inputs any rank can regenerate: uniform in [-1, 1) plus a per-rank offset.
inline float input_value(int rank, std::uint64_t i) {
  std::uint64_t z = (i + 1) * 0x9E3779B97F4A7C15ull ^ (static_cast<std::uint64_t>(rank) << 56);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) / static_cast<float>(1 << 23) - 1.0f + 0.05f * static_cast<float>(rank);
}
// Integer-valued inputs whose sums are exact in fp32.
inline float integer_value(int rank, std::uint64_t i) {
  return static_cast<float>((i * 31 + rank * 17) % 1000) - 500.0f;
}

struct Row {
  std::string algo;
  std::uint64_t bytes = 0;
  const char* redop = "avg";
  double time_us = 0;
  double algbw = 0, busbw = 0;            // GB/s, GB = 1e9
  double wrong = -1;                      // -1: not checked
  double wire_bytes = 0;                  // per rank per call (hierarchical: to other hosts only)
  double host_bytes = 0;                  // hierarchical: per rank per call, to ranks of its own host
  double ratio = 0;                       // fp32 ring bytes / wire bytes
  double relerr = NAN;                    // vs the exact average, compressed with -c 1
  double wire_us = NAN, memory_us = NAN;  // lower bounds (compressed)
  StageTimes stages;                      // per call, rank 0 (compressed)
  int warmup_calls = 0;                   // warm-up calls made before the timed ones
  bool settled = true;                    // false: --warmup-max was reached first
  std::vector<double> warmup_us;          // each settling warm-up call's time, mean over ranks
  double steal = NAN;                     // share of CPU time the hypervisor took during the timed calls
};

class Bench {
 public:
  Bench(const BenchOptions& options, Communicator& comm, GlooAllreduce* gloo, Communicator* over_gloo);

  int run();

 private:
  float reduce_sum(float value) {
    comm_.ring_allreduce(&value, 1, kernels::Dtype::kFloat32, ReduceOp::kSum);
    return value;
  }
  void barrier() { reduce_sum(0.0f); }

  static bool compressed(const std::string& algo) {
    return algo == "compressed" || algo == "compressed-gloo" || algo == "hierarchical";
  }
  // The communicator an algorithm's calls and counters belong to.
  Communicator& comm_for(const std::string& algo) { return algo == "compressed-gloo" ? *over_gloo_ : comm_; }

  // driver.cc
  double measure_memcpy();
  void fill(std::size_t n, bool integers);
  void call(const std::string& algo, std::size_t n);
  void warm_up(Row& row, const std::string& algo, std::size_t n);
  Row run_one(const std::string& algo, std::uint64_t bytes);

  // check.cc
  void check(Row& row, std::size_t n);
  void score(Row& row, std::size_t begin, const std::vector<double>& z, const std::vector<double>& mean,
             const std::vector<char>& certain);
  void check_hierarchical(Row& row, std::size_t n);

  // report.cc
  void header();
  void print(const Row& r);
  void footer(const std::vector<Row>& rows);

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

}  // namespace onebit::bench
