// onebit's native c10d backend: a gloo backend whose all_reduce of a tagged tensor is onebit's.
//
// Built at first use against the installed torch by python/onebit/_native.py
// (torch.utils.cpp_extension, as DeepSpeed builds its ops), so that the wheel stays py3-none and
// torch's C++ ABI is always the one in the process. docs/design.md, "The native c10d backend".
//
// Why C++: torch wraps every Work that a Python c10d Backend returns in PyWorkHolder, which
// forwards wait() and get_future() only (is_completed(), result() and a recv's source rank are
// lost), and a Python ProcessGroup subclass runs every call it does not override with the GIL
// held, which deadlocks against gloo's worker threads. A C++ Backend has neither: c10d calls it
// directly and gets its Work as it is.
//
// The contract: OnebitBackend forwards every virtual of c10d::Backend to the wrapped gloo backend
// (tests/python/native_backend_check.py checks that every virtual of the installed Backend.hpp is
// overridden here), except
//   - allreduce: asks the Python side (onebit.backend._Compression.allreduce) first; a Work from it
//     is the compressed call's, None sends the call to gloo;
//   - allreduce_coalesced: gloo's, after the Python side noted any tagged member (said once a tag);
//   - barrier: the Python side's queued compressed calls end first, as gloo's barrier waits for the
//     group's work in flight;
//   - shutdown: the Python side releases onebit's communicator first (and shuts gloo down);
//   - abort: the Python side fails the queued compressed calls without waiting, then gloo's abort;
//   - split, merge: the Python side makes the child, an OnebitBackend too;
//   - getBackendName ("onebit"), supportsReconfigure (false: a reconfigure would reach gloo's
//     connections, not onebit's).
// The GIL is held only while Python runs, never across a call into gloo.
//
// Torch versions: the virtuals torch added after 2.5 are each compiled only where the installed
// Backend.hpp declares them (ONEBIT_C10D_HAS_<name>, defined by _native.py from that header), so
// one source builds against every torch from 2.5 on; a virtual an older torch lacks is one its
// c10d never calls.
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/extension.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace onebit_c10d {

using c10::intrusive_ptr;
using c10d::Work;

// Python objects are released with the GIL held, and not at all once the interpreter is gone (a
// Backend outliving it in a C++ static is leaked rather than crashing the exit).
void release(py::object& object) {
  if (!Py_IsInitialized()) {
    object.release();
    return;
  }
  py::gil_scoped_acquire gil;
  object = py::object();
}

// The Work of a compressed call: the Python _CompressedWork, whose methods answer each virtual.
class CompressedWork : public Work {
 public:
  explicit CompressedWork(py::object work) : work_(std::move(work)) {}
  ~CompressedWork() override { release(work_); }

  bool wait(std::chrono::milliseconds timeout) override {
    py::gil_scoped_acquire gil;
    py::object seconds =
        timeout == kNoTimeout
            ? py::object(py::none())
            : py::module_::import("datetime").attr("timedelta")(py::arg("milliseconds") = timeout.count());
    return work_.attr("wait")(seconds).cast<bool>();
  }

  bool isCompleted() override {
    py::gil_scoped_acquire gil;
    return work_.attr("is_completed")().cast<bool>();
  }

  bool isSuccess() const override {
    py::gil_scoped_acquire gil;
    return work_.attr("is_success")().cast<bool>();
  }

  std::vector<at::Tensor> result() override {
    py::gil_scoped_acquire gil;
    return work_.attr("result")().cast<std::vector<at::Tensor>>();
  }

  intrusive_ptr<c10::ivalue::Future> getFuture() override {
    py::gil_scoped_acquire gil;
    py::object future = work_.attr("get_future")();
    return future.cast<std::shared_ptr<torch::jit::PythonFutureWrapper>>()->fut;
  }

 private:
  py::object work_;
};

class OnebitBackend : public c10d::Backend {
 public:
  // `gloo`: the backend every call but a compressed all_reduce goes to; `onebit`: the Python side
  // (onebit.backend._Compression) of the same group.
  OnebitBackend(intrusive_ptr<c10d::Backend> gloo, py::object onebit)
      : Backend(gloo->getRank(), gloo->getSize()), gloo_(std::move(gloo)), onebit_(std::move(onebit)) {}
  // gloo, if shutdown() has not dropped it, is dropped with the GIL released, as there.
  ~OnebitBackend() override {
    release(onebit_);
    if (gloo_ && Py_IsInitialized() && PyGILState_Check()) {
      py::gil_scoped_release nogil;
      gloo_.reset();
    }
  }

  // What onebit adds.
  const std::string getBackendName() const override { return "onebit"; }
#ifdef ONEBIT_C10D_HAS_supportsReconfigure
  bool supportsReconfigure() const override { return false; }
#endif

  intrusive_ptr<Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override {
    {
      py::gil_scoped_acquire gil;
      py::object work = onebit_.attr("allreduce")(tensors, opts);
      if (!work.is_none()) {
        return c10::make_intrusive<CompressedWork>(std::move(work));
      }
    }
    return gloo().allreduce(tensors, opts);
  }

  // gloo's, tagged members included; the Python side says so once per tag (note_coalesced).
  intrusive_ptr<Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                          const c10d::AllreduceCoalescedOptions& opts) override {
    {
      py::gil_scoped_acquire gil;
      onebit_.attr("note_coalesced")(tensors);
    }
    return gloo().allreduce_coalesced(tensors, opts);
  }

  intrusive_ptr<Work> barrier(const c10d::BarrierOptions& opts) override {
    call("drain");
    return gloo().barrier(opts);
  }

#ifdef ONEBIT_C10D_HAS_shutdown
  // close(): onebit's communicator released and the Python side's reference to gloo dropped; then
  // gloo itself, with the GIL released: ~ProcessGroupGloo joins its worker threads, and a worker
  // finishing a Work whose tensors have Python objects needs the GIL (held here, or by an
  // interpreter finalizing, that ended the process with std::terminate).
  void shutdown() override {
    call("close");
    intrusive_ptr<c10d::Backend> gloo = std::move(gloo_);
    if (PyGILState_Check()) {
      py::gil_scoped_release nogil;
      gloo.reset();
    }
  }
#endif

#ifdef ONEBIT_C10D_HAS_abort
  // The queued compressed calls fail without running and nothing waits for the one in flight
  // (_Compression.abort); then gloo's abort.
  void abort() override {
    call("abort");
    gloo().abort();
  }
#endif

#ifdef ONEBIT_C10D_HAS_split
  intrusive_ptr<c10d::Backend> split(const intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
                                     const intrusive_ptr<Options>& opts) override {
    py::gil_scoped_acquire gil;
    py::object child = onebit_.attr("split")(store, ranks, opts);
    return child.is_none() ? nullptr : child.cast<intrusive_ptr<c10d::Backend>>();
  }
#endif

#ifdef ONEBIT_C10D_HAS_merge
  intrusive_ptr<c10d::Backend> merge(const intrusive_ptr<c10d::Store>& store, const intrusive_ptr<Options>& opts,
                                     const int& rank, const int& size) override {
    py::gil_scoped_acquire gil;
    return onebit_.attr("merge")(store, opts, rank, size).cast<intrusive_ptr<c10d::Backend>>();
  }
#endif

  // State c10d reads from this object itself (ProcessGroup::getGroupName is the first backend's
  // group uid, a plain member) is set on both.
#ifdef ONEBIT_C10D_HAS_setGroupUid
  void setGroupUid(const std::string& pg_uid) override {
    Backend::setGroupUid(pg_uid);
    gloo().setGroupUid(pg_uid);
  }
#endif
#ifdef ONEBIT_C10D_HAS_setBoundDeviceId
  void setBoundDeviceId(std::optional<at::Device> device) override {
    Backend::setBoundDeviceId(device);
    gloo().setBoundDeviceId(device);
  }
#endif

  // Everything else is gloo's.
  bool supportsSplitting() const override { return gloo().supportsSplitting(); }
#ifdef ONEBIT_C10D_HAS_isInitialized
  bool isInitialized() override { return gloo().isInitialized(); }
#endif
#ifdef ONEBIT_C10D_HAS_supportsCoalescing
  bool supportsCoalescing() const override { return gloo().supportsCoalescing(); }
#endif
#ifdef ONEBIT_C10D_HAS_supportsTimeEstimation
  bool supportsTimeEstimation() const override { return gloo().supportsTimeEstimation(); }
#endif
#ifdef ONEBIT_C10D_HAS_startTimeEstimate
  void startTimeEstimate() override { gloo().startTimeEstimate(); }
#endif
#ifdef ONEBIT_C10D_HAS_endTimeEstimate
  float endTimeEstimate() override { return gloo().endTimeEstimate(); }
#endif
#ifdef ONEBIT_C10D_HAS_supportsShrinking
  bool supportsShrinking() const override { return gloo().supportsShrinking(); }
#endif
#ifdef ONEBIT_C10D_HAS_shrink
  intrusive_ptr<c10d::Backend> shrink(const std::vector<int64_t>& ranks_to_exclude, int shrink_flags,
                                      const intrusive_ptr<Options>& opts_override) override {
    return gloo().shrink(ranks_to_exclude, shrink_flags, opts_override);
  }
#endif
#ifdef ONEBIT_C10D_HAS_setTimeout
  void setTimeout(std::chrono::milliseconds timeout) override { gloo().setTimeout(timeout); }
#endif
#ifdef ONEBIT_C10D_HAS_addEphemeralTimeout
  void addEphemeralTimeout(const std::chrono::milliseconds& timeout) override { gloo().addEphemeralTimeout(timeout); }
#endif
#ifdef ONEBIT_C10D_HAS_get_reconfigure_handle
  c10d::ReconfigureHandle get_reconfigure_handle() const override { return gloo().get_reconfigure_handle(); }
#endif
#ifdef ONEBIT_C10D_HAS_reconfigure
  intrusive_ptr<Work> reconfigure(const c10d::ReconfigureOptions& opts) override { return gloo().reconfigure(opts); }
#endif
#ifdef ONEBIT_C10D_HAS_supportsWindow
  bool supportsWindow() const override { return gloo().supportsWindow(); }
#endif
#ifdef ONEBIT_C10D_HAS_new_window
  intrusive_ptr<c10d::Window> new_window(const std::optional<at::Tensor>& tensor) override {
    return gloo().new_window(tensor);
  }
#endif
#ifdef ONEBIT_C10D_HAS_supportsAbortHooks
  bool supportsAbortHooks() const override { return gloo().supportsAbortHooks(); }
#endif
#ifdef ONEBIT_C10D_HAS_registerAbortHook
  void registerAbortHook(int64_t hook_id, c10d::AbortHook hook) override {
    gloo().registerAbortHook(hook_id, std::move(hook));
  }
#endif
#ifdef ONEBIT_C10D_HAS_unregisterAbortHook
  void unregisterAbortHook(int64_t hook_id) override { gloo().unregisterAbortHook(hook_id); }
#endif
#ifdef ONEBIT_C10D_HAS_supportsCompletionHooks
  bool supportsCompletionHooks() const override { return gloo().supportsCompletionHooks(); }
#endif
#ifdef ONEBIT_C10D_HAS_registerCompletionHook
  void registerCompletionHook(int64_t hook_id, c10d::CompletionHook hook) override {
    gloo().registerCompletionHook(hook_id, std::move(hook));
  }
#endif
#ifdef ONEBIT_C10D_HAS_unregisterCompletionHook
  void unregisterCompletionHook(int64_t hook_id) override { gloo().unregisterCompletionHook(hook_id); }
#endif
  void startCoalescing() override { gloo().startCoalescing(); }
  intrusive_ptr<Work> endCoalescing() override { return gloo().endCoalescing(); }
#ifdef ONEBIT_C10D_HAS_getBackendOptions
  intrusive_ptr<Options> getBackendOptions() override { return gloo().getBackendOptions(); }
#endif

  intrusive_ptr<Work> broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) override {
    return gloo().broadcast(tensors, opts);
  }
  intrusive_ptr<Work> allreduce_sparse(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override {
    return gloo().allreduce_sparse(tensors, opts);
  }
  intrusive_ptr<Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override {
    return gloo().reduce(tensors, opts);
  }
  intrusive_ptr<Work> allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                const c10d::AllgatherOptions& opts) override {
    return gloo().allgather(outputs, inputs, opts);
  }
