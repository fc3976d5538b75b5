// The NCCL front door: libonebit-nccl-preload.so, loaded with LD_PRELOAD into a program that uses
// NCCL (pip PyTorch loads libnccl.so.2 dynamically), defines ncclAllReduce, ncclGroupStart and
// ncclGroupEnd ahead of NCCL's. A call on a tagged device buffer (same onebit_tag registry; the
// PyTorch shim's onebit.tag takes CUDA tensors) with a float32/float16/bfloat16 sum or average runs
// the compressed collective of algorithm.md on the caller's stream, over the intercepted
// communicator itself:
//
//   worker kernel → group of pncclSend/pncclRecv: every rank's bits of chunk j and its scale to
//   rank j → server kernel → group: every server's bits and scale to every rank → unpack kernel
//
// Everything else goes to pncclAllReduce unchanged. NCCL's own entry points (the strong pnccl*
// twins) are looked up in the libnccl.so.2 the process already loaded, so this library loads, and
// does nothing, in a process without NCCL or without a GPU.
//
// Decisions are made from the tag (name, element count, dtype) and the call's op, never from a
// pointer, so every rank decides alike. Calls inside ncclGroupStart/End are deferred: the group's
// other operations are issued at the outermost ncclGroupEnd, then each deferred compressed call in
// order (PyTorch wraps every collective in a group of its own). No host synchronisation and no
// allocation after a tag's first call on a communicator, so captured CUDA graphs work once a tag
// has run outside capture; a first call during capture goes to NCCL uncompressed (identically on
// every rank, as every rank captures the same graph).
//
// Status: built and load-tested here; the compressed path has not run on a GPU yet
// (tools/gpu-check.sh, docs/benchmarks.md).
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "common/params.h"
#include "kernels/cuda/cuda_kernels.h"
#include "onebit/preload.h"
#include "plugin/capi/abi_guard.h"
#include "plugin/engine/tag_registry.h"

