// onebit-bench: allreduce bandwidth of onebit's compressed collective, onebit's full-precision ring
// and Gloo's allreduce, side by side (same ranks, same link, sizes interleaved), printed in
// nccl-tests' columns plus onebit's own. See docs/benchmarks/allreduce.md.
//
//   onebit-bench --ranks 4 -b 1M -e 256M -f 4 -c 1            # 4 local ranks on loopback
//   RANK=.. WORLD_SIZE=.. ONEBIT_ROOT=.. onebit-bench --gloo-store DIR --host ADDR ...   # one rank
//
// This file launches the ranks (--ranks N forks them; else one rank from the launcher's variables);
// the benchmark itself is bench.h's Bench: driver.cc, check.cc, report.cc.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "engine/communicator.h"
#include "tools/bench/bench.h"
#include "tools/bench/bench_options.h"
#include "tools/bench/gloo_baseline.h"
#include "transport/tcp/root_listener.h"
#include "transport/tcp/socket.h"

namespace onebit::bench {
namespace {

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
  if (wants(options, "compressed-gloo"))
    over_gloo = std::make_unique<Communicator>(gloo->pairs_transport(), comm.local_size());
  return Bench(options, comm, gloo.get(), over_gloo.get()).run();
}

// --ranks N: fork N ranks on loopback, each its own process, as a launcher would.
int spawn_local(const BenchOptions& options) {
  char store_template[] = "/tmp/onebit-bench-gloo-XXXXXX";
  ONEBIT_CHECK(::mkdtemp(store_template) != nullptr, ONEBIT_SYSTEM_ERROR, "mkdtemp: ", std::strerror(errno));
  const std::string store = store_template;
  // The root's listener opened here, before the fork: rank 0 serves it as it is (root_listener.h),
  // so no other process can take the port in between.
  // No rank checks it, and an answering thread would stay in this parent, taking rank 0's connections.
  const std::string root =
      transport::tcp::open_root_listener(transport::tcp::parse_host_port("127.0.0.1:0", "loopback"),
                                         transport::tcp::RootChecks::kNotAnswered)
          .to_string();
  std::vector<pid_t> children;
  for (int r = 0; r < options.ranks; ++r) {
    const pid_t pid = ::fork();
    ONEBIT_CHECK(pid >= 0, ONEBIT_SYSTEM_ERROR, "fork: ", std::strerror(errno));
    if (pid == 0) {
      int code = 1;
      try {
        if (r != 0) transport::tcp::close_root_listeners();  // rank 0's, inherited
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
  transport::tcp::close_root_listeners();  // rank 0 holds its own copy
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