#ifdef ONEBIT_C10D_HAS_all_gather_single
  intrusive_ptr<Work> all_gather_single(at::Tensor& output, at::Tensor& input,
                                        const c10d::AllgatherOptions& opts) override {
    return gloo().all_gather_single(output, input, opts);
  }
#endif
  intrusive_ptr<Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                      const c10d::AllgatherOptions& opts) override {
    return gloo()._allgather_base(output, input, opts);
  }
  intrusive_ptr<Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllgatherOptions& opts) override {
    return gloo().allgather_coalesced(outputs, inputs, opts);
  }
#ifdef ONEBIT_C10D_HAS_all_gather_single_coalesced
  intrusive_ptr<Work> all_gather_single_coalesced(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                  const c10d::AllgatherOptions& opts) override {
    return gloo().all_gather_single_coalesced(outputs, inputs, opts);
  }
#endif
  intrusive_ptr<Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                      const c10d::AllgatherOptions& opts) override {
    return gloo().allgather_into_tensor_coalesced(outputs, inputs, opts);
  }
  intrusive_ptr<Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                             const c10d::GatherOptions& opts) override {
    return gloo().gather(outputs, inputs, opts);
  }
#ifdef ONEBIT_C10D_HAS_gather_single
  intrusive_ptr<Work> gather_single(at::Tensor& output, at::Tensor& input, const c10d::GatherOptions& opts) override {
    return gloo().gather_single(output, input, opts);
  }