namespace onebit::nccl_front {
namespace {

// NCCL's own entry points.
struct Nccl {
  decltype(&pncclAllReduce) all_reduce = nullptr;
  decltype(&pncclSend) send = nullptr;
  decltype(&pncclRecv) recv = nullptr;
  decltype(&pncclGroupStart) group_start = nullptr;
  decltype(&pncclGroupEnd) group_end = nullptr;
  decltype(&pncclCommCount) comm_count = nullptr;
  decltype(&pncclCommUserRank) comm_user_rank = nullptr;
  decltype(&pncclCommCuDevice) comm_cu_device = nullptr;
};

// Looked up until found: a program may call in before it has loaded NCCL (then every call fails
// with ncclSystemError), and succeed once it has.
const Nccl& nccl() {
  static std::mutex mutex;
  static Nccl table;
  static std::atomic<bool> complete{false};
  if (complete.load(std::memory_order_acquire)) return table;
  std::lock_guard<std::mutex> lock(mutex);
  if (complete.load(std::memory_order_relaxed)) return table;
  table = [] {
    Nccl t;
    // In the global scope when the program linked NCCL; in a local one (dlopen'd by a Python
    // extension) otherwise, where RTLD_NOLOAD finds the copy already loaded.
    void* library = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
    auto find = [&](const char* name) {
      void* f = dlsym(RTLD_NEXT, name);
      if (f == nullptr && library != nullptr) f = dlsym(library, name);
      return f;
    };
    t.all_reduce = reinterpret_cast<decltype(t.all_reduce)>(find("pncclAllReduce"));
    t.send = reinterpret_cast<decltype(t.send)>(find("pncclSend"));
    t.recv = reinterpret_cast<decltype(t.recv)>(find("pncclRecv"));
    t.group_start = reinterpret_cast<decltype(t.group_start)>(find("pncclGroupStart"));
    t.group_end = reinterpret_cast<decltype(t.group_end)>(find("pncclGroupEnd"));
    t.comm_count = reinterpret_cast<decltype(t.comm_count)>(find("pncclCommCount"));
    t.comm_user_rank = reinterpret_cast<decltype(t.comm_user_rank)>(find("pncclCommUserRank"));
    t.comm_cu_device = reinterpret_cast<decltype(t.comm_cu_device)>(find("pncclCommCuDevice"));
    if (library != nullptr) dlclose(library);  // NOLOAD took a reference; NCCL stays loaded
    return t;
  }();
  if (table.all_reduce != nullptr && table.send != nullptr && table.recv != nullptr && table.group_start != nullptr &&
      table.group_end != nullptr && table.comm_count != nullptr && table.comm_user_rank != nullptr) {
    complete.store(true, std::memory_order_release);
  } else {
    ONEBIT_LOG(INFO, "nccl preload: NCCL's pnccl* entry points not found (yet); is libnccl.so.2 loaded?");
  }
  return table;
}

// A compressed call waiting for the outermost ncclGroupEnd.
struct Deferred {
  const void* send;
  void* recv;
  std::size_t count;
  ncclDataType_t datatype;
  ncclRedOp_t op;
  ncclComm_t comm;
  cudaStream_t stream;
  std::shared_ptr<Tag> tag;
};

thread_local int group_depth = 0;
thread_local std::vector<Deferred> deferred;

// One tag's device state on one communicator, sized at its first call.
struct DeviceState {
  int rank = 0, size = 1;
  std::size_t n = 0, chunk = 0, chunk_bytes = 0;
  float* worker[2] = {nullptr, nullptr};  // stored values, double-buffered (flipped per call)
  float* server[2] = {nullptr, nullptr};
  int current = 0;
  std::uint8_t* packed = nullptr;      // this rank's bits of the whole buffer
  std::uint8_t* received = nullptr;    // W × chunk bits for this rank's chunk
  const std::uint8_t** inputs = nullptr;  // W device pointers into received (own: into packed)
  float* worker_scales = nullptr;      // W
  std::uint8_t* results = nullptr;     // W × chunk bits: every server's result
  float* server_scales = nullptr;      // W
  double* sums = nullptr;              // 2: worker, server
  void* workspace = nullptr;
  std::vector<void*> allocations;

