#include "engine/cuda_allreduce.h"

#include <algorithm>
#include <mutex>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "engine/chunk_geometry.h"
#include "kernels/cuda/cuda_kernels.h"
#include "transport/nccl/nccl_api.h"
#include "transport/nccl/nccl_exchange.h"

namespace onebit {
namespace {

void check_cuda(cudaError_t e, const char* what) {
  ONEBIT_CHECK(e == cudaSuccess, ONEBIT_SYSTEM_ERROR, what, ": ", cudaGetErrorString(e));
}

// One tag's error feedback and scratch on one communicator, in device memory, sized at its first
// call. Stored values are double-buffered as on the CPU, but which buffer is current is a parity in
// device memory (kernels::cuda::ErrorBuffers): a call reads [parity] and writes the other, and its
// last kernel flips the parity — so a call captured in a CUDA graph replays correctly, each replay
// building on the one before. revert_unless_finite makes a failed call's "other" equal to [parity]
// again, so the flip is always right.
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
    digests = alloc<std::uint64_t>(w);
    settings_differ = alloc<int>(1);
    sums = alloc<double>(2);
    verdict = alloc<int>(1);
    parity = alloc<int>(1);
    workspace = alloc<std::uint8_t>(kernels::cuda::workspace_bytes(n));
    std::vector<const std::uint8_t*> host_inputs(w);
    for (int p = 0; p < geometry.world; ++p) {
      host_inputs[p] = p == rank ? packed + geometry.begin(rank) / 8 : received + p * geometry.chunk_bytes();
    }
    inputs = alloc<const std::uint8_t*>(w);
    check_cuda(cudaMemcpy(inputs, host_inputs.data(), w * sizeof(void*), cudaMemcpyHostToDevice), "cudaMemcpy");
    check_cuda(cudaHostAlloc(reinterpret_cast<void**>(&counters_host), sizeof(Counters), cudaHostAllocMapped),
               "cudaHostAlloc (mapped)");
    allocations_.host = counters_host;
    *counters_host = Counters{};
    check_cuda(cudaHostGetDevicePointer(reinterpret_cast<void**>(&counters_device), counters_host, 0),
               "cudaHostGetDevicePointer");
    if (tag.restored) {
      // The true errors of a checkpoint, stored with scale 0 (zeroed above): exact, as on the CPU.
      ONEBIT_CHECK(tag.restored_worker.size() == n && tag.restored_server.size() == mine, ONEBIT_INVALID_ARGUMENT,
                   "tag '", tag.name, "': the restored state has ", tag.restored_worker.size(), " + ",
                   tag.restored_server.size(), " floats; rank ", rank, " of ", geometry.world, " needs ", n, " + ",
                   mine, " (was it saved with another world size or rank?)");
      check_cuda(cudaMemcpy(worker[0], tag.restored_worker.data(), n * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
      check_cuda(cudaMemcpy(server[0], tag.restored_server.data(), mine * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
    }
    check_cuda(cudaEventCreateWithFlags(&last_call_done, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    allocations_.event = last_call_done;
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
    int current = 0;
    check_cuda(cudaMemcpy(&current, parity, sizeof(int), cudaMemcpyDeviceToHost), "cudaMemcpy");
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
    const unsigned seen = static_cast<volatile Counters*>(counters_host)->failures;
    const unsigned fresh = seen - reported_failures;
    reported_failures = seen;
    return fresh;
  }

  // Calls that found the ranks' settings digests unlike since the last look (the same way).
  unsigned new_mismatches() {
    const unsigned seen = static_cast<volatile Counters*>(counters_host)->mismatches;
    const unsigned fresh = seen - reported_mismatches;
    reported_mismatches = seen;
    return fresh;
  }

  // Calls that have finished on the device so far, replays of captured graphs included (read
  // without a sync: finish_call increments it in mapped host memory).
  std::uint64_t completed_calls() const override {
    return static_cast<const volatile Counters*>(counters_host)->completed;
  }

  // The device's view of each pair: both buffers and the parity that picks the current one.
  kernels::cuda::ErrorBuffers worker_buffers() const { return {{worker[0], worker[1]}, parity}; }
  kernels::cuda::ErrorBuffers server_buffers() const { return {{server[0], server[1]}, parity}; }

  const ChunkGeometry geometry;
  int rank = 0;
  int device = 0;
  float* worker[2] = {nullptr, nullptr};
  float* server[2] = {nullptr, nullptr};
  int* parity = nullptr;             // which of worker/server is current: read by every kernel, flipped by the last
  std::uint8_t* packed = nullptr;    // this rank's bits of the whole buffer
  std::uint8_t* received = nullptr;  // W × chunk bits for this rank's chunk
  const std::uint8_t** inputs = nullptr;  // W device pointers into received (own: into packed)
  float* worker_scales = nullptr;         // W; [rank] is also the next call's a_prev
  std::uint8_t* results = nullptr;        // W × chunk bits: every server's result
  float* server_scales = nullptr;         // W; [rank] is also the next call's b_prev
  float* saved_scales = nullptr;          // 2: [rank]'s scales before the call, for a revert
  std::uint64_t* digests = nullptr;       // W: every rank's settings digest for this call
  int* settings_differ = nullptr;         // 1 when they were not all alike
  double* sums = nullptr;                 // 2: worker, server
  int* verdict = nullptr;
  std::uint8_t* workspace = nullptr;
  // Mapped host memory the kernels count into: reverted calls (revert_unless_finite) and finished
  // ones (finish_call).
  struct Counters {
    unsigned failures;
    unsigned mismatches;  // reverted because the ranks' settings differed
    unsigned long long completed;
  };
  Counters* counters_host = nullptr;
  Counters* counters_device = nullptr;
  unsigned reported_failures = 0;
  unsigned reported_mismatches = 0;
  // The end of the tag's last call made outside capture: every later one waits for it on its own
  // stream (free on the same stream), so that two calls of one tag never share the scratch buffers
  // at once, whichever streams they come from — stream handles are no identity (0 is the legacy
  // stream, and a destroyed stream's handle comes back).
  bool has_last_call = false;
  cudaEvent_t last_call_done = nullptr;

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
    cudaEvent_t event = nullptr;
    ~Allocations() {
      for (void* p : device) cudaFree(p);
      if (host != nullptr) cudaFreeHost(host);
      if (event != nullptr) cudaEventDestroy(event);
    }
  } allocations_;
};

}  // namespace

bool has_device_state(Tag& tag, std::uint64_t comm_id) {
  // Never waits: a tag in a call on another thread is answered "yes", and the call that asked then
  // fails at once in claim_tag_for_call, naming the overlap.
  std::unique_lock<std::mutex> busy(tag.busy, std::try_to_lock);
  return !busy.owns_lock() || tag.device_states.count(comm_id) != 0;
}

namespace {

// The tag's device state on the call's communicator, allocated on its first call there (and a
// restored checkpoint applied). The tag's count is fixed while it lives (re-tagging with another
// count is refused), so a state that does not fit means the front door mixed up tags or
// communicators.
CudaTagState& device_state_for(Tag& tag, const CudaAllreduceCall& call, int w, int me) {
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
  ONEBIT_CHECK(st.geometry.n == call.count && st.geometry.world == w && st.rank == me, ONEBIT_INTERNAL_ERROR, "tag '",
               tag.name, "': device state for ", st.geometry.n, " elements at rank ", st.rank, " of ",
               st.geometry.world, ", call of ", call.count, " at rank ", me, " of ", w);
  if (const unsigned failed = st.new_failures()) {
    ONEBIT_LOG(WARN, "nccl preload: tag '", tag.name, "': ", failed,
               " earlier call(s) had NaN or Inf in some rank's "
               "input: their results are non-finite on every rank and the error state was kept as before them");
  }
  if (const unsigned mismatched = st.new_mismatches()) {
    ONEBIT_LOG(WARN, "nccl preload: tag '", tag.name, "': ", mismatched,
               " earlier call(s) found that the settings every rank must share for it (an optimizer's learning "
               "rate, betas, eps, weight decay, step or stage; onebit_tag_set_step_settings) were not the same on "
               "every rank: their results are non-finite on every rank and the error state was kept as before them. "
               "This rank's settings now: ",
               tag.settings_said(),
               ". A learning-rate scheduler stepped on some ranks only, or skipped where GradScaler lowered its "
               "scale, which is per rank?");
  }
  return st;
}

// One call's steps, every one enqueued on the caller's stream (nothing waits on the host): a wait
// for the tag's last call when it came from another stream, the scales saved for a revert, the settings digest, the
// worker pass, the bits (with scale and digest) to their servers, the settings compared, the server pass, the results
// to everyone, the unpack, and the revert of a call whose scales are not finite.
class CudaRound {
 public:
  CudaRound(Tag& tag, CudaTagState& st, const CudaAllreduceCall& call, int w, int me)
      : tag_(tag), st_(st), call_(call), g_(st.geometry), w_(w), me_(me), mine_(st.results + me * g_.chunk_bytes()) {}

  std::uint64_t run() {
    after_last_call();
    save_scales();
    store_digest();
    worker_pass();
    std::uint64_t sent = exchange_worker_bits();
    poison_unless_settings_agree();
    server_pass();
    sent += exchange_results();
    unpack();
    revert_unless_finite();
    finish();
    return sent;
  }

 private:
  using DeviceBytes = transport::nccl::DeviceBytes;

  void copy_on_stream(void* to, const void* from, std::size_t bytes) {
    check_cuda(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, call_.stream), "cudaMemcpyAsync");
  }

  // A call waits, on the device, for the tag's last call made outside capture. Not in capture
  // (an event recorded outside a graph is no node of it): a graph's replays are ordered by the
  // stream it is launched on.
  void after_last_call() {
    if (!call_.captured && st_.has_last_call) {
      check_cuda(cudaStreamWaitEvent(call_.stream, st_.last_call_done, 0), "cudaStreamWaitEvent");
    }
  }

  // The scales this rank owns, as they were: what a failed call restores.
  void save_scales() {
    copy_on_stream(st_.saved_scales, st_.worker_scales + me_, 4);
    copy_on_stream(st_.saved_scales + 1, st_.server_scales + me_, 4);
  }

  // This call's settings digest (engine/tag_registry.h), which travels with the worker scale.
  void store_digest() {
    check_cuda(kernels::cuda::store_digest(st_.digests + me_, tag_.settings_digest(), call_.stream), "store_digest");
  }

  // 1. Worker pass over the whole buffer; its scale lands in worker_scales[me].
  void worker_pass() {
    check_cuda(
        kernels::cuda::worker_pass(call_.send, call_.dtype, st_.worker_buffers(), st_.worker_scales + me_, st_.packed,
                                   g_.n, {st_.sums, st_.worker_scales + me_}, st_.workspace, call_.stream),
        "worker_pass");
  }

  // 2. Chunk p's bits and the scale to rank p; this rank's chunk bits and scales from everyone.
  std::uint64_t exchange_worker_bits() {
    return transport::nccl::exchange_with_every_peer(
        call_.comm, call_.stream, me_, w_,
        [&](int p) {
          return DeviceBytes{st_.packed + g_.begin(p) / 8, kernels::packed_bytes(g_.length(p))};
        },
        [&](int p) {
          return DeviceBytes{st_.received + p * g_.chunk_bytes(), kernels::packed_bytes(g_.length(me_))};
        },
        st_.worker_scales, st_.digests);
  }

  // 2b. Ranks whose settings differ (an optimizer's lr on one rank only) make the call non-finite
  // on every rank and change no state, as a NaN does; the host says why at the tag's next call.
  void poison_unless_settings_agree() {
    check_cuda(kernels::cuda::poison_unless_settings_agree(st_.digests, w_, st_.worker_scales, st_.settings_differ,
                                                           call_.stream),
               "poison_unless_settings_agree");
  }

  // 3. Server pass over this rank's chunk; its scale lands in server_scales[me].
  void server_pass() {
    check_cuda(kernels::cuda::server_pass(st_.inputs, st_.worker_scales, w_, 1.0f / static_cast<float>(w_),
                                          st_.server_buffers(), st_.server_scales + me_, mine_, g_.length(me_),
                                          {st_.sums + 1, st_.server_scales + me_}, st_.workspace, call_.stream),
               "server_pass");
  }

  // 4. Every server's result and scale to every rank.
  std::uint64_t exchange_results() {
    return transport::nccl::exchange_with_every_peer(
        call_.comm, call_.stream, me_, w_,
        [&](int) {
          return DeviceBytes{mine_, kernels::packed_bytes(g_.length(me_))};
        },
        [&](int p) {
          return DeviceBytes{st_.results + p * g_.chunk_bytes(), kernels::packed_bytes(g_.length(p))};
        },
        st_.server_scales);
  }

  // 5. Every chunk into the caller's buffer.
  void unpack() {
    const float factor = call_.sum ? static_cast<float>(w_) : 1.0f;
    const std::size_t element = kernels::dtype_size(call_.dtype);
    auto* out = static_cast<std::uint8_t*>(call_.recv);
    for (int j = 0; j < w_; ++j) {
      check_cuda(kernels::cuda::unpack(st_.results + j * g_.chunk_bytes(), st_.server_scales + j, factor,
                                       out + g_.begin(j) * element, call_.dtype, g_.length(j), call_.stream),
                 "unpack");
    }
  }

  // 6. A non-finite scale anywhere: the call changes no state (every rank sees the same scales).
  void revert_unless_finite() {
    const kernels::cuda::ParityRevert revert{st_.worker_buffers(),
                                             g_.n,
                                             st_.server_buffers(),
                                             g_.length(me_),
                                             st_.saved_scales,
                                             st_.worker_scales + me_,
                                             st_.server_scales + me_,
                                             st_.verdict,
                                             &st_.counters_device->failures,
                                             st_.settings_differ,
                                             &st_.counters_device->mismatches};
    check_cuda(kernels::cuda::revert_unless_finite(st_.worker_scales, st_.server_scales, w_, revert, call_.stream),
               "revert_unless_finite");
  }

  // 7. On the device, the parity flips (the next call, or the next replay, reads what this one wrote
  // or restored) and the call is counted; outside capture, the call's end is recorded for the tag's
  // next call.
  void finish() {
    check_cuda(kernels::cuda::finish_call(st_.parity, &st_.counters_device->completed, call_.stream), "finish_call");
    if (call_.captured) return;  // an event recorded in capture is no event to wait on outside it
    check_cuda(cudaEventRecord(st_.last_call_done, call_.stream), "cudaEventRecord");
    st_.has_last_call = true;
  }

  Tag& tag_;
  CudaTagState& st_;
  const CudaAllreduceCall& call_;
  const ChunkGeometry& g_;
  const int w_, me_;
  std::uint8_t* const mine_;  // this rank's server result
};

}  // namespace

std::uint64_t cuda_compressed_allreduce(Tag& tag, const CudaAllreduceCall& call) {
  const std::unique_lock<std::mutex> busy = claim_tag_for_call(tag, "");
  ONEBIT_CHECK(call.live == nullptr || call.live(call.comm, call.comm_id), ONEBIT_INVALID_ARGUMENT, "communicator ",
               call.comm,
               " is being destroyed or aborted (ncclCommDestroy/ncclCommAbort on another thread, begun as "
               "this call started): a compressed call on it now would make state for a communicator that is going");
  const transport::nccl::NcclApi& api = transport::nccl::nccl_api();
  int w = 0, me = 0;
  transport::nccl::check_nccl(api.comm_count(call.comm, &w), "pncclCommCount");
  transport::nccl::check_nccl(api.comm_user_rank(call.comm, &me), "pncclCommUserRank");
  ++tag.calls;
  if (w == 1) {  // the average over one rank is the buffer itself; no state
    if (call.send != call.recv) {
      check_cuda(cudaMemcpyAsync(call.recv, call.send, call.count * kernels::dtype_size(call.dtype),
                                 cudaMemcpyDeviceToDevice, call.stream),
                 "cudaMemcpyAsync");
    }
    return 0;
  }
  const std::uint64_t sent = CudaRound(tag, device_state_for(tag, call, w, me), call, w, me).run();
  tag.bytes_sent += sent;
  return sent;
}

}  // namespace onebit
