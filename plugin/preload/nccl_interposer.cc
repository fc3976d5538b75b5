// The NCCL front door: libonebit-nccl-preload.so, loaded with LD_PRELOAD into a program that uses
// NCCL (pip PyTorch loads libnccl.so.2 dynamically), defines ncclAllReduce, ncclGroupStart,
// ncclGroupEnd, ncclCommDestroy and ncclCommAbort ahead of NCCL's. A call on a tagged device buffer
// (the one onebit_tag registry; the PyTorch shim's onebit.tag takes CUDA tensors) with a
// float32/float16/bfloat16 sum or average runs the engine's device path
// (engine/cuda_allreduce.h) on the caller's stream, over the intercepted communicator.
// Everything else goes to NCCL's pncclAllReduce unchanged (transport/nccl/nccl_api.h).
//
// Decisions are made from the tag (name, element count, dtype) and the call's op, never from a
// pointer, so every rank decides alike. Calls inside ncclGroupStart/End are deferred: the group's
// other operations are issued at the outermost ncclGroupEnd, then each deferred compressed call in
// order (PyTorch wraps every collective in a group of its own). A tag's first call on a
// communicator allocates its device state; if that call comes during CUDA graph capture it goes to
// NCCL uncompressed (identically on every rank, as every rank captures the same graph).
//
// Every entry point runs inside nccl_guard (plugin/capi/nccl_guard.h): nothing throws across the
// ABI, and errors become NCCL's codes by the table the NCCL_NET plugin uses too.
//
// Status: built and load-tested here; the compressed path has not run on a GPU yet
// (tools/gpu-check.sh, docs/benchmarks.md).
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "common/params.h"
#include "onebit/preload.h"
#include "plugin/capi/abi_guard.h"
#include "plugin/capi/nccl_guard.h"
#include "engine/cuda_allreduce.h"
#include "engine/tag_registry.h"
#include "transport/nccl/nccl_api.h"

namespace onebit::nccl_front {

// The shared code table (plugin/capi/nccl_guard.h) is written against NCCL's values, checked here
// where nccl.h and the table meet.
static_assert(static_cast<int>(NcclCode::kSystemError) == ncclSystemError);
static_assert(static_cast<int>(NcclCode::kInternalError) == ncclInternalError);
static_assert(static_cast<int>(NcclCode::kInvalidArgument) == ncclInvalidArgument);
static_assert(static_cast<int>(NcclCode::kInvalidUsage) == ncclInvalidUsage);
static_assert(static_cast<int>(NcclCode::kRemoteError) == ncclRemoteError);

namespace {

using nccl::nccl_api;

// An ncclAllReduce call, as the door holds it while a group defers it.
struct AllReduceCall {
  const void* send;
  void* recv;
  std::size_t count;
  ncclDataType_t datatype;
  ncclRedOp_t op;
  ncclComm_t comm;
  cudaStream_t stream;
  std::shared_ptr<Tag> tag;  // null: untagged
  kernels::Dtype dtype = kernels::Dtype::kFloat32;
};

thread_local int group_depth = 0;
thread_local std::vector<AllReduceCall> deferred;

struct Counters {
  std::atomic<std::uint64_t> compressed_calls{0}, compressed_bytes{0}, forwarded_calls{0}, forwarded_bytes{0};
};

Counters& counters() {
  static Counters* instance = new Counters();  // leaked: NCCL's teardown may still call in at exit
  return *instance;
}

// Process-unique ids for live communicators: a tag's device state is keyed by them, and a
// communicator destroyed (or aborted) takes its states with it, so a later communicator at the
// same address starts fresh.
class CommunicatorIds {
 public:
  std::uint64_t id_of(ncclComm_t comm) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto [it, added] = ids_.try_emplace(comm, next_);
    if (added) ++next_;
    return it->second;
  }
  void forget(ncclComm_t comm) {
    std::uint64_t id = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = ids_.find(comm);
      if (it == ids_.end()) return;
      id = it->second;
      ids_.erase(it);
    }
    TagRegistry::instance().forget_communicator(id);
  }