#endif
#ifdef ONEBIT_C10D_HAS_gather_into_tensor
  intrusive_ptr<Work> gather_into_tensor(at::Tensor& output, at::Tensor& input,
                                         const c10d::GatherOptions& opts) override {
    return gloo().gather_into_tensor(output, input, opts);
  }
#endif
  intrusive_ptr<Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                              const c10d::ScatterOptions& opts) override {
    return gloo().scatter(outputs, inputs, opts);
  }
  intrusive_ptr<Work> reduce_scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                     const c10d::ReduceScatterOptions& opts) override {
    return gloo().reduce_scatter(outputs, inputs, opts);
  }
#ifdef ONEBIT_C10D_HAS_reduce_scatter_single
  intrusive_ptr<Work> reduce_scatter_single(at::Tensor& output, at::Tensor& input,
                                            const c10d::ReduceScatterOptions& opts) override {
    return gloo().reduce_scatter_single(output, input, opts);
  }
#endif
  intrusive_ptr<Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                           const c10d::ReduceScatterOptions& opts) override {
    return gloo()._reduce_scatter_base(output, input, opts);
  }
#ifdef ONEBIT_C10D_HAS_reduce_scatter_single_coalesced
  intrusive_ptr<Work> reduce_scatter_single_coalesced(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                      const c10d::ReduceScatterOptions& opts) override {
    return gloo().reduce_scatter_single_coalesced(outputs, inputs, opts);
  }
