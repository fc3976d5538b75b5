// The NCCL front door: libonebit-nccl-preload.so, loaded with LD_PRELOAD into a program that uses
// NCCL (pip PyTorch loads libnccl.so.2 dynamically), defines ncclAllReduce, the group calls
// (ncclGroupStart, ncclGroupEnd, ncclGroupSimulateEnd), the communicator ends (ncclCommDestroy,
// ncclCommAbort) and the config-taking inits and splits (ncclCommInitRankConfig,
// ncclCommInitRankScalable, ncclCommSplit, ncclCommShrink) ahead of NCCL's. A call on a tagged
// device buffer (the one onebit_tag registry; the PyTorch shim's onebit.tag takes CUDA tensors)
// with a float32/float16/bfloat16 sum or average, on a blocking communicator, runs the engine's
// device path (engine/cuda_allreduce.h) on the caller's stream, over the intercepted communicator.
// Everything else goes to NCCL's pncclAllReduce unchanged (transport/nccl/nccl_api.h).
//
// Decisions are made from the tag (name, element count, dtype), the call's op and the
// communicator's config, never from a pointer, so every rank decides alike. Calls inside a group
// are deferred: the group's other operations are issued at the outermost ncclGroupEnd, then each
// deferred compressed call in order. (Recent ProcessGroupNCCL does not wrap every collective in a
// group: groups come from coalescing, batched point-to-point calls and lazy communicator set-up;
// a collective outside them reaches the door ungrouped.) A simulated group runs nothing, in NCCL
// or here. Non-blocking communicators (config.blocking = 0, NCCL_COMM_BLOCKING=0,
// TORCH_NCCL_USE_COMM_NONBLOCKING=1) keep NCCL's own allreduce: the device path could be left
// half queued by an ncclInProgress. A tag's first call on a communicator allocates its device
// state; if that call comes during CUDA graph capture it goes to NCCL uncompressed (identically on
// every rank, as every rank captures the same graph). Later captured calls are compressed, and
// their replays build on each other: the device state's parity lives on the device.
//
// Every entry point runs inside nccl_guard (plugin/capi/nccl_guard.h): nothing throws across the
// ABI, and errors become NCCL's codes by the table the NCCL_NET plugin uses too.
//
// Status: built and load-tested here, and run over stand-ins for CUDA and NCCL (tests/cuda_on_cpu,
// ranks as threads); it has not run on a GPU yet (tools/gpu-check.sh, docs/benchmarks/hardware.md).
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "common/error.h"
#include "common/launcher.h"
#include "common/log.h"
#include "common/params.h"
#include "engine/cuda_allreduce.h"
#include "engine/tag_registry.h"
#include "onebit/preload.h"
#include "plugin/capi/abi_guard.h"
#include "plugin/capi/nccl_guard.h"
#include "plugin/preload/communicator_table.h"
#include "transport/nccl/nccl_api.h"