  std::size_t begin(int j) const { return std::min(n, static_cast<std::size_t>(j) * chunk); }
  std::size_t length(int j) const { return std::min(n, begin(j) + chunk) - begin(j); }
  ~DeviceState() {
    for (void* p : allocations) cudaFree(p);
  }
};

struct Front {
  std::mutex mutex;
  std::map<std::pair<ncclComm_t, std::uint64_t>, std::unique_ptr<DeviceState>> states;
  std::atomic<std::uint64_t> compressed_calls{0}, compressed_bytes{0}, forwarded_calls{0}, forwarded_bytes{0};
};

Front& front() {
  static Front* instance = new Front();  // leaked: NCCL's teardown may still call in at exit
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

#define ONEBIT_CUDA(call)                                                                                 \
  do {                                                                                                    \
    const cudaError_t e = (call);                                                                         \
    ONEBIT_CHECK(e == cudaSuccess, ONEBIT_SYSTEM_ERROR, #call, ": ", cudaGetErrorString(e));             \
  } while (0)
#define ONEBIT_NCCL(call)                                                                                 \
  do {                                                                                                    \
    const ncclResult_t r = (call);                                                                        \
    ONEBIT_CHECK(r == ncclSuccess,                                                                        \
                 r == ncclInvalidArgument || r == ncclInvalidUsage ? ONEBIT_INVALID_ARGUMENT : ONEBIT_REMOTE_ERROR, \
                 #call, " returned ncclResult ", static_cast<int>(r));                                    \
  } while (0)

DeviceState& state_for(ncclComm_t comm, const Tag& tag, std::size_t n) {
  Front& f = front();
  std::lock_guard<std::mutex> lock(f.mutex);
  auto& slot = f.states[{comm, tag.id}];
  if (slot) return *slot;
  auto st = std::make_unique<DeviceState>();
  ONEBIT_NCCL(nccl().comm_count(comm, &st->size));
  ONEBIT_NCCL(nccl().comm_user_rank(comm, &st->rank));
  const int w = st->size;
  st->n = n;
  st->chunk = ((n + w - 1) / w + 7) / 8 * 8;
  st->chunk_bytes = st->chunk / 8;
  auto alloc = [&](std::size_t bytes) {
    void* p = nullptr;
    ONEBIT_CUDA(cudaMalloc(&p, std::max<std::size_t>(bytes, 16)));
    ONEBIT_CUDA(cudaMemset(p, 0, std::max<std::size_t>(bytes, 16)));
    st->allocations.push_back(p);
    return p;
  };
  for (int i = 0; i < 2; ++i) {
    st->worker[i] = static_cast<float*>(alloc(n * 4));
    st->server[i] = static_cast<float*>(alloc(st->length(st->rank) * 4));
  }
  st->packed = static_cast<std::uint8_t*>(alloc(kernels::packed_bytes(n) + 8));
  st->received = static_cast<std::uint8_t*>(alloc(w * st->chunk_bytes));
  st->worker_scales = static_cast<float*>(alloc(w * 4));
  st->results = static_cast<std::uint8_t*>(alloc(w * st->chunk_bytes));
  st->server_scales = static_cast<float*>(alloc(w * 4));
  st->sums = static_cast<double*>(alloc(2 * 8));
  st->workspace = alloc(kernels::cuda::workspace_bytes(n));
  std::vector<const std::uint8_t*> inputs(w);
  for (int p = 0; p < w; ++p) {
    inputs[p] = p == st->rank ? st->packed + st->begin(st->rank) / 8 : st->received + p * st->chunk_bytes;
  }
  st->inputs = static_cast<const std::uint8_t**>(alloc(w * sizeof(void*)));
  ONEBIT_CUDA(cudaMemcpy(st->inputs, inputs.data(), w * sizeof(void*), cudaMemcpyHostToDevice));
  // The zeroing ran on the legacy default stream, which a non-blocking caller stream does not wait
  // for: finish it here, once per tag (never during capture: see ncclAllReduce).
  ONEBIT_CUDA(cudaDeviceSynchronize());
  ONEBIT_LOG(INFO, "nccl preload: tag '", tag.name, "': ", n, " elements on communicator ", comm, " (rank ", st->rank,
             " of ", w, "): device state allocated");
  slot = std::move(st);
  return *slot;
}

// The compressed allreduce, all of it enqueued on `stream`.
void compressed(const Deferred& call, kernels::Dtype dtype) {
  DeviceState& st = state_for(call.comm, *call.tag, call.count);
  const Nccl& api = nccl();
  const int w = st.size, me = st.rank;
  const std::size_t element = kernels::dtype_size(dtype);
  if (w == 1) {  // the average over one rank is the buffer itself
    if (call.send != call.recv) {
      ONEBIT_CUDA(cudaMemcpyAsync(call.recv, call.send, call.count * element, cudaMemcpyDeviceToDevice, call.stream));
    }
    front().compressed_calls += 1;
    return;
  }
  const int cur = st.current;
  // 1. Worker pass over the whole buffer; its scale lands in worker_scales[me].
  ONEBIT_CUDA(kernels::cuda::worker_pass(call.send, dtype, st.worker[cur], st.worker_scales + me, st.worker[1 - cur],
                                         st.packed, st.n, {st.sums, st.worker_scales + me}, st.workspace, call.stream));
  // One group of messages with every other rank p: bits out(p) and in(p), then this rank's scale
  // out and p's scale in.
  std::uint64_t sent = 0;
  struct Bits {
    std::uint8_t* data;
    std::size_t bytes;
  };
  auto exchange = [&](auto&& bits_out, auto&& bits_in, float* scales) {
    ONEBIT_NCCL(api.group_start());
    for (int p = 0; p < w; ++p) {
      if (p == me) continue;
      const Bits out = bits_out(p), in = bits_in(p);
      ONEBIT_NCCL(api.send(out.data, out.bytes, ncclUint8, p, call.comm, call.stream));
      ONEBIT_NCCL(api.recv(in.data, in.bytes, ncclUint8, p, call.comm, call.stream));
      ONEBIT_NCCL(api.send(scales + me, 1, ncclFloat32, p, call.comm, call.stream));
      ONEBIT_NCCL(api.recv(scales + p, 1, ncclFloat32, p, call.comm, call.stream));
      sent += out.bytes + 4;
    }
    ONEBIT_NCCL(api.group_end());
  };
  // 2. Chunk p's bits and the scale to rank p; this rank's chunk bits and scales from everyone.
  exchange([&](int p) { return Bits{st.packed + st.begin(p) / 8, kernels::packed_bytes(st.length(p))}; },
           [&](int p) { return Bits{st.received + p * st.chunk_bytes, kernels::packed_bytes(st.length(me))}; },
           st.worker_scales);
  // 3. Server pass over this rank's chunk; its scale lands in server_scales[me].
  std::uint8_t* mine = st.results + me * st.chunk_bytes;
  ONEBIT_CUDA(kernels::cuda::server_pass(st.inputs, st.worker_scales, w, 1.0f / static_cast<float>(w), st.server[cur],
                                         st.server_scales + me, st.server[1 - cur], mine, st.length(me),
                                         {st.sums + 1, st.server_scales + me}, st.workspace, call.stream));
  // 4. Every server's result and scale to every rank.
  exchange([&](int) { return Bits{mine, kernels::packed_bytes(st.length(me))}; },
           [&](int p) { return Bits{st.results + p * st.chunk_bytes, kernels::packed_bytes(st.length(p))}; },
           st.server_scales);
  // 5. Unpack every chunk into the caller's buffer.
  const float factor = call.op == ncclSum ? static_cast<float>(w) : 1.0f;
  auto* out = static_cast<std::uint8_t*>(call.recv);
  for (int j = 0; j < w; ++j) {
    ONEBIT_CUDA(kernels::cuda::unpack(st.results + j * st.chunk_bytes, st.server_scales + j, factor,
                                      out + st.begin(j) * element, dtype, st.length(j), call.stream));
  }
  st.current = 1 - cur;  // the next call on this stream reads what this one wrote
  front().compressed_calls += 1;
  front().compressed_bytes += sent;
  call.tag->calls += 1;
  call.tag->bytes_sent += sent;
}

enum class Verdict { kForward, kCompress };

Verdict decide(const Deferred& call, kernels::Dtype* dtype) {
  if (param::Enable() == 0 || call.tag == nullptr) return Verdict::kForward;
  const Tag& tag = *call.tag;
  auto forward = [&](const char* why) {
    ONEBIT_LOG(INFO, "nccl preload: tag '", tag.name, "' (", call.count, " elements): forwarded to NCCL: ", why);
    return Verdict::kForward;
  };
  const Nccl& api = nccl();
  if (!api.send || !api.recv || !api.group_start || !api.group_end || !api.comm_count || !api.comm_user_rank) {
    return forward("NCCL's pncclSend/Recv/Group*/Comm* entry points were not all found");
  }
  if (!dtype_of(call.datatype, dtype) || *dtype != tag.dtype) return forward("datatype is not the tag's");
  if (call.count != tag.count) return forward("element count differs from the tag's");
  if (call.op != ncclSum && call.op != ncclAvg) return forward("op is neither ncclSum nor ncclAvg");
  return Verdict::kCompress;  // in place or not: the worker reads send, the unpack writes recv
}

ncclResult_t forward_all_reduce(const Deferred& c) {
  front().forwarded_calls += 1;
  front().forwarded_bytes += c.count * element_size(c.datatype);
  if (nccl().all_reduce == nullptr) return ncclSystemError;
  return nccl().all_reduce(c.send, c.recv, c.count, c.datatype, c.op, c.comm, c.stream);
}

// Runs a compressed call now; errors become NCCL's codes with a WARN line.
ncclResult_t run_compressed(const Deferred& call, kernels::Dtype dtype) {
  try {
    compressed(call, dtype);
    return ncclSuccess;
  } catch (const Error& error) {
    ONEBIT_LOG(WARN, "nccl preload: tag '", call.tag->name, "': compressed allreduce failed: ", error.what());
    switch (error.code()) {
      case ONEBIT_REMOTE_ERROR: return ncclRemoteError;
      case ONEBIT_INVALID_ARGUMENT: return ncclInvalidArgument;
      default: return ncclSystemError;
    }
  } catch (const std::exception& error) {
    ONEBIT_LOG(WARN, "nccl preload: ", error.what());
    return ncclInternalError;
  }
}

}  // namespace
}  // namespace onebit::nccl_front

using namespace onebit::nccl_front;

extern "C" {

__attribute__((visibility("default"))) ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                                                  ncclDataType_t datatype, ncclRedOp_t op,
                                                                  ncclComm_t comm, cudaStream_t stream) {
  Deferred call{sendbuff, recvbuff, count, datatype, op, comm, stream, nullptr};
  try {
    call.tag = onebit::TagRegistry::instance().find(recvbuff);
  } catch (...) {
    call.tag = nullptr;
  }
  onebit::kernels::Dtype dtype;
  if (decide(call, &dtype) == Verdict::kForward) return forward_all_reduce(call);
  // A tag's first call allocates its device state: not while a graph is being captured.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) capture = cudaStreamCaptureStatusNone;
  if (capture != cudaStreamCaptureStatusNone) {
    std::lock_guard<std::mutex> lock(front().mutex);
    auto it = front().states.find({comm, call.tag->id});
    if (it == front().states.end() || !it->second) {
      ONEBIT_LOG(INFO, "nccl preload: tag '", call.tag->name, "': first call inside graph capture; forwarded to NCCL");
      return forward_all_reduce(call);
    }
  }
  if (group_depth > 0) {
    deferred.push_back(call);
    return ncclSuccess;
  }
  return run_compressed(call, dtype);
}

__attribute__((visibility("default"))) ncclResult_t ncclGroupStart() {
  if (nccl().group_start == nullptr) return ncclSystemError;
  const ncclResult_t r = nccl().group_start();
  if (r == ncclSuccess) ++group_depth;
  return r;
}

__attribute__((visibility("default"))) ncclResult_t ncclGroupEnd() {
  if (nccl().group_end == nullptr) return ncclSystemError;
  const ncclResult_t r = nccl().group_end();
  if (group_depth > 0) --group_depth;
  if (r != ncclSuccess || group_depth > 0) return r;
  // The outermost group is issued; now the compressed calls it held, in order.
  std::vector<Deferred> calls;
  calls.swap(deferred);
  for (const Deferred& call : calls) {
    onebit::kernels::Dtype dtype = onebit::kernels::Dtype::kFloat32;
    decide(call, &dtype);  // the verdict was kCompress when the call was deferred; this sets dtype
    const ncclResult_t result = run_compressed(call, dtype);
    if (result != ncclSuccess) return result;
  }
  return ncclSuccess;
}

ONEBIT_API onebit_result_t onebit_preload_stats(onebit_preload_stats_t* stats) {
  return onebit::abi_guard("onebit_preload_stats", [&] {
    ONEBIT_CHECK(stats != nullptr, ONEBIT_INVALID_ARGUMENT, "stats is NULL");
    *stats = onebit_preload_stats_t{};
    Front& f = front();
    stats->onebit.compressed_calls = f.compressed_calls;
    stats->onebit.compressed_bytes_sent = f.compressed_bytes;
    stats->onebit.bytes_sent = f.compressed_bytes;
    stats->forwarded_calls = f.forwarded_calls;
    stats->forwarded_bytes = f.forwarded_bytes;
  });
}

}  // extern "C"
