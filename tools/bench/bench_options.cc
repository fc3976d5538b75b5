#include "tools/bench/bench_options.h"

#include <cstdlib>

#include "common/error.h"

namespace onebit::bench {

const char* usage() {
  return "usage: onebit-bench [options]\n"
         "  -b SIZE        smallest message (bytes; K/M/G suffixes), default 8M\n"
         "  -e SIZE        largest message, default 256M\n"
         "  -f FACTOR      size multiplier between rows, default 2\n"
         "  -n ITERS       timed iterations per size, default 5\n"
         "  -w ITERS       warm-up iterations per size (at least), default 1\n"
         "  --settle PCT   compressed algorithms keep warming up until a call's time (mean over ranks) is\n"
         "                 within PCT % of the call before, default 5; 0: exactly -w calls\n"
         "  --warmup-max N ... but stop at N warm-up calls in all, default 20\n"
         "  -c 0|1         check every result (float64 reference / exact), default 0\n"
         "  --algo LIST    compressed,ring,gloo or all (comma-separated), default all; also compressed-gloo:\n"
         "                 the compressed allreduce over Gloo's own pairs (the Gloo front door's default);\n"
         "                 hierarchical: fp32 within each host, 1-bit between hosts (needs --local-size)\n"
         "  --local-size L ranks per host (h*L ... h*L+L-1), for hierarchical; default ONEBIT_LOCAL_SIZE\n"
         "  --ranks N      spawn N local ranks on loopback; without it, one rank from the launcher\n"
         "                 environment (ONEBIT_RANK/RANK/OMPI_*/SLURM_*, ONEBIT_ROOT/MASTER_ADDR)\n"
         "  --host ADDR    this rank's address for Gloo's device, default 127.0.0.1\n"
         "  --gloo-store D directory for Gloo's FileStore (launcher mode; shared by all ranks)\n"
         "  --link-rate R  the link's rate (1gbit, 10gbit, 25gbit or bit/s), for the wire-time bound\n"
         "  --link-name S  a label for the link in the output\n"
         "  --json FILE    also write each row as a JSON object (one per line)\n"
         "  --csv FILE     also write each row as CSV\n";
}

std::uint64_t parse_size(const std::string& text, const char* flag) {
  char* end = nullptr;
  const unsigned long long number = std::strtoull(text.c_str(), &end, 10);
  ONEBIT_CHECK(end != text.c_str() && text[0] != '-', ONEBIT_INVALID_ARGUMENT, flag, " '", text,
               "' is not a size (e.g. 1024, 64K, 8M, 1G)");
  std::uint64_t multiplier = 1;
  const std::string suffix = end;
  if (suffix == "K" || suffix == "k") multiplier = 1ull << 10;
  else if (suffix == "M" || suffix == "m") multiplier = 1ull << 20;
  else if (suffix == "G" || suffix == "g") multiplier = 1ull << 30;
  else
    ONEBIT_CHECK(suffix.empty(), ONEBIT_INVALID_ARGUMENT, flag, " '", text, "': unknown suffix '", suffix,
                 "' (K, M or G)");
  return number * multiplier;
}

double parse_rate(const std::string& text) {
  char* end = nullptr;
  const double number = std::strtod(text.c_str(), &end);
  ONEBIT_CHECK(end != text.c_str() && number > 0, ONEBIT_INVALID_ARGUMENT, "--link-rate '", text,
               "' is not a rate (1gbit, 10gbit, 25gbit or bits per second)");
  const std::string suffix = end;
  if (suffix == "gbit") return number * 1e9;
  if (suffix == "mbit") return number * 1e6;
  ONEBIT_CHECK(suffix.empty(), ONEBIT_INVALID_ARGUMENT, "--link-rate '", text, "': unknown unit '", suffix,
               "' (gbit or mbit)");
  return number;
}

namespace {
int parse_int(const std::string& text, const char* flag, int low, int high) {
  char* end = nullptr;
  const long value = std::strtol(text.c_str(), &end, 10);
  ONEBIT_CHECK(end != text.c_str() && *end == '\0' && value >= low && value <= high, ONEBIT_INVALID_ARGUMENT, flag,
               " '", text, "' must be an integer in ", low, "..", high);
  return static_cast<int>(value);
}
}  // namespace

BenchOptions parse_options(const std::vector<std::string>& args) {
  BenchOptions o;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    if (flag == "-h" || flag == "--help") {
      o.help = true;
      continue;
    }
    ONEBIT_CHECK(i + 1 < args.size(), ONEBIT_INVALID_ARGUMENT, flag == "" ? "an empty argument" : flag,
                 flag.rfind("-", 0) == 0 ? " needs a value" : " is not an option (see --help)");
    const std::string& value = args[++i];
    if (flag == "-b") o.min_bytes = parse_size(value, "-b");
    else if (flag == "-e") o.max_bytes = parse_size(value, "-e");
    else if (flag == "-f") o.factor = static_cast<std::uint64_t>(parse_int(value, "-f", 2, 1024));
    else if (flag == "-n") o.iters = parse_int(value, "-n", 1, 1000000);
    else if (flag == "-w") o.warmup = parse_int(value, "-w", 0, 1000000);
    else if (flag == "--settle") o.settle = parse_int(value, "--settle", 0, 100) / 100.0;
    else if (flag == "--warmup-max") o.warmup_max = parse_int(value, "--warmup-max", 1, 1000000);
    else if (flag == "-c") o.check = parse_int(value, "-c", 0, 1) == 1;
    else if (flag == "--ranks") o.ranks = parse_int(value, "--ranks", 1, 64);
    else if (flag == "--local-size") o.local_size = parse_int(value, "--local-size", 1, 64);
    else if (flag == "--host") o.host = value;
    else if (flag == "--gloo-store") o.gloo_store = value;
    else if (flag == "--link-rate") o.link_bits_per_second = parse_rate(value);
    else if (flag == "--link-name") o.link_name = value;
    else if (flag == "--json") o.json_path = value;
    else if (flag == "--csv") o.csv_path = value;
    else if (flag == "--algo") {
      o.algos.clear();
      std::size_t start = 0;
      while (start <= value.size()) {
        const std::size_t comma = value.find(',', start);
        const std::string name = value.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        if (name == "all") {
          o.algos.insert(o.algos.end(), {"compressed", "ring", "gloo"});
        } else {
          ONEBIT_CHECK(name == "compressed" || name == "ring" || name == "gloo" || name == "compressed-gloo" ||
                           name == "hierarchical",
                       ONEBIT_INVALID_ARGUMENT, "--algo '", name,
                       "' is not compressed, ring, gloo, compressed-gloo, hierarchical or all");
          o.algos.push_back(name);
        }
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    } else {
      fail(ONEBIT_INVALID_ARGUMENT, "unknown option '", flag, "' (see --help)");
    }
  }
  ONEBIT_CHECK(o.min_bytes >= 4 && o.min_bytes % 4 == 0 && o.max_bytes % 4 == 0, ONEBIT_INVALID_ARGUMENT, "-b ",
               o.min_bytes, " and -e ", o.max_bytes, " must be multiples of 4 bytes (float32), at least 4");
  ONEBIT_CHECK(o.min_bytes <= o.max_bytes, ONEBIT_INVALID_ARGUMENT, "-b ", o.min_bytes, " is larger than -e ",
               o.max_bytes);
  ONEBIT_CHECK(o.warmup <= o.warmup_max || o.settle == 0, ONEBIT_INVALID_ARGUMENT, "-w ", o.warmup,
               " is more than --warmup-max ", o.warmup_max);
  return o;
}

std::vector<std::uint64_t> BenchOptions::sizes() const {
  std::vector<std::uint64_t> list;
  for (std::uint64_t bytes = min_bytes; bytes <= max_bytes; bytes *= factor) {
    list.push_back(bytes / 4 * 4);
    if (bytes > max_bytes / factor) break;
  }
  return list;
}

}  // namespace onebit::bench
