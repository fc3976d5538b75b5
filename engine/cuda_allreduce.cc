#include "engine/cuda_allreduce.h"

#include <algorithm>
#include <mutex>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "kernels/cuda/cuda_kernels.h"
#include "engine/chunk_geometry.h"
#include "transport/nccl/nccl_api.h"
#include "transport/nccl/nccl_exchange.h"

namespace onebit {
namespace {

void check_cuda(cudaError_t e, const char* what) {
  ONEBIT_CHECK(e == cudaSuccess, ONEBIT_SYSTEM_ERROR, what, ": ", cudaGetErrorString(e));
}

// One tag's error feedback and scratch on one communicator, in device memory, sized at its first
// call. Stored values are double-buffered as on the CPU: a call reads [current], writes the other,
// and the host flips `current` as it enqueues; revert_unless_finite makes a failed call's "other"
// equal to [current] again, so the flip is always right.
class CudaTagState final : public DeviceState {
 public:
  CudaTagState(const Tag& tag, const CudaAllreduceCall& call, int size, int rank_in_comm)
      : geometry(call.count, size), rank(rank_in_comm) {
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    const std::size_t n = call.count, w = static_cast<std::size_t>(geometry.world);
    const std::size_t mine = geometry.length(rank);
    for (int i = 0; i < 2; ++i) {
      worker[i] = alloc<float>(n);
      server[i] = alloc<float>(mine);
    }
    packed = alloc<std::uint8_t>(kernels::packed_bytes(n) + 8);
    received = alloc<std::uint8_t>(w * geometry.chunk_bytes());
    worker_scales = alloc<float>(w);
    results = alloc<std::uint8_t>(w * geometry.chunk_bytes());
    server_scales = alloc<float>(w);
    saved_scales = alloc<float>(2);
    sums = alloc<double>(2);
    verdict = alloc<int>(1);
    workspace = alloc<std::uint8_t>(kernels::cuda::workspace_bytes(n));
    std::vector<const std::uint8_t*> host_inputs(w);
    for (int p = 0; p < geometry.world; ++p) {
      host_inputs[p] = p == rank ? packed + geometry.begin(rank) / 8 : received + p * geometry.chunk_bytes();
    }
    inputs = alloc<const std::uint8_t*>(w);
    check_cuda(cudaMemcpy(inputs, host_inputs.data(), w * sizeof(void*), cudaMemcpyHostToDevice), "cudaMemcpy");
    check_cuda(cudaHostAlloc(reinterpret_cast<void**>(&failures_host), sizeof(unsigned), cudaHostAllocMapped),
               "cudaHostAlloc (mapped)");
    allocations_.host = failures_host;
    *failures_host = 0;
    check_cuda(cudaHostGetDevicePointer(reinterpret_cast<void**>(&failures_device), failures_host, 0),
               "cudaHostGetDevicePointer");
    if (tag.restored) {
      // The true errors of a checkpoint, stored with scale 0 (zeroed above): exact, as on the CPU.
      ONEBIT_CHECK(tag.restored_worker.size() == n && tag.restored_server.size() == mine, ONEBIT_INVALID_ARGUMENT,
                   "tag '", tag.name, "': the restored state has ", tag.restored_worker.size(), " + ",
                   tag.restored_server.size(), " floats; rank ", rank, " of ", geometry.world, " needs ", n, " + ", mine,
                   " (was it saved with another world size or rank?)");
      check_cuda(cudaMemcpy(worker[0], tag.restored_worker.data(), n * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
      check_cuda(cudaMemcpy(server[0], tag.restored_server.data(), mine * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
    }
    // The zeroing ran on the legacy default stream, which a non-blocking caller stream does not
    // wait for: finish it here, once per tag (never during capture: see the front door).
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }

  std::size_t server_count() const override { return geometry.length(rank); }

  void save(float* worker_out, float* server_out) const override {
    int caller_device = 0;
    check_cuda(cudaGetDevice(&caller_device), "cudaGetDevice");
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
    struct RestoreDevice {
      int device;
      ~RestoreDevice() { cudaSetDevice(device); }  // the caller's thread keeps its current device
    } restore{caller_device};
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");  // the tag's last call, on whatever stream
    const std::size_t n = geometry.n, mine = server_count();
    std::vector<float> stored_worker(n), stored_server(mine);
    float scales[2];
    check_cuda(cudaMemcpy(stored_worker.data(), worker[current], n * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
    check_cuda(cudaMemcpy(stored_server.data(), server[current], mine * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
    check_cuda(cudaMemcpy(&scales[0], worker_scales + rank, 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
    check_cuda(cudaMemcpy(&scales[1], server_scales + rank, 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
    kernels::materialize_error(stored_worker.data(), scales[0], worker_out, n);
    kernels::materialize_error(stored_server.data(), scales[1], server_out, mine);
  }

  // Calls whose scales came out non-finite since the last look (read without a sync: the
  // counter is mapped host memory the revert kernel increments).
  unsigned new_failures() {
    const unsigned seen = *static_cast<volatile unsigned*>(failures_host);
    const unsigned fresh = seen - reported_failures;
    reported_failures = seen;
    return fresh;
  }

  const ChunkGeometry geometry;
  int rank = 0;
  int device = 0;
  float* worker[2] = {nullptr, nullptr};
  float* server[2] = {nullptr, nullptr};
  int current = 0;
  std::uint8_t* packed = nullptr;           // this rank's bits of the whole buffer
  std::uint8_t* received = nullptr;         // W × chunk bits for this rank's chunk
  const std::uint8_t** inputs = nullptr;    // W device pointers into received (own: into packed)
  float* worker_scales = nullptr;           // W; [rank] is also the next call's a_prev
  std::uint8_t* results = nullptr;          // W × chunk bits: every server's result
  float* server_scales = nullptr;           // W; [rank] is also the next call's b_prev
  float* saved_scales = nullptr;            // 2: [rank]'s scales before the call, for a revert
  double* sums = nullptr;                   // 2: worker, server
  int* verdict = nullptr;
  std::uint8_t* workspace = nullptr;
  unsigned* failures_host = nullptr;
  unsigned* failures_device = nullptr;
  unsigned reported_failures = 0;

 private:
  template <typename T>
  T* alloc(std::size_t count) {
    const std::size_t bytes = std::max<std::size_t>(count * sizeof(T), 16);
    void* p = nullptr;
    check_cuda(cudaMalloc(&p, bytes), "cudaMalloc");
    allocations_.device.push_back(p);
    check_cuda(cudaMemset(p, 0, bytes), "cudaMemset");
    return static_cast<T*>(p);
  }
  // Freed however the object goes, also when the constructor throws half way.
  struct Allocations {
    std::vector<void*> device;
    void* host = nullptr;
    ~Allocations() {
      for (void* p : device) cudaFree(p);
      if (host != nullptr) cudaFreeHost(host);
    }
  } allocations_;
};

}  // namespace

bool has_device_state(Tag& tag, std::uint64_t comm_id) {
  std::lock_guard<std::mutex> busy(tag.busy);
  return tag.device_states.count(comm_id) != 0;
}

std::uint64_t cuda_compressed_allreduce(Tag& tag, const CudaAllreduceCall& call) {
  const std::unique_lock<std::mutex> busy = claim_tag_for_call(tag, "");
  const nccl::NcclApi& api = nccl::nccl_api();
  int w = 0, me = 0;
  nccl::check_nccl(api.comm_count(call.comm, &w), "pncclCommCount");
  nccl::check_nccl(api.comm_user_rank(call.comm, &me), "pncclCommUserRank");
  const std::size_t element = kernels::dtype_size(call.dtype);
  ++tag.calls;
  if (w == 1) {  // the average over one rank is the buffer itself; no state
    if (call.send != call.recv) {
      check_cuda(cudaMemcpyAsync(call.recv, call.send, call.count * element, cudaMemcpyDeviceToDevice, call.stream),
                 "cudaMemcpyAsync");
    }
    return 0;
  }
  std::unique_ptr<DeviceState>& slot = tag.device_states[call.comm_id];
  if (!slot) {
    try {
      slot = std::make_unique<CudaTagState>(tag, call, w, me);
    } catch (...) {
      tag.device_states.erase(call.comm_id);
      throw;
    }
    ONEBIT_LOG(INFO, "nccl preload: tag '", tag.name, "': ", call.count, " elements on communicator ", call.comm,
               " (rank ", me, " of ", w, "): device state allocated");
    tag.restored = false;
  }
  auto& st = static_cast<CudaTagState&>(*slot);
  // The tag's count is fixed while it lives (re-tagging with another count is refused), and its
  // state is its own: this holds unless the front door mixed up tags or communicators.
  ONEBIT_CHECK(st.geometry.n == call.count && st.geometry.world == w && st.rank == me, ONEBIT_INTERNAL_ERROR, "tag '",
               tag.name, "': device state for ", st.geometry.n, " elements at rank ", st.rank, " of ", st.geometry.world,
               ", call of ", call.count, " at rank ", me, " of ", w);
  if (const unsigned failed = st.new_failures()) {
    ONEBIT_LOG(WARN, "nccl preload: tag '", tag.name, "': ", failed, " earlier call(s) had NaN or Inf in some rank's "
               "input: their results are non-finite on every rank and the error state was kept as before them");
  }
  const ChunkGeometry& g = st.geometry;
  const int cur = st.current;
  using nccl::DeviceBytes;
  // The scales this rank owns, as they were: what a failed call restores.
  check_cuda(cudaMemcpyAsync(st.saved_scales, st.worker_scales + me, 4, cudaMemcpyDeviceToDevice, call.stream),
             "cudaMemcpyAsync");
  check_cuda(cudaMemcpyAsync(st.saved_scales + 1, st.server_scales + me, 4, cudaMemcpyDeviceToDevice, call.stream),
             "cudaMemcpyAsync");
  // 1. Worker pass over the whole buffer; its scale lands in worker_scales[me].
  check_cuda(kernels::cuda::worker_pass(call.send, call.dtype, st.worker[cur], st.worker_scales + me, st.worker[1 - cur],
                                        st.packed, g.n, {st.sums, st.worker_scales + me}, st.workspace, call.stream),
             "worker_pass");
  // 2. Chunk p's bits and the scale to rank p; this rank's chunk bits and scales from everyone.
  std::uint64_t sent = nccl::exchange_with_every_peer(
      call.comm, call.stream, me, w,
      [&](int p) { return DeviceBytes{st.packed + g.begin(p) / 8, kernels::packed_bytes(g.length(p))}; },
      [&](int p) { return DeviceBytes{st.received + p * g.chunk_bytes(), kernels::packed_bytes(g.length(me))}; },
      st.worker_scales);
  // 3. Server pass over this rank's chunk; its scale lands in server_scales[me].
  std::uint8_t* mine = st.results + me * g.chunk_bytes();
  check_cuda(kernels::cuda::server_pass(st.inputs, st.worker_scales, w, 1.0f / static_cast<float>(w), st.server[cur],
                                        st.server_scales + me, st.server[1 - cur], mine, g.length(me),
                                        {st.sums + 1, st.server_scales + me}, st.workspace, call.stream),
             "server_pass");
  // 4. Every server's result and scale to every rank.
  sent += nccl::exchange_with_every_peer(
      call.comm, call.stream, me, w, [&](int) { return DeviceBytes{mine, kernels::packed_bytes(g.length(me))}; },
      [&](int p) { return DeviceBytes{st.results + p * g.chunk_bytes(), kernels::packed_bytes(g.length(p))}; },
      st.server_scales);
  // 5. Unpack every chunk into the caller's buffer.
  const float factor = call.sum ? static_cast<float>(w) : 1.0f;
  auto* out = static_cast<std::uint8_t*>(call.recv);
  for (int j = 0; j < w; ++j) {
    check_cuda(kernels::cuda::unpack(st.results + j * g.chunk_bytes(), st.server_scales + j, factor,
                                     out + g.begin(j) * element, call.dtype, g.length(j), call.stream),
               "unpack");
  }
  // 6. A non-finite scale anywhere: the call changes no state (every rank sees the same scales).
  const kernels::cuda::Revert revert{st.worker[cur], st.worker[1 - cur], g.n, st.server[cur], st.server[1 - cur],
                                     g.length(me), st.saved_scales, st.worker_scales + me, st.server_scales + me,
                                     st.verdict, st.failures_device};
  check_cuda(kernels::cuda::revert_unless_finite(st.worker_scales, st.server_scales, w, revert, call.stream),
             "revert_unless_finite");
  st.current = 1 - cur;  // the next call on this stream reads what this one wrote (or restored)
  tag.bytes_sent += sent;
  return sent;
}

}  // namespace onebit