#endif
  intrusive_ptr<Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                      const c10d::ReduceScatterOptions& opts) override {
    return gloo().reduce_scatter_tensor_coalesced(outputs, inputs, opts);
  }
#ifdef ONEBIT_C10D_HAS_all_to_all_single
  intrusive_ptr<Work> all_to_all_single(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
                                        std::vector<int64_t>& input_splits,
                                        const c10d::AllToAllOptions& opts) override {
    return gloo().all_to_all_single(output, input, output_splits, input_splits, opts);
  }
#endif
  intrusive_ptr<Work> alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
                                    std::vector<int64_t>& input_splits, const c10d::AllToAllOptions& opts) override {
    return gloo().alltoall_base(output, input, output_splits, input_splits, opts);
  }
  intrusive_ptr<Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                               const c10d::AllToAllOptions& opts) override {
    return gloo().alltoall(outputs, inputs, opts);
  }
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override {
    gloo().monitoredBarrier(opts, wait_all_ranks);
  }
  void setSequenceNumberForGroup() override { gloo().setSequenceNumberForGroup(); }
  uint64_t getSequenceNumberForGroup() override { return gloo().getSequenceNumberForGroup(); }
  intrusive_ptr<Work> send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) override {
    return gloo().send(tensors, dst_rank, tag);
  }
  intrusive_ptr<Work> recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) override {
    return gloo().recv(tensors, src_rank, tag);
  }
  intrusive_ptr<Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override {
    return gloo().recvAnysource(tensors, tag);
  }
  void registerOnCompletionHook(std::function<void(std::shared_ptr<c10d::WorkInfo>)>&& hook) override {
    gloo().registerOnCompletionHook(std::move(hook));
  }
  void waitForPendingWorks() override { gloo().waitForPendingWorks(); }
  void enableCollectivesTiming() override { gloo().enableCollectivesTiming(); }