namespace onebit::front::nccl {

// The shared code table (plugin/capi/nccl_guard.h) is written against NCCL's values, checked here
// where nccl.h and the table meet.
static_assert(static_cast<int>(NcclCode::kSystemError) == ncclSystemError);
static_assert(static_cast<int>(NcclCode::kInternalError) == ncclInternalError);
static_assert(static_cast<int>(NcclCode::kInvalidArgument) == ncclInvalidArgument);
static_assert(static_cast<int>(NcclCode::kInvalidUsage) == ncclInvalidUsage);
static_assert(static_cast<int>(NcclCode::kRemoteError) == ncclRemoteError);

namespace {

using transport::nccl::nccl_api;

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
  bool captured = false;  // the stream is capturing a CUDA graph
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

CommunicatorTable& communicators() {
  static CommunicatorTable* instance = new CommunicatorTable();  // leaked, as counters()
  return *instance;
}

// NCCL's default for a communicator the door did not see made: blocking unless NCCL_COMM_BLOCKING=0.
bool unseen_blocking() { return nccl_comm_blocking() != 0; }

// What the engine asks once it holds a call's tag (CudaAllreduceCall::live).
bool communicator_live(ncclComm_t comm, std::uint64_t id) { return communicators().live(comm, id); }

// Whether NCCL runs a communicator made with `config` blocking. NCCL_COMM_BLOCKING (0 or 1)
// overrides every config; a NULL config is NCCL's default — or, for a split or shrink, the parent's
// (`parent`, when given); a config older than NCCL 2.14 has no `blocking`; NCCL_CONFIG_UNDEF_INT
// means the default, blocking.
bool blocking_of(const ncclConfig_t* config, ncclComm_t parent) {
  const int forced = nccl_comm_blocking();
  if (forced >= 0) return forced == 1;
  if (config == nullptr) return parent == nullptr || communicators().blocking(parent, unseen_blocking());
  if (config->version < NCCL_VERSION(2, 14, 0)) return true;
  return config->blocking != 0;
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
  // The device path enqueues NCCL sends and receives and its kernels in one go; on a communicator
  // where NCCL may answer ncclInProgress they could be left half queued. Such communicators keep
  // NCCL's own allreduce (TORCH_NCCL_USE_COMM_NONBLOCKING=1, NCCL_COMM_BLOCKING=0).
  if (!communicators().blocking(call.comm, unseen_blocking())) return forward("the communicator is non-blocking");
  // A tag's first call on a communicator allocates (and synchronises): not while a graph is captured.
  // The legacy stream while another stream captures in global mode (CUDA cannot say whether it is
  // capturing) is NCCL's to handle. Any other error (no device) is the device path's to report. The
  // error is cleared either way, not left for the framework's next launch check.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  const cudaError_t asked = cudaStreamIsCapturing(call.stream, &capture);
  if (asked != cudaSuccess) {
    (void)cudaGetLastError();
    if (asked == cudaErrorStreamCaptureImplicit) return forward("the legacy stream, while another stream captures");
    capture = cudaStreamCaptureStatusNone;
  }
  call.captured = capture != cudaStreamCaptureStatusNone;
  if (call.captured && !has_device_state(*call.tag, communicators().id_of(call.comm, unseen_blocking()))) {
    return forward("first call inside CUDA graph capture");
  }
  return true;  // in place or not: the worker reads send, the unpack writes recv
}

// NCCL's own answer goes back unchanged (ncclInProgress of a non-blocking communicator included).
ncclResult_t forward(const AllReduceCall& c) {
  counters().forwarded_calls += 1;
  counters().forwarded_bytes += c.count * transport::nccl::element_bytes(c.datatype);
  const auto all_reduce = nccl_api().all_reduce;
  ONEBIT_CHECK(all_reduce != nullptr, ONEBIT_SYSTEM_ERROR,
               "NCCL's pncclAllReduce was not found: is libnccl.so.2 loaded?");
  return all_reduce(c.send, c.recv, c.count, c.datatype, c.op, c.comm, c.stream);
}

void run_compressed(const AllReduceCall& call) {
  try {
    const std::uint64_t sent = cuda_compressed_allreduce(
        *call.tag, CudaAllreduceCall{call.send, call.recv, call.count, call.dtype, call.op == ncclSum, call.comm,
                                     communicators().id_of(call.comm, unseen_blocking()), call.stream, call.captured,
                                     &communicator_live});
    counters().compressed_calls += 1;
    counters().compressed_bytes += sent;
  } catch (const Error& error) {
    fail(error.code(), "tag '", call.tag->name, "' (", call.count,
         " elements): compressed allreduce failed: ", error.what());
  }
}

// ncclCommDestroy / ncclCommAbort. The communicator is marked ending first (a call that starts on it
// now is refused: CommunicatorTable says why), then NCCL's own call, then the address forgotten (a
// communicator NCCL makes there next starts fresh) and the tags' states on it dropped — after
// NCCL, and for an abort without waiting on a tag whose call is running: the watchdog aborts a
// stuck communicator, and the call holding that tag may be the stuck one. Where NCCL's call fails
// the communicator lives on (a destroy that failed is followed by an abort): nothing is dropped.
ncclResult_t end_communicator(const char* entry_point, ncclComm_t comm,
                              ncclResult_t (*transport::nccl::NcclApi::*entry)(ncclComm_t),
                              TagRegistry::InFlight in_flight) {
  ncclResult_t result = ncclSuccess;
  const ncclResult_t guarded = guard(entry_point, [&] {
    const auto call = nccl_api().*entry;
    ONEBIT_CHECK(call != nullptr, ONEBIT_SYSTEM_ERROR, "NCCL's p", entry_point, " was not found");
    const CommunicatorTable::Ending ending = communicators().begin_end(comm, unseen_blocking());
    result = call(comm);
    if (result != ncclSuccess && result != ncclInProgress) {  // NCCL kept it: its states and all stay
      communicators().cancel_end(comm, ending);
      return;
    }
    communicators().finish_end(comm, ending);
    if (ending.seen) TagRegistry::instance().forget_communicator(ending.id, in_flight);
  });
  return guarded != ncclSuccess ? guarded : result;
}

// Communicators made by the interposed inits and splits: NCCL's answer unchanged, and, unless it
// is an error, the new communicator recorded with how it blocks (ncclInProgress: a non-blocking
// one, still being made).
template <typename Call>
ncclResult_t make_communicator(const char* entry_point, ncclComm_t* made, const ncclConfig_t* config, ncclComm_t parent,
                               Call&& call) {
  ncclResult_t result = ncclSuccess;
  const ncclResult_t guarded = guard(entry_point, [&] {
    result = call();
    if ((result == ncclSuccess || result == ncclInProgress) && made != nullptr) {
      const bool blocking = blocking_of(config, parent);
      communicators().made(*made, blocking);
      if (!blocking) {
        ONEBIT_LOG(INFO, "nccl preload: ", entry_point, ": communicator ", *made,
                   " is non-blocking; its tagged "
                   "allreduces go to NCCL uncompressed");
      }
    }
  });
  return guarded != ncclSuccess ? guarded : result;
}

// The compressed calls a group deferred, once NCCL has issued the group's own: every one runs (they
// are independent tags, and their peers run theirs), each failure logged with its tag, and the
// first one's code is the group's. After a failed group they are not run; a group that answers
// ncclInProgress (a non-blocking communicator in it) still runs them — never drop work while
// answering in-progress — and its answer stands unless one of them fails.
ncclResult_t run_deferred(std::vector<AllReduceCall> calls, ncclResult_t group_result) {
  if (group_result != ncclSuccess && group_result != ncclInProgress) {
    ONEBIT_LOG(WARN, "nccl preload: ncclGroupEnd: NCCL's group failed (ncclResult ", static_cast<int>(group_result),
               "); ", calls.size(), " deferred compressed call(s) not run");
    return group_result;
  }
  ncclResult_t result = group_result;
  bool failed = false;
  for (const AllReduceCall& call : calls) {
    const ncclResult_t r = guard("ncclGroupEnd (deferred ncclAllReduce)", [&] { run_compressed(call); });
    if (r != ncclSuccess && !failed) {
      result = r;
      failed = true;
    }
  }
  return result;
}

}  // namespace
}  // namespace onebit::front::nccl