 private:
  std::mutex mutex_;
  std::map<ncclComm_t, std::uint64_t> ids_;
  std::uint64_t next_ = std::uint64_t{1} << 48;  // apart from the CPU engine's communicator ids
};

CommunicatorIds& communicator_ids() {
  static CommunicatorIds* instance = new CommunicatorIds();  // leaked, as counters()
  return *instance;
}

std::size_t element_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
  }
}

bool dtype_of(ncclDataType_t t, kernels::Dtype* dtype) {
  switch (t) {
    case ncclFloat32: *dtype = kernels::Dtype::kFloat32; return true;
    case ncclFloat16: *dtype = kernels::Dtype::kFloat16; return true;
    case ncclBfloat16: *dtype = kernels::Dtype::kBFloat16; return true;
    default: return false;
  }
}

void log_line(bool warning, const std::string& text) {
  if (warning) {
    ONEBIT_LOG(WARN, "nccl preload: ", text);
  } else {
    ONEBIT_LOG(INFO, "nccl preload: ", text);
  }
}

template <typename Body>
ncclResult_t guard(const char* entry_point, Body&& body) {
  return nccl_guard<ncclResult_t>(entry_point, log_line, std::forward<Body>(body));
}

// Whether a call goes through the engine; sets call.dtype when it does. Throws for a bad
// ONEBIT_ENABLE (inside the guard).
bool compresses(AllReduceCall& call) {
  if (param::Enable() == 0 || call.tag == nullptr) return false;
  const Tag& tag = *call.tag;
  auto forward = [&](const char* why) {
    ONEBIT_LOG(INFO, "nccl preload: tag '", tag.name, "' (", call.count, " elements): forwarded to NCCL: ", why);
    return false;
  };
  if (!nccl_api().complete()) return forward("NCCL's pncclSend/Recv/Group*/Comm* entry points were not all found");
  if (!dtype_of(call.datatype, &call.dtype) || call.dtype != tag.dtype) return forward("datatype is not the tag's");
  if (call.count != tag.count) return forward("element count differs from the tag's");
  if (call.op != ncclSum && call.op != ncclAvg) return forward("op is neither ncclSum nor ncclAvg");
  // A tag's first call on a communicator allocates its device state: not while a graph is captured.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(call.stream, &capture) != cudaSuccess) capture = cudaStreamCaptureStatusNone;
  if (capture != cudaStreamCaptureStatusNone &&
      !has_device_state(*call.tag, communicator_ids().id_of(call.comm))) {
    return forward("first call inside CUDA graph capture");
  }
  return true;  // in place or not: the worker reads send, the unpack writes recv
}

// NCCL's own answer goes back unchanged (ncclInProgress of a non-blocking communicator included).
ncclResult_t forward(const AllReduceCall& c) {
  counters().forwarded_calls += 1;
  counters().forwarded_bytes += c.count * element_size(c.datatype);
  const auto all_reduce = nccl_api().all_reduce;
  ONEBIT_CHECK(all_reduce != nullptr, ONEBIT_SYSTEM_ERROR, "NCCL's pncclAllReduce was not found: is libnccl.so.2 loaded?");
  return all_reduce(c.send, c.recv, c.count, c.datatype, c.op, c.comm, c.stream);
}

void run_compressed(const AllReduceCall& call) {
  try {
    const std::uint64_t sent = cuda_compressed_allreduce(
        *call.tag, CudaAllreduceCall{call.send, call.recv, call.count, call.dtype, call.op == ncclSum, call.comm,
                                     communicator_ids().id_of(call.comm), call.stream});
    counters().compressed_calls += 1;
    counters().compressed_bytes += sent;
  } catch (const Error& error) {
    fail(error.code(), "tag '", call.tag->name, "' (", call.count, " elements): compressed allreduce failed: ",
         error.what());
  }
}

// ncclCommDestroy / ncclCommAbort: forget the communicator's tag states, then NCCL's own call.
ncclResult_t end_communicator(const char* entry_point, ncclComm_t comm,
                              ncclResult_t (*nccl::NcclApi::*entry)(ncclComm_t)) {
  ncclResult_t result = ncclSuccess;
  const ncclResult_t guarded = guard(entry_point, [&] {
    communicator_ids().forget(comm);
    const auto call = nccl_api().*entry;
    ONEBIT_CHECK(call != nullptr, ONEBIT_SYSTEM_ERROR, "NCCL's p", entry_point, " was not found");
    result = call(comm);
  });
  return guarded != ncclSuccess ? guarded : result;
}

}  // namespace
}  // namespace onebit::nccl_front

