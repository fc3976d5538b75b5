// onebit-soak: many rounds of real multi-process jobs on loopback — W = 2..8 ranks (--max-world), a
// random mix of compressed calls (several tags, AVG and SUM, error feedback carried across calls)
// and exact ring calls (random sizes and ops) — every result checked bit for bit: compressed against
// an fp32 oracle of docs/algorithm.md computed as the kernels compute it (tests/support/
// float32_oracle.h; the engine tests compare with the float64 reference), ring exactly. With
// --local-size L > 1 every round is hierarchical: W = L x 2.. hosts, the host reduce through shared
// memory or (ONEBIT_SHM=0) the transport, chosen per round. Exit status 0 only if every check of
// every rank passed.
//
//   onebit-soak [--rounds N] [--calls K] [--max-elements M] [--max-world W] [--local-size L] [--seed S]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "onebit/onebit.h"
#include "tests/support/float32_oracle.h"
#include "tests/support/multiprocess.h"

namespace {

using onebit::testing::Float32Oracle;
using onebit::testing::HierarchicalOracle;

struct Call {
  bool compressed;
  int tag;            // compressed: which tag
  std::size_t count;  // ring: elements
  onebit_op_t op;
};

struct Round {
  int world;
  int local_size;  // 1: flat
  int shm;         // hierarchical: ONEBIT_SHM
  std::vector<std::size_t> tag_counts;
  std::vector<Call> calls;
};

Round plan_round(std::uint64_t seed, int calls, std::size_t max_elements, int max_world, int local_size) {
  std::mt19937_64 rng(seed);
  Round round;
  const int max_hosts = std::max(2, max_world / local_size);
  round.world = local_size * (2 + static_cast<int>(rng() % static_cast<std::uint64_t>(max_hosts - 1)));
  round.local_size = local_size;
  round.shm = local_size > 1 ? static_cast<int>(rng() % 2) : 1;  // flat rounds draw as they always did
  const int tags = 1 + static_cast<int>(rng() % 3);
  for (int t = 0; t < tags; ++t) round.tag_counts.push_back(rng() % (max_elements + 1));
  for (int i = 0; i < calls; ++i) {
    Call call;
    call.compressed = rng() % 3 != 0;
    call.tag = static_cast<int>(rng() % tags);
    call.count = rng() % (max_elements + 1);
    call.op = rng() % 2 ? ONEBIT_AVG : ONEBIT_SUM;
    round.calls.push_back(call);
  }
  return round;
}

std::vector<float> compressed_input(std::uint64_t seed, int rank, int call, std::size_t n) {
  std::mt19937 rng(static_cast<unsigned>(seed * 1315423911u + rank * 7919 + call * 104729));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = normal(rng);
  return x;
}

float ring_value(int rank, int call, std::size_t i) {
  return static_cast<float>((i * 131 + static_cast<std::size_t>(rank) * 17 + call * 7) % 2001) - 1000.0f;
}

// The fp32 oracle of the round's algorithm for one tag.
class Oracle {
 public:
  Oracle(const Round& round, std::size_t n)
      : flat_(round.world, n),
        hierarchical_(round.world / round.local_size, round.local_size, n),
        is_flat_(round.local_size == 1) {}
  std::vector<float> step(const std::vector<std::vector<float>>& x, bool sum) {
    return is_flat_ ? flat_.step(x, sum) : hierarchical_.step(x, sum);
  }