using namespace onebit::front::nccl;

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
    std::vector<AllReduceCall> calls;
    calls.swap(deferred);
    result = run_deferred(std::move(calls), result);
  });
  return guarded != ncclSuccess ? guarded : result;
}

// Ends a group as ncclGroupEnd does, but NCCL only estimates it (ncclSimInfo_t) and runs nothing;
// so the door runs nothing either: the depth goes back, the deferred calls are dropped (named in
// an INFO line). Without this, the door's depth would stay raised and every later tagged call on
// the thread would be deferred and answered ncclSuccess with its buffer untouched.
__attribute__((visibility("default"))) ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* sim_info) {
  ncclResult_t result = ncclSuccess;
  const ncclResult_t guarded = guard("ncclGroupSimulateEnd", [&] {
    const auto simulate_end = nccl_api().group_simulate_end;
    ONEBIT_CHECK(simulate_end != nullptr, ONEBIT_SYSTEM_ERROR, "NCCL's pncclGroupSimulateEnd was not found");
    result = simulate_end(sim_info);
    if (group_depth > 0) --group_depth;
    if (group_depth > 0) return;
    for (const AllReduceCall& call : deferred) {
      ONEBIT_LOG(INFO, "nccl preload: ncclGroupSimulateEnd: tag '", call.tag->name, "' (", call.count,
                 " elements) was in a simulated group: not run, as NCCL runs none of the group");
    }
    deferred.clear();
  });
  return guarded != ncclSuccess ? guarded : result;
}

