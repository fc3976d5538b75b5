#include "transport/nccl/nccl_api.h"

#include <dlfcn.h>

#include <atomic>
#include <mutex>

#include "common/error.h"
#include "common/log.h"

namespace onebit::transport::nccl {

const NcclApi& nccl_api() {
  static std::mutex mutex;
  static NcclApi table;
  static std::atomic<bool> complete{false};
  if (complete.load(std::memory_order_acquire)) return table;
  std::lock_guard<std::mutex> lock(mutex);
  if (complete.load(std::memory_order_relaxed)) return table;
  // In the global scope when the program linked NCCL; in a local one (dlopen'd by a Python
  // extension) otherwise, where RTLD_NOLOAD finds the copy already loaded.
  void* library = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
  auto find = [&](auto& entry, const char* name) {
    void* f = dlsym(RTLD_NEXT, name);
    if (f == nullptr && library != nullptr) f = dlsym(library, name);
    entry = reinterpret_cast<std::remove_reference_t<decltype(entry)>>(f);
  };
  find(table.all_reduce, "pncclAllReduce");
  find(table.send, "pncclSend");
  find(table.recv, "pncclRecv");
  find(table.group_start, "pncclGroupStart");
  find(table.group_end, "pncclGroupEnd");
  find(table.comm_count, "pncclCommCount");
  find(table.comm_user_rank, "pncclCommUserRank");
  find(table.comm_destroy, "pncclCommDestroy");
  find(table.comm_abort, "pncclCommAbort");
  find(table.group_simulate_end, "pncclGroupSimulateEnd");
  find(table.comm_init_rank_config, "pncclCommInitRankConfig");
  find(table.comm_init_rank_scalable, "pncclCommInitRankScalable");
  find(table.comm_split, "pncclCommSplit");
  find(table.comm_shrink, "pncclCommShrink");
  if (library != nullptr) dlclose(library);  // NOLOAD took a reference; NCCL stays loaded
  if (table.complete()) {
    complete.store(true, std::memory_order_release);
  } else {
    ONEBIT_LOG(INFO, "nccl preload: NCCL's pnccl* entry points not found (yet); is libnccl.so.2 loaded?");
  }
  return table;
}

void check_nccl(ncclResult_t result, const char* what) {
  if (result == ncclSuccess) return;
  onebit_result_t code = ONEBIT_INTERNAL_ERROR;
  switch (result) {
    case ncclInvalidArgument:
    case ncclInvalidUsage: code = ONEBIT_INVALID_ARGUMENT; break;
    case ncclRemoteError: code = ONEBIT_REMOTE_ERROR; break;
    case ncclSystemError:
    case ncclUnhandledCudaError: code = ONEBIT_SYSTEM_ERROR; break;
    default: break;
  }
  fail(code, what, " returned ncclResult ", static_cast<int>(result));
}

}  // namespace onebit::transport::nccl