 private:
  Float32Oracle flat_;
  HierarchicalOracle hierarchical_;
  bool is_flat_;
};

// One rank's part of a round: runs every call, checks every result; returns the number of failures.
int run_rank(const Round& round, std::uint64_t seed, int rank, int port) {
  // Before the first onebit call, which reads the ONEBIT_* parameters once.
  ::setenv("ONEBIT_LOCAL_SIZE", std::to_string(round.local_size).c_str(), 1);
  ::setenv("ONEBIT_SHM", std::to_string(round.shm).c_str(), 1);
  onebit_config_t config{60000, 0, nullptr, nullptr, nullptr, nullptr};
  onebit_comm_t comm = nullptr;
  const std::string root = "127.0.0.1:" + std::to_string(port);
  if (onebit_comm_init_config(&comm, rank, round.world, root.c_str(), &config) != ONEBIT_SUCCESS) {
    std::fprintf(stderr, "rank %d: init: %s\n", rank, onebit_last_error());
    return 1;
  }
  const int world = round.world;
  std::vector<std::vector<float>> tag_buffers;
  std::vector<Oracle> references;
  for (std::size_t t = 0; t < round.tag_counts.size(); ++t) {
    tag_buffers.emplace_back(round.tag_counts[t] + 1);  // +1: a non-NULL pointer even for 0 elements
    references.emplace_back(round, round.tag_counts[t]);
    onebit_tag(("soak" + std::to_string(t)).c_str(), tag_buffers[t].data(), round.tag_counts[t], ONEBIT_FLOAT32);
  }
  int failures = 0;
  for (std::size_t i = 0; i < round.calls.size(); ++i) {
    const Call& call = round.calls[i];
    const int c = static_cast<int>(i);
    if (call.compressed) {
      const std::size_t n = round.tag_counts[call.tag];
      std::vector<std::vector<float>> inputs;
      for (int r = 0; r < world; ++r) inputs.push_back(compressed_input(seed, r, c, n));
      std::copy(inputs[rank].begin(), inputs[rank].end(), tag_buffers[call.tag].begin());
      if (onebit_allreduce(comm, tag_buffers[call.tag].data(), n, ONEBIT_FLOAT32, call.op) != ONEBIT_SUCCESS) {
        std::fprintf(stderr, "rank %d call %d: %s\n", rank, c, onebit_last_error());
        return failures + 1;
      }
      const std::vector<float> expected = references[call.tag].step(inputs, call.op == ONEBIT_SUM);
      for (std::size_t k = 0; k < n; ++k) {
        const float out = tag_buffers[call.tag][k];
        if (std::memcmp(&out, &expected[k], sizeof(float)) != 0) {
          std::fprintf(stderr, "rank %d call %d (compressed, tag %d, n=%zu): element %zu is %g, reference %g\n", rank,
                       c, call.tag, n, k, out, expected[k]);
          ++failures;
          break;
        }
      }
    } else {
      std::vector<float> buffer(call.count + 1);
      for (std::size_t k = 0; k < call.count; ++k) buffer[k] = ring_value(rank, c, k);
      if (onebit_allreduce(comm, buffer.data(), call.count, ONEBIT_FLOAT32, call.op) != ONEBIT_SUCCESS) {
        std::fprintf(stderr, "rank %d call %d: %s\n", rank, c, onebit_last_error());
        return failures + 1;
      }
      for (std::size_t k = 0; k < call.count; ++k) {
        float sum = 0;
        for (int r = 0; r < world; ++r) sum += ring_value(r, c, k);
        const float expected = call.op == ONEBIT_SUM ? sum : sum / static_cast<float>(world);
        if (buffer[k] != expected) {
          std::fprintf(stderr, "rank %d call %d (ring, n=%zu): element %zu is %g, expected %g\n", rank, c, call.count,
                       k, buffer[k], expected);
          ++failures;
          break;
        }
      }
    }
  }
  for (auto& buffer : tag_buffers) onebit_untag(buffer.data());
  onebit_comm_destroy(comm);
  return failures;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 20, calls = 10, max_world = 8, local_size = 1;
  std::size_t max_elements = 20000;
  std::uint64_t seed = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const char* value = argv[i + 1];
    if (flag == "--rounds") rounds = std::atoi(value);
    else if (flag == "--calls") calls = std::atoi(value);
    else if (flag == "--max-elements") max_elements = std::strtoull(value, nullptr, 10);
    else if (flag == "--max-world") max_world = std::atoi(value);
    else if (flag == "--local-size") local_size = std::atoi(value);
    else if (flag == "--seed") seed = std::strtoull(value, nullptr, 10);
    else {
      std::fprintf(
          stderr, "usage: %s [--rounds N] [--calls K] [--max-elements M] [--max-world W] [--local-size L] [--seed S]\n",
          argv[0]);
      return 2;
    }
  }
  if (argc % 2 == 0 || rounds < 1 || calls < 1 || max_world < 2 || local_size < 1) {
    std::fprintf(stderr,
                 "usage: %s [--rounds N] [--calls K] [--max-elements M] [--max-world W] [--local-size L] [--seed S]\n",
                 argv[0]);
    return 2;
  }
  const auto start = std::chrono::steady_clock::now();
  long total_calls = 0, compressed_calls = 0, rank_runs = 0, failed_rounds = 0;
  for (int r = 0; r < rounds; ++r) {
    const std::uint64_t round_seed = seed * 1000003 + static_cast<std::uint64_t>(r);
    const Round round = plan_round(round_seed, calls, max_elements, max_world, local_size);
    const int port = onebit::testing::free_port();
    const auto outcomes = onebit::testing::run_ranks(
        round.world, [&](int rank) { return std::min(run_rank(round, round_seed, rank, port), 100); },
        std::chrono::seconds(300));
    bool ok = true;
    for (const auto& o : outcomes) ok = ok && o.exit_code == 0;
    total_calls += static_cast<long>(round.calls.size());
    for (const Call& c : round.calls) compressed_calls += c.compressed;
    rank_runs += round.world;
    if (!ok) {
      ++failed_rounds;
      std::printf("round %d (seed %llu, %d ranks, %d per host, ONEBIT_SHM=%d): FAILED (exit codes:", r,
                  static_cast<unsigned long long>(round_seed), round.world, round.local_size, round.shm);
      for (const auto& o : outcomes) std::printf(" %d", o.exit_code);
      std::printf(")\n");
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "onebit-soak: %d rounds, %ld processes, %ld collective calls per rank (%ld compressed, %ld ring), "
      "%.1f s: %ld rounds failed\n",
      rounds, rank_runs, total_calls, compressed_calls, total_calls - compressed_calls, seconds, failed_rounds);
  std::printf("%ld passed, %ld failed\n", static_cast<long>(rounds) - failed_rounds, failed_rounds);
  return failed_rounds == 0 ? 0 : 1;
}