// A communicator that goes takes the tags' device state on it with it.
__attribute__((visibility("default"))) ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  return end_communicator("ncclCommDestroy", comm, &onebit::transport::nccl::NcclApi::comm_destroy,
                          onebit::TagRegistry::InFlight::kWait);
}

__attribute__((visibility("default"))) ncclResult_t ncclCommAbort(ncclComm_t comm) {
  return end_communicator("ncclCommAbort", comm, &onebit::transport::nccl::NcclApi::comm_abort,
                          onebit::TagRegistry::InFlight::kKeep);
}

// The inits and splits that take a config, passed through to learn whether each new communicator
// is non-blocking (PyTorch makes its communicators with ncclCommInitRankConfig and ncclCommSplit).
__attribute__((visibility("default"))) ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks,
                                                                           ncclUniqueId id, int rank,
                                                                           ncclConfig_t* config) {
  return make_communicator("ncclCommInitRankConfig", comm, config, nullptr, [&] {
    const auto init = nccl_api().comm_init_rank_config;
    ONEBIT_CHECK(init != nullptr, ONEBIT_SYSTEM_ERROR, "NCCL's pncclCommInitRankConfig was not found");
    return init(comm, nranks, id, rank, config);
  });
}

__attribute__((visibility("default"))) ncclResult_t ncclCommInitRankScalable(ncclComm_t* comm, int nranks, int rank,
                                                                             int n_ids, ncclUniqueId* ids,
                                                                             ncclConfig_t* config) {
  return make_communicator("ncclCommInitRankScalable", comm, config, nullptr, [&] {
    const auto init = nccl_api().comm_init_rank_scalable;
    ONEBIT_CHECK(init != nullptr, ONEBIT_SYSTEM_ERROR, "NCCL's pncclCommInitRankScalable was not found");
    return init(comm, nranks, rank, n_ids, ids, config);
  });
}

__attribute__((visibility("default"))) ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key,
                                                                  ncclComm_t* newcomm, ncclConfig_t* config) {
  return make_communicator("ncclCommSplit", newcomm, config, comm, [&] {
    const auto split = nccl_api().comm_split;
    ONEBIT_CHECK(split != nullptr, ONEBIT_SYSTEM_ERROR, "NCCL's pncclCommSplit was not found");
    return split(comm, color, key, newcomm, config);
  });
}

__attribute__((visibility("default"))) ncclResult_t ncclCommShrink(ncclComm_t comm, int* exclude, int n_exclude,
                                                                   ncclComm_t* newcomm, ncclConfig_t* config,
                                                                   int flags) {
  return make_communicator("ncclCommShrink", newcomm, config, comm, [&] {
    const auto shrink = nccl_api().comm_shrink;
    ONEBIT_CHECK(shrink != nullptr, ONEBIT_SYSTEM_ERROR, "NCCL's pncclCommShrink was not found");
    return shrink(comm, exclude, n_exclude, newcomm, config, flags);
  });
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
