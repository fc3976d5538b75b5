// onebit-bench's report: the header, one line per row in nccl-tests' columns (onebit's own after
// #wrong) with the compressed stages and warm-up beneath, the same rows as JSON and CSV, and
// nccl-tests' footer with the speed-ups at the largest size (bench.h).
#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "tools/bench/bench.h"

namespace onebit::bench {
namespace {

// `text` as the inside of a JSON string: quotes and backslashes escaped, control characters dropped.
std::string json_text(const std::string& text) {
  std::string out;
  for (const char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) out += c;
  }
  return out;
}

}  // namespace

void Bench::header() {
  if (rank_ != 0) return;
  std::printf("# onebit-bench: %d ranks (%d per host), link %s, memcpy %.1f GB/s (all ranks together, measured now)\n",
              world_, comm_.local_size(), o_.link_name.empty() ? "(not emulated)" : o_.link_name.c_str(),
              memcpy_rate_ / 1e9);
  // What the kernel times depend on: the SIMD set that ran, and how many CPUs the ranks share
  // (rank 0's view; with --ranks every rank is on this machine).
  cpu_set_t cpus;
  const int cpu_count = ::sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 0;
  std::printf("# kernels: %s (ONEBIT_SIMD chooses) on %s; this rank may run on %d CPU(s)", kernels::cpu_kernels().name,
              kernels::cpu_model().c_str(), cpu_count);
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
  std::printf("# %10s %12s %8s %6s %6s %9s %7s %7s %6s  %-15s %12s %7s %7s %10s %6s\n", "size", "count", "type",
              "redop", "root", "time", "algbw", "busbw", "#wrong", "algo", "wire/rank", "ratio", "relerr", "bound",
              "t/bnd");
  std::printf("# %10s %12s %8s %6s %6s %9s %7s %7s %6s  %-15s %12s %7s %7s %10s %6s\n", "(B)", "(elements)", "", "", "",
              "(us)", "(GB/s)", "(GB/s)", "", "", "(B)", "", "", "(us)", "");
  std::fflush(stdout);
  if (!o_.json_path.empty()) json_.open(o_.json_path, std::ios::app);
  if (!o_.csv_path.empty()) {
    csv_.open(o_.csv_path, std::ios::app);
    csv_ << "link,ranks,algo,size,count,type,redop,time_us,algbw,busbw,wrong,wire_bytes,ratio,relerr,wire_us,memory_"
            "us\n";
  }
}

