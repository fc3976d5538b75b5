// onebit-kernel-bench: the CPU compression kernels' memory rate against memcpy, side by side in one
// run. Rates are "bytes the kernel must touch per second": a worker pass over n fp32 elements must
// read x and the stored error and write the new stored error and the bits — 12.125 bytes per
// element, the one-pass scheme of docs/algorithm.md — whatever the hardware does beyond that. memcpy of
// S bytes touches 2·S. The closing summary prints each kernel's rate as a fraction of memcpy's.
//
//   onebit-kernel-bench [--benchmark_filter=...] [other Google Benchmark flags]
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"

namespace {

using onebit::kernels::CpuKernels;
using onebit::kernels::Dtype;

constexpr std::size_t kLarge = std::size_t{64} << 20;  // 64 Mi elements
constexpr std::size_t kSmall = std::size_t{1} << 20;   // 1 Mi elements: in cache-ish
constexpr int kServerRanks = 4;

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<std::uint8_t, FreeDeleter>;

Buffer allocate(std::size_t bytes) {
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (p == nullptr) std::abort();
  std::memset(p, 0, bytes);  // fault the pages in before anything is timed
  return Buffer(static_cast<std::uint8_t*>(p));
}

// Buffers shared by every benchmark, made once: random x and errors, bits for every rank.
struct Buffers {
  Buffer x, e_prev, e_next, bits, out;
  std::vector<Buffer> rank_bits;
  Buffers()
      : x(allocate(kLarge * 4)),
        e_prev(allocate(kLarge * 4)),
        e_next(allocate(kLarge * 4)),
        bits(allocate(kLarge / 8)),
        out(allocate(kLarge * 4)) {
    std::mt19937 rng(42);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    auto* xf = reinterpret_cast<float*>(x.get());
    auto* ef = reinterpret_cast<float*>(e_prev.get());
    for (std::size_t i = 0; i < kLarge; ++i) xf[i] = normal(rng), ef[i] = 0.01f * normal(rng);
    for (int r = 0; r < kServerRanks; ++r) {
      rank_bits.push_back(allocate(kLarge / 8));
      for (std::size_t i = 0; i < kLarge / 8; ++i) rank_bits.back().get()[i] = static_cast<std::uint8_t>(rng());
    }
  }
};

Buffers& buffers() {
  static Buffers b;
  return b;
}

void bm_memcpy(benchmark::State& state) {
  const std::size_t bytes = static_cast<std::size_t>(state.range(0)) * 4;
  Buffers& b = buffers();
  for (auto _ : state) {
    std::memcpy(b.e_next.get(), b.x.get(), bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * 2 * bytes));
}

void bm_worker(benchmark::State& state, const CpuKernels* k, Dtype dtype) {
  const std::size_t n = static_cast<std::size_t>(state.range(0));
  Buffers& b = buffers();
  const auto* e_prev = reinterpret_cast<const float*>(b.e_prev.get());
  auto* e_next = reinterpret_cast<float*>(b.e_next.get());
  double sum = 0;
  for (auto _ : state) {
    sum += k->worker_pass(b.x.get(), dtype, e_prev, 0.5f, e_next, b.bits.get(), n);
    benchmark::ClobberMemory();
  }
  benchmark::DoNotOptimize(sum);
  const std::size_t per_element = onebit::kernels::dtype_size(dtype) + 4 + 4;
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * (n * per_element + n / 8)));
}

void bm_norm(benchmark::State& state, const CpuKernels* k) {
  const std::size_t n = static_cast<std::size_t>(state.range(0));
  Buffers& b = buffers();
  double sum = 0;
  for (auto _ : state)
    sum += k->norm_pass(b.x.get(), Dtype::kFloat32, reinterpret_cast<const float*>(b.e_prev.get()), 0.5f, n);
  benchmark::DoNotOptimize(sum);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n * 8));
}

