// Run with LD_PRELOAD=libonebit-nccl-preload.so (ctest sets it): the NCCL front door in a process
// without a GPU. First without NCCL loaded — calls fail cleanly with ncclSystemError, tagged or
// not, and nothing crashes; then with NCCL's real libnccl.so.2 dlopen'd RTLD_LOCAL, as PyTorch loads
// it — untagged calls reach NCCL's own pncclAllReduce (which refuses a NULL communicator with
// ncclInvalidArgument, proving the call got there), and groups pass through. The compressed path
// needs a GPU: tools/gpu-check.sh.
//
//   nccl_preload_check PATH/TO/libnccl.so.2
#include <dlfcn.h>
#include <nccl.h>

#include <cstdio>
#include <vector>

#include "onebit/preload.h"

using AllReduce = ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
using Group = ncclResult_t (*)();

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  auto* all_reduce = reinterpret_cast<AllReduce>(dlsym(RTLD_DEFAULT, "ncclAllReduce"));
  auto* group_start = reinterpret_cast<Group>(dlsym(RTLD_DEFAULT, "ncclGroupStart"));
  auto* group_end = reinterpret_cast<Group>(dlsym(RTLD_DEFAULT, "ncclGroupEnd"));
  auto* stats = reinterpret_cast<onebit_result_t (*)(onebit_preload_stats_t*)>(dlsym(RTLD_DEFAULT, "onebit_preload_stats"));
  auto* tag = reinterpret_cast<onebit_result_t (*)(const char*, void*, size_t, onebit_dtype_t)>(dlsym(RTLD_DEFAULT, "onebit_tag"));
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
                static_cast<unsigned long long>(s.forwarded_calls), static_cast<unsigned long long>(s.onebit.compressed_calls));
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
    std::printf("FAIL: an untagged call with a NULL communicator must reach NCCL, which says ncclInvalidArgument; got %d\n",
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
  std::printf("OK: without NCCL calls fail with ncclSystemError; with NCCL loaded RTLD_LOCAL untagged calls reach "
              "pncclAllReduce (ncclResult %d for a NULL comm), a tagged call fails cleanly (%d), groups pass through\n",
              static_cast<int>(r), static_cast<int>(tagged));
  return 0;
}