#ifdef ONEBIT_C10D_HAS_getBoundDeviceId
  std::optional<at::Device> getBoundDeviceId() const override { return gloo().getBoundDeviceId(); }
#endif
  void eagerConnectSingleDevice(at::Device device) override { gloo().eagerConnectSingleDevice(device); }
#ifdef ONEBIT_C10D_HAS_getError
  c10d::ErrorType getError() override { return gloo().getError(); }
#endif
#ifdef ONEBIT_C10D_HAS_getMemAllocator
  std::shared_ptr<c10::Allocator> getMemAllocator() override { return gloo().getMemAllocator(); }
#endif
#ifdef ONEBIT_C10D_HAS_allocateTensor
  at::Tensor allocateTensor(long size, at::TensorOptions options) override {
    return gloo().allocateTensor(size, options);
  }
#endif
#ifdef ONEBIT_C10D_HAS_supportsTensorAlloc
  bool supportsTensorAlloc(c10::DeviceIndex device_index) override { return gloo().supportsTensorAlloc(device_index); }
#endif
#ifdef ONEBIT_C10D_HAS_suspend
  void suspend() override { gloo().suspend(); }
#endif
#ifdef ONEBIT_C10D_HAS_resume
  void resume() override { gloo().resume(); }
#endif
#ifdef ONEBIT_C10D_HAS_getMemoryStats
  std::unordered_map<std::string, uint64_t> getMemoryStats() override { return gloo().getMemoryStats(); }
#endif

 private:
  c10d::Backend& gloo() const {
    TORCH_CHECK(gloo_, "onebit backend: this process group was destroyed (destroy_process_group)");
    return *gloo_;
  }

  // Calls the Python side's method `name` (no arguments), with the GIL held for that call only.
  void call(const char* name) {
    py::gil_scoped_acquire gil;
    onebit_.attr(name)();
  }

  intrusive_ptr<c10d::Backend> gloo_;
  py::object onebit_;
};

}  // namespace onebit_c10d

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  py::module_::import("torch.distributed");  // c10d's Backend type, this class's base, registered first
  py::class_<onebit_c10d::OnebitBackend, c10d::Backend, c10::intrusive_ptr<onebit_c10d::OnebitBackend>>(
      module, "OnebitBackend", "A gloo backend whose all_reduce of a tagged tensor is onebit's (c10d_backend.cc).")
      .def(py::init<c10::intrusive_ptr<c10d::Backend>, py::object>(), py::arg("gloo"), py::arg("onebit"));
}