using namespace onebit::nccl_front;

extern "C" {

__attribute__((visibility("default"))) ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                                                  ncclDataType_t datatype, ncclRedOp_t op,
                                                                  ncclComm_t comm, cudaStream_t stream) {
  ncclResult_t result = ncclSuccess;
  const ncclResult_t guarded = guard("ncclAllReduce", [&] {
    AllReduceCall call{sendbuff, recvbuff, count, datatype, op, comm, stream, nullptr};
    call.tag = onebit::TagRegistry::instance().find(recvbuff);
    if (!compresses(call)) {
      result = forward(call);
    } else if (group_depth > 0) {
      deferred.push_back(call);
    } else {
      run_compressed(call);
    }
  });
  return guarded != ncclSuccess ? guarded : result;
}

__attribute__((visibility("default"))) ncclResult_t ncclGroupStart() {
  ncclResult_t result = ncclSuccess;
  const ncclResult_t guarded = guard("ncclGroupStart", [&] {
    const auto group_start = nccl_api().group_start;
    ONEBIT_CHECK(group_start != nullptr, ONEBIT_SYSTEM_ERROR, "NCCL's pncclGroupStart was not found");
    result = group_start();
    if (result == ncclSuccess) ++group_depth;
  });
  return guarded != ncclSuccess ? guarded : result;
}

__attribute__((visibility("default"))) ncclResult_t ncclGroupEnd() {
  ncclResult_t result = ncclSuccess;
  const ncclResult_t guarded = guard("ncclGroupEnd", [&] {
    const auto group_end = nccl_api().group_end;
    ONEBIT_CHECK(group_end != nullptr, ONEBIT_SYSTEM_ERROR, "NCCL's pncclGroupEnd was not found");
    result = group_end();
    if (group_depth > 0) --group_depth;
    if (group_depth > 0) return;
    // The outermost group is issued; now the compressed calls it held, in order. Every one runs
    // (they are independent tags, and their peers run theirs); each failure is logged with its
    // tag, and the first one's code is the group's.
    std::vector<AllReduceCall> calls;
    calls.swap(deferred);
    if (result != ncclSuccess) {
      ONEBIT_LOG(WARN, "nccl preload: ncclGroupEnd: NCCL's group failed (ncclResult ", static_cast<int>(result), "); ",
                 calls.size(), " deferred compressed call(s) not run");
      return;
    }
    for (const AllReduceCall& call : calls) {
      const ncclResult_t r = guard("ncclGroupEnd (deferred ncclAllReduce)", [&] { run_compressed(call); });
      if (result == ncclSuccess) result = r;
    }
  });
  return guarded != ncclSuccess ? guarded : result;
}

// A communicator that goes takes the tags' device state on it with it.
__attribute__((visibility("default"))) ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  return end_communicator("ncclCommDestroy", comm, &onebit::nccl::NcclApi::comm_destroy);
}

__attribute__((visibility("default"))) ncclResult_t ncclCommAbort(ncclComm_t comm) {
  return end_communicator("ncclCommAbort", comm, &onebit::nccl::NcclApi::comm_abort);
}

ONEBIT_API onebit_result_t onebit_preload_stats(onebit_preload_stats_t* stats) {
  return onebit::abi_guard("onebit_preload_stats", [&] {
    ONEBIT_CHECK(stats != nullptr, ONEBIT_INVALID_ARGUMENT, "stats is NULL");
    *stats = onebit_preload_stats_t{};
    Counters& c = counters();
    stats->onebit.compressed_calls = c.compressed_calls;
    stats->onebit.compressed_bytes_sent = c.compressed_bytes;
    stats->onebit.bytes_sent = c.compressed_bytes;
    stats->forwarded_calls = c.forwarded_calls;
    stats->forwarded_bytes = c.forwarded_bytes;
  });
}

}  // extern "C"
