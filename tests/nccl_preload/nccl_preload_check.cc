// Run with LD_PRELOAD=libonebit-nccl-preload.so (ctest sets it): the NCCL front door in a process
// without a GPU. First without NCCL loaded — calls fail cleanly with ncclSystemError, tagged or
// not, and nothing crashes; then with NCCL's real libnccl.so.2 dlopen'd RTLD_LOCAL, as PyTorch loads
// it — untagged calls reach NCCL's own pncclAllReduce (which refuses a NULL communicator with
// ncclInvalidArgument, proving the call got there), and groups pass through. The compressed path
// needs a GPU: tools/gpu-check.sh.
//
// Also: calls deferred by a group each run and each failure is logged with its tag (D4), the
// communicator calls the door interposes reach NCCL, and — with the argument `bad-enable` and
// ONEBIT_ENABLE=banana — a bad setting is an error code with a message, not an exception through
// the C ABI (D2).
//
// With `non-blocking` and NCCL_COMM_BLOCKING=0: tagged calls on a non-blocking communicator go to
// NCCL uncompressed.
//
//   nccl_preload_check PATH/TO/libnccl.so.2 [bad-enable | non-blocking]
#include <dlfcn.h>
#include <nccl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "onebit/preload.h"

using AllReduce = ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
using Group = ncclResult_t (*)();

// Runs `body` with this process's stderr (where onebit logs) going to a file; returns what it wrote.
template <typename Body>
std::string captured_stderr(Body&& body) {
  std::fflush(stderr);
  std::FILE* file = std::tmpfile();
  const int saved = ::dup(2);
  ::dup2(fileno(file), 2);
  body();
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  std::string text;
  std::rewind(file);
  char chunk[4096];
  for (std::size_t got; (got = std::fread(chunk, 1, sizeof(chunk), file)) > 0;) text.append(chunk, got);
  std::fclose(file);
  std::fputs(text.c_str(), stderr);
  return text;
}

int bad_enable() {
  auto* all_reduce = reinterpret_cast<AllReduce>(dlsym(RTLD_DEFAULT, "ncclAllReduce"));
  auto* tag = reinterpret_cast<onebit_result_t (*)(const char*, void*, size_t, onebit_dtype_t)>(
      dlsym(RTLD_DEFAULT, "onebit_tag"));
  if (!all_reduce || !tag) return 3;
  std::vector<float> host(100);
  if (tag("grad", host.data(), host.size(), ONEBIT_FLOAT32) != ONEBIT_SUCCESS) return 4;
  ncclResult_t r = ncclSuccess;
  const std::string log =
      captured_stderr([&] { r = all_reduce(host.data(), host.data(), 100, ncclFloat32, ncclSum, nullptr, nullptr); });
  if (r != ncclInvalidArgument || log.find("ONEBIT_ENABLE") == std::string::npos) {
    std::printf("FAIL: ONEBIT_ENABLE=banana must give ncclInvalidArgument and a message naming it; got %d\n",
                static_cast<int>(r));
    return 5;
  }
  std::printf("OK: a bad ONEBIT_ENABLE is ncclInvalidArgument with a message, not an exception\n");
  return 0;
}