void Bench::print(const Row& r) {
  if (rank_ != 0) return;
  const double bound = std::isnan(r.wire_us) ? r.memory_us : std::max(r.wire_us, r.memory_us);
  char wrong[16], relerr[16], bound_text[16], ratio_to_bound[16];
  std::snprintf(wrong, sizeof(wrong), r.wrong < 0 ? "N/A" : "%.0f", r.wrong);
  std::snprintf(relerr, sizeof(relerr), std::isnan(r.relerr) ? "-" : "%.3f", r.relerr);
  std::snprintf(bound_text, sizeof(bound_text), std::isnan(bound) ? "-" : "%.0f", bound);
  std::snprintf(ratio_to_bound, sizeof(ratio_to_bound), std::isnan(bound) ? "-" : "%.2f", r.time_us / bound);
  std::printf("  %10llu %12llu %8s %6s %6d %9.1f %7.2f %7.2f %6s  %-15s %12.0f %6.1fx %7s %10s %6s\n",
              static_cast<unsigned long long>(r.bytes), static_cast<unsigned long long>(r.bytes / 4), "float", r.redop,
              -1, r.time_us, r.algbw, r.busbw, wrong, r.algo.c_str(), r.wire_bytes, r.ratio, relerr, bound_text,
              ratio_to_bound);
  if (compressed(r.algo)) {
    std::printf(
        "#   %s stages on rank 0 (us): worker %.0f | wait for inputs %.0f | server %.0f | wait for results %.0f"
        " | unpack %.0f; after %d warm-up call(s)%s",
        r.algo.c_str(), r.stages.worker * 1e6, r.stages.wait_inputs * 1e6, r.stages.server * 1e6,
        r.stages.wait_results * 1e6, r.stages.unpack * 1e6, r.warmup_calls,
        r.settled ? "" : ", NOT settled (--warmup-max reached)");
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
          << ",\"ranks\":" << world_ << ",\"algo\":\"" << r.algo << "\",\"size\":" << r.bytes
          << ",\"count\":" << r.bytes / 4 << ",\"redop\":\"" << r.redop << "\",\"time_us\":" << r.time_us
          << ",\"algbw\":" << r.algbw << ",\"busbw\":" << r.busbw << ",\"wrong\":" << num(r.wrong < 0 ? NAN : r.wrong)
          << ",\"wire_bytes\":" << r.wire_bytes << ",\"host_bytes\":" << r.host_bytes << ",\"ratio\":" << r.ratio
          << ",\"relerr\":" << num(r.relerr) << ",\"wire_us\":" << num(r.wire_us)
          << ",\"memory_us\":" << num(r.memory_us) << ",\"memcpy_bytes_per_second\":" << memcpy_rate_
          << ",\"stages_us\":{\"worker\":" << r.stages.worker * 1e6 << ",\"wait_inputs\":" << r.stages.wait_inputs * 1e6
          << ",\"server\":" << r.stages.server * 1e6 << ",\"wait_results\":" << r.stages.wait_results * 1e6
          << ",\"unpack\":" << r.stages.unpack * 1e6 << "},\"warmup_calls\":" << r.warmup_calls
          << ",\"settled\":" << (r.settled ? "true" : "false") << ",\"cpu_steal\":" << num(r.steal) << ",\"kernels\":\""
          << kernels::cpu_kernels().name << "\",\"cpu\":\"" << json_text(kernels::cpu_model()) << "\"}\n";
    json_.flush();
  }
  if (csv_.is_open()) {
    auto cell = [](double v) { return std::isnan(v) ? std::string() : std::to_string(v); };  // empty: not measured
    csv_ << o_.link_name << "," << world_ << "," << r.algo << "," << r.bytes << "," << r.bytes / 4 << ",float,"
         << r.redop << "," << r.time_us << "," << r.algbw << "," << r.busbw << "," << cell(r.wrong < 0 ? NAN : r.wrong)
         << "," << r.wire_bytes << "," << r.ratio << "," << cell(r.relerr) << "," << cell(r.wire_us) << ","
         << cell(r.memory_us) << "\n";
  }
}

void Bench::footer(const std::vector<Row>& rows) {
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
  if (!std::isnan(compressed) && !std::isnan(gloo))
    std::printf(" compressed is %.2fx faster than gloo;", gloo / compressed);
  if (!std::isnan(compressed) && !std::isnan(ring))
    std::printf(" compressed is %.2fx faster than ring;", ring / compressed);
  if (!std::isnan(ring) && !std::isnan(gloo)) std::printf(" ring time / gloo time = %.3f;", ring / gloo);
  if (!std::isnan(hierarchical) && !std::isnan(compressed)) {
    std::printf(" hierarchical time / compressed time = %.3f;", hierarchical / compressed);
  }
  if (!std::isnan(hierarchical) && !std::isnan(gloo))
    std::printf(" hierarchical is %.2fx faster than gloo;", gloo / hierarchical);
  const double over_pairs = time_of("compressed-gloo");
  if (!std::isnan(over_pairs) && !std::isnan(compressed)) {
    std::printf(" compressed over gloo's pairs / over onebit's TCP = %.3f;", over_pairs / compressed);
  }
  if (!std::isnan(over_pairs) && !std::isnan(gloo))
    std::printf(" compressed over gloo's pairs is %.2fx faster than gloo", gloo / over_pairs);
  std::printf("\n");
  std::fflush(stdout);
}

}  // namespace onebit::bench
