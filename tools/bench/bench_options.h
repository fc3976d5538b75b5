// onebit-bench's command line, nccl-tests style. Parsing is separate from main so it can be tested.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace onebit::bench {

struct BenchOptions {
  std::uint64_t min_bytes = 8 << 20;       // -b
  std::uint64_t max_bytes = 256ull << 20;  // -e
  std::uint64_t factor = 2;                // -f
  int iters = 5;                           // -n
  int warmup = 1;                          // -w: at least this many warm-up calls
  double settle = 0.05;                    // --settle: compressed warms up until a call is within this of the last
  int warmup_max = 20;                     // --warmup-max: ... or until this many warm-up calls in all
  bool check = false;                      // -c 0|1
  std::vector<std::string> algos = {"compressed", "ring", "gloo"};  // --algo
  int ranks = 0;                    // --ranks N: spawn N local ranks; 0: one rank from the launcher env
  int local_size = 0;               // --local-size L: ranks per host; 0: ONEBIT_LOCAL_SIZE
  std::string host = "127.0.0.1";   // --host: this rank's address (Gloo's device binds it)
  std::string gloo_store;           // --gloo-store DIR: Gloo's FileStore (launcher mode)
  double link_bits_per_second = 0;  // --link-rate: for the wire-time lower bound (0: unknown)
  std::string link_name;            // --link-name: shown in the header (e.g. "1gbit")
  std::string json_path;            // --json FILE: one JSON object per row
  std::string csv_path;             // --csv FILE
  bool help = false;

  // The sizes of the sweep: min, min·f, ..., up to max (bytes, multiples of 4).
  std::vector<std::uint64_t> sizes() const;
};

// Throws onebit::Error(ONEBIT_INVALID_ARGUMENT) naming the bad flag and value.
BenchOptions parse_options(const std::vector<std::string>& args);

// "8", "64K", "1M", "2G" (powers of 1024), as nccl-tests reads them.
std::uint64_t parse_size(const std::string& text, const char* flag);
// "1gbit", "10gbit", "25gbit", "100mbit", or a number of bit/s.
double parse_rate(const std::string& text);

const char* usage();

}  // namespace onebit::bench