// With NCCL_COMM_BLOCKING=0 every communicator is non-blocking: a tagged call goes to NCCL's own
// allreduce (which answers a NULL communicator with ncclInvalidArgument), counted as forwarded.
int non_blocking(const char* nccl_path) {
  auto* all_reduce = reinterpret_cast<AllReduce>(dlsym(RTLD_DEFAULT, "ncclAllReduce"));
  auto* tag = reinterpret_cast<onebit_result_t (*)(const char*, void*, size_t, onebit_dtype_t)>(
      dlsym(RTLD_DEFAULT, "onebit_tag"));
  auto* stats =
      reinterpret_cast<onebit_result_t (*)(onebit_preload_stats_t*)>(dlsym(RTLD_DEFAULT, "onebit_preload_stats"));
  if (!all_reduce || !tag || !stats || dlopen(nccl_path, RTLD_NOW | RTLD_LOCAL) == nullptr) return 3;
  std::vector<float> host(100);
  if (tag("grad", host.data(), host.size(), ONEBIT_FLOAT32) != ONEBIT_SUCCESS) return 4;
  const ncclResult_t r = all_reduce(host.data(), host.data(), 100, ncclFloat32, ncclSum, nullptr, nullptr);
  onebit_preload_stats_t s;
  if (r != ncclInvalidArgument || stats(&s) != ONEBIT_SUCCESS || s.forwarded_calls != 1) {
    std::printf("FAIL: NCCL_COMM_BLOCKING=0: a tagged call must go to NCCL uncompressed; got %d, forwarded %llu\n",
                static_cast<int>(r), static_cast<unsigned long long>(s.forwarded_calls));
    return 5;
  }
  std::printf("OK: on a non-blocking communicator a tagged call goes to NCCL uncompressed\n");
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[2], "bad-enable") == 0) return bad_enable();
  if (argc == 3 && std::strcmp(argv[2], "non-blocking") == 0) return non_blocking(argv[1]);
  if (argc != 2) return 2;
  auto* all_reduce = reinterpret_cast<AllReduce>(dlsym(RTLD_DEFAULT, "ncclAllReduce"));
  auto* group_start = reinterpret_cast<Group>(dlsym(RTLD_DEFAULT, "ncclGroupStart"));
  auto* group_end = reinterpret_cast<Group>(dlsym(RTLD_DEFAULT, "ncclGroupEnd"));
  auto* stats =
      reinterpret_cast<onebit_result_t (*)(onebit_preload_stats_t*)>(dlsym(RTLD_DEFAULT, "onebit_preload_stats"));
  auto* tag = reinterpret_cast<onebit_result_t (*)(const char*, void*, size_t, onebit_dtype_t)>(
      dlsym(RTLD_DEFAULT, "onebit_tag"));
  if (!all_reduce || !group_start || !group_end || !stats || !tag) {
    std::printf("FAIL: the preload's symbols are missing (is LD_PRELOAD set?)\n");
    return 3;
  }
  std::vector<float> host(100);
  if (tag("grad", host.data(), host.size(), ONEBIT_FLOAT32) != ONEBIT_SUCCESS) return 4;
  // 1. No NCCL in the process.
  if (all_reduce(host.data(), host.data(), 100, ncclFloat32, ncclSum, nullptr, nullptr) != ncclSystemError) {
    std::printf("FAIL: a tagged call without NCCL must fail with ncclSystemError\n");
    return 5;
  }
  std::vector<float> other(10);
  if (all_reduce(other.data(), other.data(), 10, ncclFloat32, ncclSum, nullptr, nullptr) != ncclSystemError) return 6;
  onebit_preload_stats_t s;
  if (stats(&s) != ONEBIT_SUCCESS || s.forwarded_calls != 2 || s.onebit.compressed_calls != 0) {
    std::printf("FAIL: stats after two forwarded calls: forwarded %llu, compressed %llu\n",
                static_cast<unsigned long long>(s.forwarded_calls),
                static_cast<unsigned long long>(s.onebit.compressed_calls));
    return 7;
  }
  // 2. NCCL loaded the way PyTorch loads it.
  void* nccl = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (nccl == nullptr) {
    std::printf("FAIL: dlopen %s: %s\n", argv[1], dlerror());
    return 8;
  }
  const ncclResult_t r = all_reduce(other.data(), other.data(), 10, ncclFloat32, ncclSum, nullptr, nullptr);
  if (r != ncclInvalidArgument) {
    std::printf(
        "FAIL: an untagged call with a NULL communicator must reach NCCL, which says ncclInvalidArgument; got %d\n",
        static_cast<int>(r));
    return 9;
  }
  // The tagged buffer with a NULL communicator: compression needs the communicator's rank, which
  // NCCL refuses to give; the call fails cleanly rather than crashing.
  const ncclResult_t tagged = all_reduce(host.data(), host.data(), 100, ncclFloat32, ncclSum, nullptr, nullptr);
  if (tagged == ncclSuccess) return 10;
  if (group_start() != ncclSuccess || group_end() != ncclSuccess) {
    std::printf("FAIL: an empty group must pass through\n");
    return 11;
  }
  if (stats(&s) != ONEBIT_SUCCESS || s.forwarded_calls != 3) return 12;
  // Two tagged calls deferred by a group: both run at its end, both failures are logged with their
  // tags (the communicator is NULL), and the group returns the first failure's code.
  std::vector<float> second(100);
  if (tag("grad2", second.data(), second.size(), ONEBIT_FLOAT32) != ONEBIT_SUCCESS) return 13;
  ncclResult_t grouped = ncclSuccess, queued1 = ncclInternalError, queued2 = ncclInternalError;
  const std::string log = captured_stderr([&] {
    group_start();
    queued1 = all_reduce(host.data(), host.data(), 100, ncclFloat32, ncclSum, nullptr, nullptr);
    queued2 = all_reduce(second.data(), second.data(), 100, ncclFloat32, ncclSum, nullptr, nullptr);
    grouped = group_end();
  });
  if (queued1 != ncclSuccess || queued2 != ncclSuccess || grouped == ncclSuccess ||
      log.find("tag 'grad'") == std::string::npos || log.find("tag 'grad2'") == std::string::npos) {
    std::printf("FAIL: deferred calls: queued %d %d, group end %d; both tags must be named in the log\n",
                static_cast<int>(queued1), static_cast<int>(queued2), static_cast<int>(grouped));
    return 14;
  }
  // The communicator calls reach NCCL's own (which answer a NULL communicator as they do).
  using CommCall = ncclResult_t (*)(ncclComm_t);
  auto* destroy = reinterpret_cast<CommCall>(dlsym(RTLD_DEFAULT, "ncclCommDestroy"));
  auto* real_destroy = reinterpret_cast<CommCall>(dlsym(nccl, "pncclCommDestroy"));
  auto* abort_comm = reinterpret_cast<CommCall>(dlsym(RTLD_DEFAULT, "ncclCommAbort"));
  auto* real_abort = reinterpret_cast<CommCall>(dlsym(nccl, "pncclCommAbort"));
  if (!destroy || !real_destroy || !abort_comm || !real_abort || destroy(nullptr) != real_destroy(nullptr) ||
      abort_comm(nullptr) != real_abort(nullptr)) {
    std::printf("FAIL: ncclCommDestroy/ncclCommAbort must reach NCCL's pncclCommDestroy/pncclCommAbort\n");
    return 15;
  }
  // A simulated group runs nothing: the door's depth goes back with it, so the next tagged call
  // runs at once (and fails: NULL communicator) instead of being deferred and answered ncclSuccess.
  auto* simulate_end = reinterpret_cast<ncclResult_t (*)(ncclSimInfo_t*)>(dlsym(RTLD_DEFAULT, "ncclGroupSimulateEnd"));
  if (simulate_end == nullptr) return 16;
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  group_start();
  const ncclResult_t simulated_queue =
      all_reduce(host.data(), host.data(), 100, ncclFloat32, ncclSum, nullptr, nullptr);
  simulate_end(&sim);
  const ncclResult_t after_simulation =
      all_reduce(host.data(), host.data(), 100, ncclFloat32, ncclSum, nullptr, nullptr);
  if (simulated_queue != ncclSuccess || after_simulation == ncclSuccess) {
    std::printf(
        "FAIL: after ncclGroupStart + tagged call + ncclGroupSimulateEnd a tagged call must run at once (and "
        "fail on a NULL communicator); got %d (queued %d)\n",
        static_cast<int>(after_simulation), static_cast<int>(simulated_queue));
    return 17;
  }
  // The config-taking inits reach NCCL's own, whose answers must be the same. With 0 ranks both
  // refuse at once: on a GPU, a call that looked valid would start NCCL's background init of a
  // non-blocking communicator, still running when this check returns.
  using InitConfig = ncclResult_t (*)(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*);
  auto* init_config = reinterpret_cast<InitConfig>(dlsym(RTLD_DEFAULT, "ncclCommInitRankConfig"));
  auto* real_init_config = reinterpret_cast<InitConfig>(dlsym(nccl, "pncclCommInitRankConfig"));
  ncclUniqueId id{};
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t made = nullptr, real_made = nullptr;
  if (!init_config || !real_init_config ||
      init_config(&made, 0, id, 0, &config) != real_init_config(&real_made, 0, id, 0, &config)) {
    std::printf("FAIL: ncclCommInitRankConfig must reach NCCL's pncclCommInitRankConfig\n");
    return 18;
  }
  std::printf(
      "OK: without NCCL calls fail with ncclSystemError; with NCCL loaded RTLD_LOCAL untagged calls reach "
      "pncclAllReduce (ncclResult %d for a NULL comm), a tagged call fails cleanly (%d), groups pass through, "
      "every deferred call runs and is named when it fails (group end %d), communicator calls reach NCCL, a "
      "simulated group leaves no call deferred\n",
      static_cast<int>(r), static_cast<int>(tagged), static_cast<int>(grouped));
  return 0;
}
