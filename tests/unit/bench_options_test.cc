// onebit-bench's command line: nccl-tests' flags and onebit's own, and clear errors for bad ones.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/error.h"
#include "tools/bench/bench_options.h"

namespace onebit::bench {
namespace {

BenchOptions parse(std::vector<std::string> args) { return parse_options(args); }

std::string error_of(std::vector<std::string> args) {
  try {
    parse_options(args);
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ONEBIT_INVALID_ARGUMENT);
    return error.what();
  }
  ADD_FAILURE() << "expected an error";
  return "";
}

TEST(BenchOptions, NcclTestsFlags) {
  const BenchOptions o = parse({"-b", "8", "-e", "256M", "-f", "2", "-n", "20", "-w", "5", "-c", "1"});
  EXPECT_EQ(o.min_bytes, 8u);
  EXPECT_EQ(o.max_bytes, 256u << 20);
  EXPECT_EQ(o.factor, 2u);
  EXPECT_EQ(o.iters, 20);
  EXPECT_EQ(o.warmup, 5);
  EXPECT_TRUE(o.check);
}

TEST(BenchOptions, WarmupSettlesByDefault) {
  const BenchOptions defaults = parse({});
  EXPECT_EQ(defaults.warmup, 1);
  EXPECT_DOUBLE_EQ(defaults.settle, 0.05);
  EXPECT_EQ(defaults.warmup_max, 20);
  const BenchOptions o = parse({"--settle", "10", "--warmup-max", "7", "-w", "3"});
  EXPECT_DOUBLE_EQ(o.settle, 0.10);
  EXPECT_EQ(o.warmup_max, 7);
  EXPECT_EQ(parse({"--settle", "0", "-w", "50"}).warmup, 50);  // exactly -w calls: the cap does not apply
  EXPECT_NE(error_of({"-w", "30"}).find("-w 30 is more than --warmup-max 20"), std::string::npos);
  EXPECT_NE(error_of({"--settle", "101"}).find("--settle '101' must be an integer in 0..100"), std::string::npos);
  EXPECT_NE(error_of({"--warmup-max", "0"}).find("--warmup-max '0'"), std::string::npos);
}

TEST(BenchOptions, SizesFollowTheFactorUpToTheLargest) {
  EXPECT_EQ(parse({"-b", "1K", "-e", "16K", "-f", "4"}).sizes(), (std::vector<std::uint64_t>{1024, 4096, 16384}));
  EXPECT_EQ(parse({"-b", "1M", "-e", "3M", "-f", "2"}).sizes(), (std::vector<std::uint64_t>{1 << 20, 2 << 20}));
  EXPECT_EQ(parse({"-b", "8", "-e", "8"}).sizes(), (std::vector<std::uint64_t>{8}));
  EXPECT_EQ(parse_size("2G", "-e"), 2ull << 30);
}

TEST(BenchOptions, OnebitFlags) {
  const BenchOptions o =
      parse({"--algo", "compressed,gloo", "--ranks", "4", "--host", "10.0.0.2", "--gloo-store", "/tmp/s", "--link-rate",
             "10gbit", "--link-name", "10gbit", "--json", "r.jsonl", "--csv", "r.csv"});
  EXPECT_EQ(o.algos, (std::vector<std::string>{"compressed", "gloo"}));
  EXPECT_EQ(o.ranks, 4);
  EXPECT_EQ(o.host, "10.0.0.2");
  EXPECT_EQ(o.gloo_store, "/tmp/s");
  EXPECT_EQ(o.link_bits_per_second, 10e9);
  EXPECT_EQ(o.json_path, "r.jsonl");
  EXPECT_EQ(o.csv_path, "r.csv");
  EXPECT_EQ(parse({"--algo", "all"}).algos, (std::vector<std::string>{"compressed", "ring", "gloo"}));
  EXPECT_EQ(parse_rate("1gbit"), 1e9);
  EXPECT_EQ(parse_rate("100mbit"), 1e8);
  EXPECT_EQ(parse_rate("2500000000"), 2.5e9);
  EXPECT_TRUE(parse({"--help"}).help);
  const BenchOptions h = parse({"--algo", "compressed,hierarchical", "--local-size", "2"});
  EXPECT_EQ(h.algos, (std::vector<std::string>{"compressed", "hierarchical"}));
  EXPECT_EQ(h.local_size, 2);
  EXPECT_EQ(parse({}).local_size, 0);  // from ONEBIT_LOCAL_SIZE
}

TEST(BenchOptions, BadInputNamesTheFlagAndValue) {
  EXPECT_NE(error_of({"-b", "12Q"}).find("-b '12Q': unknown suffix 'Q'"), std::string::npos);
  EXPECT_NE(error_of({"-b", "abc"}).find("-b 'abc' is not a size"), std::string::npos);
  EXPECT_NE(error_of({"-b", "64M", "-e", "1M"}).find("-b 67108864 is larger than -e 1048576"), std::string::npos);
  EXPECT_NE(error_of({"-b", "6"}).find("multiples of 4"), std::string::npos);
  EXPECT_NE(error_of({"-n", "0"}).find("-n '0' must be an integer in 1.."), std::string::npos);
  EXPECT_NE(error_of({"-c", "2"}).find("-c '2'"), std::string::npos);
  EXPECT_NE(error_of({"--algo", "nccl"})
                .find("--algo 'nccl' is not compressed, ring, gloo, compressed-gloo, hierarchical or all"),
            std::string::npos);
  EXPECT_NE(error_of({"--ranks", "0"}).find("--ranks '0'"), std::string::npos);
  EXPECT_NE(error_of({"--local-size", "0"}).find("--local-size '0'"), std::string::npos);
  EXPECT_NE(error_of({"--link-rate", "fast"}).find("--link-rate 'fast'"), std::string::npos);
  EXPECT_NE(error_of({"--link-rate", "1tbit"}).find("unknown unit 'tbit'"), std::string::npos);
  EXPECT_NE(error_of({"--frobnicate", "1"}).find("unknown option '--frobnicate'"), std::string::npos);
  EXPECT_NE(error_of({"-n"}).find("-n needs a value"), std::string::npos);
}

}  // namespace
}  // namespace onebit::bench