void bm_server(benchmark::State& state, const CpuKernels* k) {
  const std::size_t n = static_cast<std::size_t>(state.range(0)) / kServerRanks;  // one chunk
  Buffers& b = buffers();
  std::vector<const std::uint8_t*> bits;
  for (const Buffer& rb : b.rank_bits) bits.push_back(rb.get());
  const float scales[kServerRanks] = {0.9f, 1.1f, 1.0f, 0.7f};
  double sum = 0;
  for (auto _ : state) {
    sum += k->server_pass(bits.data(), scales, kServerRanks, reinterpret_cast<const float*>(b.e_prev.get()), 0.25f,
                          reinterpret_cast<float*>(b.e_next.get()), b.bits.get(), n);
    benchmark::ClobberMemory();
  }
  benchmark::DoNotOptimize(sum);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * (kServerRanks * n / 8 + 8 * n + n / 8)));
}

void bm_unpack(benchmark::State& state, const CpuKernels* k) {
  const std::size_t n = static_cast<std::size_t>(state.range(0));
  Buffers& b = buffers();
  for (auto _ : state) {
    k->unpack(b.bits.get(), 0.5f, b.out.get(), Dtype::kFloat32, n);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * (n / 8 + 4 * n)));
}

// Collects each run's rate for the summary, and prints as the console reporter does.
class SummaryReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      auto it = run.counters.find("bytes_per_second");
      if (it != run.counters.end()) rates[run.benchmark_name()] = it->second.value;
    }
    ConsoleReporter::ReportRuns(runs);
  }
  std::map<std::string, double> rates;
};

}  // namespace

int main(int argc, char** argv) {
  const std::string large = std::to_string(kLarge);
  const std::string small = std::to_string(kSmall);
  benchmark::RegisterBenchmark("memcpy", bm_memcpy)->Arg(kSmall)->Arg(kLarge)->UseRealTime();
  for (const CpuKernels* k : onebit::kernels::runnable_cpu_kernels()) {
    const std::string set = k->name;
    for (Dtype dtype : {Dtype::kFloat32, Dtype::kFloat16, Dtype::kBFloat16}) {
      auto* bm = benchmark::RegisterBenchmark(("worker_pass/" + set + "/" + onebit::kernels::dtype_name(dtype)).c_str(),
                                              bm_worker, k, dtype);
      if (dtype == Dtype::kFloat32) bm->Arg(kSmall);
      bm->Arg(kLarge)->UseRealTime();
    }
    benchmark::RegisterBenchmark(("norm_pass/" + set + "/float32").c_str(), bm_norm, k)->Arg(kLarge)->UseRealTime();
    benchmark::RegisterBenchmark(("server_pass/" + set + "/float32/W4").c_str(), bm_server, k)
        ->Arg(kLarge)
        ->UseRealTime();
    benchmark::RegisterBenchmark(("unpack/" + set + "/float32").c_str(), bm_unpack, k)->Arg(kLarge)->UseRealTime();
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  SummaryReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();

  // The summary: rates at 64 Mi elements as a fraction of memcpy's, measured in this run.
  const auto memcpy_rate = reporter.rates.find("memcpy/" + large + "/real_time");
  if (memcpy_rate == reporter.rates.end()) return 0;
  std::printf("\nSummary at %zu Mi elements (bytes the kernel must touch per second / memcpy's), on %s:\n",
              kLarge >> 20, onebit::kernels::cpu_model().c_str());
  std::printf("  %-40s %10.2f GB/s\n", "memcpy (2 x 256 MiB)", memcpy_rate->second / 1e9);
  for (const auto& [name, rate] : reporter.rates) {
    if (name.rfind("memcpy", 0) == 0 || name.find("/" + large + "/") == std::string::npos) continue;
    std::printf("  %-40s %10.2f GB/s  %5.1f %% of memcpy\n", name.substr(0, name.find("/" + large)).c_str(), rate / 1e9,
                100.0 * rate / memcpy_rate->second);
  }
  return 0;
}
