// onebit's native c10d backend: a gloo backend whose all_reduce of a tagged tensor is onebit's.
//
// A tagged all_reduce never enters Python: this file finds the tensor in the library's tag
// registry (onebit_tag_find), queues the call on a C++ worker of its own, runs it through the C
// API (onebit_allreduce on the group's communicator) and answers with a C++ Work. Python only sets
// the group up (onebit/backend.py: the gloo half, the invitation, the root check, the
// communicator) and makes the children of split and merge. docs/design/doors.md, "The native c10d backend".
//
// Shipped compiled in the wheel for the torch it was built against; for another torch built at
// first use by python/onebit/_native.py (torch.utils.cpp_extension), since torch's C++ ABI changes
// with every release.
//
// Why C++: torch wraps every Work that a Python c10d Backend returns in PyWorkHolder, which
// forwards wait() and get_future() only, and a Python ProcessGroup subclass runs every call it
// does not override with the GIL held, which deadlocks against gloo's worker threads. A C++
// Backend has neither: c10d calls it directly and gets its Work as it is.
//
// The contract: OnebitBackend forwards every virtual of c10d::Backend to the wrapped gloo backend
// (tests/python/native_backend_check.py checks that every virtual of the installed Backend.hpp is
// overridden here), except
//   - allreduce: a tagged CPU tensor (float32, float16 or bfloat16; SUM or AVG) is onebit's
//     compressed call, queued in call order (CompressedCalls); anything else is gloo's, counted;
//   - allreduce_coalesced: gloo's, after the Python side noted any tagged member (said once a tag);
//   - barrier: the queued compressed calls end first, as gloo's barrier waits for the group's work
//     in flight;
//   - shutdown: the queued calls run, the communicator is destroyed, then gloo is shut down;
//   - abort: the queued compressed calls fail without running and nothing waits, then gloo's abort;
//   - split, merge: the Python side makes the child, an OnebitBackend too;
//   - getBackendName ("onebit"), supportsReconfigure (false: a reconfigure would reach gloo's
//     connections, not onebit's).
// The GIL is taken only to call the Python side (split, merge, the coalesced note) and to release
// its object, never across a call into gloo or onebit.
//
// Torch versions: the virtuals torch added after 2.5 are each compiled only where the installed
// Backend.hpp declares them (ONEBIT_C10D_HAS_<name>, defined by _native.py from that header), so
// one source builds against every torch from 2.5 on; a virtual an older torch lacks is one its
// c10d never calls.
#include <dlfcn.h>
#include <torch/extension.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "onebit.h"  // include/onebit/onebit.h, shipped beside this file with the onebit_types.h it includes

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

// Runs `f` with the GIL released when this thread holds it: what waits for onebit's worker or
// gloo's (whose last act on a call may be to free a tensor made in Python, which takes the GIL)
// must not hold it.
template <typename F>
void without_gil(F f) {
  if (Py_IsInitialized() && PyGILState_Check()) {
    py::gil_scoped_release nogil;
    f();
  } else {
    f();
  }
}

// A C API call that failed: its onebit_result_t and message. Raised to Python as
// onebit.OnebitError with that code (the translator registered below), as a ctypes call of the
// same function would.
class CallFailure : public std::runtime_error {
 public:
  CallFailure(int code, const std::string& message) : std::runtime_error(message), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

// The C API functions the backend calls, looked up in the libonebit the Python package loaded (its
// ctypes handle): the one whose tag registry onebit.tag filled. Not linked: the wheel's extension
// then needs no path to the library, and a process holds one copy of the registry.
struct Core {
  decltype(&onebit_allreduce) allreduce;
  decltype(&onebit_tag_find) tag_find;
  decltype(&onebit_last_error) last_error;
  decltype(&onebit_comm_destroy) comm_destroy;
  decltype(&onebit_comm_stats) comm_stats;

  static Core in(std::uintptr_t library) {
    void* handle = reinterpret_cast<void*>(library);
    const auto find = [&](const char* name) {
      void* symbol = dlsym(handle, name);
      TORCH_CHECK(symbol != nullptr, "onebit backend: the loaded libonebit has no ", name,
                  " (an older library than this package?)");
      return symbol;
    };
    Core core;
    core.allreduce = reinterpret_cast<decltype(core.allreduce)>(find("onebit_allreduce"));
    core.tag_find = reinterpret_cast<decltype(core.tag_find)>(find("onebit_tag_find"));
    core.last_error = reinterpret_cast<decltype(core.last_error)>(find("onebit_last_error"));
    core.comm_destroy = reinterpret_cast<decltype(core.comm_destroy)>(find("onebit_comm_destroy"));
    core.comm_stats = reinterpret_cast<decltype(core.comm_stats)>(find("onebit_comm_stats"));
    return core;
  }

  // Throws CallFailure with the calling thread's message when `result` is a failure.
  void check(onebit_result_t result) const {
    if (result != ONEBIT_SUCCESS) throw CallFailure(result, last_error());
  }
};

// The Work of one compressed all_reduce, completed once by CompressedCalls. wait() blocks until
// the call ran and raises its error (every time it is called); the future is completed with the
// list of tensors, as gloo's allreduce future is, or set to the error, so that .then(...) chains
// (DDP comm hooks) see either. The base class keeps the state (completed_, exception_).
class CompressedWork : public Work {
 public:
  CompressedWork(std::vector<at::Tensor> tensors, std::string what)
      : Work(-1, c10d::OpType::ALLREDUCE),
        tensors_(std::move(tensors)),
        what_(std::move(what)),
        future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

  // The call ran; `error` if it failed. The future first (its callbacks run here), so that after
  // wait() the future is done too.
  void complete(std::exception_ptr error) {
    try {
      if (error) {
        future_->setError(error);
      } else {
        future_->markCompleted(c10::IValue(tensors_));
      }
    } catch (...) {  // a callback's own failure: the Work still ends, with the call's outcome
      finish(error);
      throw;
    }
    finish(error);
  }

  bool wait(std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mutex_);
    if (timeout == kNoTimeout) {
      cv_.wait(lock, [&] { return completed_; });
    } else if (!cv_.wait_for(lock, timeout, [&] { return completed_; })) {
      TORCH_CHECK(false, "onebit backend: ", what_, " not completed within ", timeout.count(), " ms (wait timeout)");
    }
    if (exception_) std::rethrow_exception(exception_);
    return true;
  }

  std::vector<at::Tensor> result() override {
    wait(kNoTimeout);
    return tensors_;
  }

  intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  std::vector<at::Tensor> tensors_;
  std::string what_;  // names the call in a timeout
  intrusive_ptr<c10::ivalue::Future> future_;
};

// A group's compressed all_reduces in call order: they must be issued in the same order on every
// rank, since each rank's calls pair with its peers' in sequence over onebit's connections.
// Asynchronous calls run on one worker thread (started with the first), one at a time, in
// submission order. A synchronous call runs on the caller's thread when nothing is queued, else
// waits its turn, so it never overtakes an earlier asynchronous call. One C call on the
// communicator at a time (calling_), whichever thread makes it.
//
// Untagged calls go to gloo over gloo's own connections, ordered among themselves by gloo on every
// rank; the two streams never wait on each other, so a gloo call made after a queued compressed one
// cannot deadlock it.
class CompressedCalls {
 public:
  using Call = std::function<void()>;  // throws CallFailure

  ~CompressedCalls() { close(); }

  // Runs `call` now, after every call submitted before it; throws its error.
  void run(Call call) {
    bool queued = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      refuse_if_closed();
      queued = submitted_ != finished_ && !on_worker();
    }
    if (!queued) {  // the worker's own callers (a future's callbacks) run between two jobs: in order
      std::lock_guard<std::mutex> calling(calling_);
      call();
      return;
    }
    auto work = c10::make_intrusive<CompressedWork>(std::vector<at::Tensor>{}, "a synchronous compressed all_reduce");
    submit(std::move(call), work);
    work->wait(kNoTimeout);
  }

  // Queues `call` for the worker; `work` is completed when it ran.
  void submit(Call call, intrusive_ptr<CompressedWork> work) {
    std::lock_guard<std::mutex> lock(mutex_);
    refuse_if_closed();
    if (!worker_.joinable()) worker_ = std::thread([this] { serve(); });
    jobs_.push_back({std::move(call), std::move(work)});
    ++submitted_;
    changed_.notify_all();
  }

  // Returns once every call submitted so far has run (their errors stay with their Work). On the
  // worker itself (a future's callback) it returns at once: the worker cannot wait for itself.
  void drain() {
    std::unique_lock<std::mutex> lock(mutex_);
    if (on_worker()) return;
    const std::uint64_t target = submitted_;
    changed_.wait(lock, [&] { return finished_ >= target; });
  }

  // Runs what is queued, then stops the worker; returns once it stopped (a second close() meanwhile
  // waits for the first). On the worker itself (a future's callback) it only asks the worker to
  // stop once the queue is empty: the next close() from another thread joins it. Idempotent.
  void close() {
    if (on_worker()) {
      std::lock_guard<std::mutex> lock(mutex_);
      closed_ = stopping_ = true;
      changed_.notify_all();
      return;
    }
    std::lock_guard<std::mutex> closing(closing_);
    std::thread worker;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      closed_ = stopping_ = true;
      changed_.notify_all();
      worker = std::move(worker_);
    }
    if (worker.joinable()) worker.join();
  }

  // Runs `f` while no call is on the communicator: after the one in flight, before any other.
  template <typename F>
  void between_calls(F f) {
    std::lock_guard<std::mutex> calling(calling_);
    f();
  }

  // Fails every queued call's Work with `reason` without running it, and lets the worker stop
  // after the call it is running (which ends by itself, at the latest at the group's timeout; the
  // next close() joins it). Returns at once: what c10d's abort asks of a group whose peers may be gone.
  void abort(const std::string& reason) {
    std::deque<Job> dropped;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      closed_ = stopping_ = aborted_ = true;
      dropped.swap(jobs_);
      finished_ += dropped.size();
      changed_.notify_all();
    }
    for (Job& job : dropped) {
      try {
        job.work->complete(std::make_exception_ptr(std::runtime_error(reason)));
      } catch (...) {  // a future callback that threw: the other Works still end
      }
    }
  }

 private:
  struct Job {
    Call call;
    intrusive_ptr<CompressedWork> work;
  };

  bool on_worker() const { return worker_id_ == std::this_thread::get_id(); }

  // Under mutex_: a call made after abort() or close() fails at once, saying which.
  void refuse_if_closed() const {
    TORCH_CHECK(!closed_, "onebit backend: this process group was ",
                aborted_ ? "aborted (its compressed calls fail from then on)" : "destroyed (destroy_process_group)");
  }

  void serve() {
    worker_id_ = std::this_thread::get_id();
    while (true) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait(lock, [&] { return !jobs_.empty() || stopping_; });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      std::exception_ptr error;
      try {
        std::lock_guard<std::mutex> calling(calling_);
        job.call();
      } catch (...) {  // the call's error belongs to its Work
        error = std::current_exception();
      }
      job.call = nullptr;
      try {
        job.work->complete(error);
      } catch (...) {  // a future callback that threw: its own concern, not the queue's
      }
      // The call's tensors live as long as its Work's holders, not until the next call; and
      // drain() returning means this thread holds none (a tagged tensor's storage freed with its
      // last holder takes its tag with it).
      job.work.reset();
      std::lock_guard<std::mutex> lock(mutex_);
      ++finished_;
      changed_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Job> jobs_;
  std::uint64_t submitted_ = 0;  // calls submitted to the worker
  std::uint64_t finished_ = 0;   // of those, the ones that ran (or were dropped by abort)
  bool closed_ = false;          // no more calls taken
  bool aborted_ = false;         // closed by abort()
  bool stopping_ = false;        // the worker stops once the queue is empty
  std::thread worker_;
  std::atomic<std::thread::id> worker_id_{};  // set once by the worker, read by every caller
  std::mutex calling_;                        // held for each call on the communicator
  std::mutex closing_;                        // held by close() until the worker stopped
};

// What a tagged all_reduce is, in the C API's terms.
struct TaggedCall {
  void* data;
  std::size_t count;
  onebit_dtype_t dtype;
  onebit_op_t op;
  std::string name;
};

// Whether the options say the caller waits at once (torch >= 2.7 sets asyncOp; without it every
// call is queued, and dist.all_reduce's own wait() keeps the synchronous ones synchronous).
template <typename Options>
auto is_async(const Options& opts, int) -> decltype(static_cast<bool>(opts.asyncOp)) {
  return opts.asyncOp;
}
template <typename Options>
bool is_async(const Options&, long) {
  return true;
}

class OnebitBackend : public c10d::Backend {
 public:
  // `gloo`: the backend every call but a compressed all_reduce goes to; `comm`: the group's
  // onebit_comm_t, owned from now on; `library`: the ctypes handle of the libonebit that made it;
  // `setup`: the Python side that makes the children of split and merge (onebit.backend._GroupSetup).
  OnebitBackend(intrusive_ptr<c10d::Backend> gloo, std::uintptr_t comm, std::uintptr_t library, py::object setup)
      : Backend(gloo->getRank(), gloo->getSize()),
        gloo_(std::move(gloo)),
        core_(Core::in(library)),
        comm_(reinterpret_cast<onebit_comm_t>(comm)),
        setup_(std::move(setup)) {}

  // The communicator is released (its queued calls run first) and gloo, if shutdown() has not
  // dropped it, with the GIL released, as there.
  ~OnebitBackend() override {
    without_gil([&] { release_communicator(); });
    release(setup_);
    if (gloo_ && Py_IsInitialized()) without_gil([&] { gloo_.reset(); });
  }

  // What onebit adds.
  const std::string getBackendName() const override { return "onebit"; }
#ifdef ONEBIT_C10D_HAS_supportsReconfigure
  bool supportsReconfigure() const override { return false; }
#endif

  intrusive_ptr<Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override {
    std::optional<TaggedCall> tagged = compressible(tensors, opts.reduceOp);
    if (!tagged) {
      forwarded_calls_ += 1;
      for (const at::Tensor& t : tensors) forwarded_bytes_ += t.numel() * t.element_size();
      return gloo().allreduce(tensors, opts);
    }
    auto call = [this, tagged = *tagged, tensors] {
      // Runs under the queue's calling lock, which the release takes too: the communicator is
      // there or gone for the whole call. The error message is the calling thread's, read on it.
      TORCH_CHECK(comm_ != nullptr,
                  "onebit backend: this process group was destroyed (destroy_process_group) "
                  "before the queued all_reduce of tag '",
                  tagged.name, "' ran");
      core_.check(core_.allreduce(comm_, tagged.data, tagged.count, tagged.dtype, tagged.op));
    };
    if (!is_async(opts, 0)) {
      calls_.run(call);  // the tensor is complete (or untouched, with the error thrown) on return
      auto work = c10::make_intrusive<CompressedWork>(tensors, "");
      work->complete(nullptr);
      return work;
    }
    auto work = c10::make_intrusive<CompressedWork>(tensors, "the compressed all_reduce of tag '" + tagged->name + "'");
    calls_.submit(std::move(call), work);
    return work;
  }

  // gloo's, tagged members included; the Python side says so once per tag (note_coalesced).
  intrusive_ptr<Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                          const c10d::AllreduceCoalescedOptions& opts) override {
    {
      py::gil_scoped_acquire gil;
      setup_.attr("note_coalesced")(tensors);
    }
    return gloo().allreduce_coalesced(tensors, opts);
  }

  intrusive_ptr<Work> barrier(const c10d::BarrierOptions& opts) override {
    drain();
    return gloo().barrier(opts);
  }

  // The queued calls run and the communicator is destroyed; then gloo is shut down (where torch
  // has the call) and dropped, with the GIL released: ~ProcessGroupGloo joins its worker threads,
  // and a worker finishing a Work whose tensors have Python objects needs the GIL (held here, or
  // by an interpreter finalizing, that ended the process with std::terminate). What
  // destroy_process_group reaches through shutdown(), and the exit hook calls on every torch.
  void close() {
    without_gil([&] {
      release_communicator();
      intrusive_ptr<c10d::Backend> gloo = std::move(gloo_);
#ifdef ONEBIT_C10D_HAS_shutdown
      if (gloo) gloo->shutdown();
#endif
    });
  }

#ifdef ONEBIT_C10D_HAS_shutdown
  void shutdown() override { close(); }
#endif

#ifdef ONEBIT_C10D_HAS_abort
  // The queued compressed calls fail without running and nothing waits for the one in flight; the
  // communicator is released by the next shutdown (destroy_process_group or the exit hook). Then
  // gloo's abort.
  void abort() override {
    without_gil([&] {
      calls_.abort("onebit backend: this process group was aborted before its queued compressed all_reduce ran");
      gloo().abort();
    });
  }
#endif

#ifdef ONEBIT_C10D_HAS_split
  intrusive_ptr<c10d::Backend> split(const intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
                                     const intrusive_ptr<Options>& opts) override {
    py::gil_scoped_acquire gil;
    py::object child = setup_.attr("split")(store, ranks, opts);
    return child.is_none() ? nullptr : child.cast<intrusive_ptr<c10d::Backend>>();
  }
#endif

#ifdef ONEBIT_C10D_HAS_merge
  intrusive_ptr<c10d::Backend> merge(const intrusive_ptr<c10d::Store>& store, const intrusive_ptr<Options>& opts,
                                     const int& rank, const int& size) override {
    py::gil_scoped_acquire gil;
    return setup_.attr("merge")(store, opts, rank, size).cast<intrusive_ptr<c10d::Backend>>();
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

  // What onebit.stats() adds up: the communicator's counters (kept from its release on) and the
  // all_reduces forwarded to gloo.
  std::map<std::string, std::uint64_t> stats() {
    std::lock_guard<std::mutex> lock(release_mutex_);
    onebit_stats_t now = final_stats_;
    if (comm_ != nullptr) core_.check(core_.comm_stats(comm_, &now));
    return {{"compressed_calls", now.compressed_calls},
            {"full_precision_calls", now.full_precision_calls},
            {"bytes_sent", now.bytes_sent},
            {"bytes_received", now.bytes_received},
            {"compressed_bytes_sent", now.compressed_bytes_sent},
            {"full_precision_bytes_sent", now.full_precision_bytes_sent},
            {"forwarded_calls", forwarded_calls_.load()},
            {"forwarded_bytes", forwarded_bytes_.load()}};
  }

  // Whether the communicator is released (shutdown, or the destructor): its connections closed.
  bool released() {
    std::lock_guard<std::mutex> lock(release_mutex_);
    return comm_ == nullptr;
  }

  // Returns once the queued compressed calls ran: before a barrier, and before onebit.tag or
  // onebit.untag change a tag (a queued call finds its tag by address when it runs).
  void drain() { calls_.drain(); }

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

  // The tagged call `tensors` make, or nullopt for one that is gloo's: one strided CPU tensor of a
  // dtype onebit compresses, tagged at its address with its count and dtype, summed or averaged.
  std::optional<TaggedCall> compressible(const std::vector<at::Tensor>& tensors, c10d::ReduceOp op) const {
    if (tensors.size() != 1) return std::nullopt;
    const at::Tensor& t = tensors[0];
    if (t.layout() != at::kStrided || !t.device().is_cpu()) return std::nullopt;  // sparse: gloo's
    onebit_dtype_t dtype;
    switch (t.scalar_type()) {
      case at::kFloat: dtype = ONEBIT_FLOAT32; break;
      case at::kHalf: dtype = ONEBIT_FLOAT16; break;
      case at::kBFloat16: dtype = ONEBIT_BFLOAT16; break;
      default: return std::nullopt;
    }
    int tagged = 0;
    char name[256];
    core_.check(core_.tag_find(t.data_ptr(), t.numel(), dtype, &tagged, name, sizeof name));
    if (!tagged) return std::nullopt;
    // Same address and element count as a tagged tensor, other elements (a strided view):
    // compressing it as the tagged buffer would reduce memory it does not cover.
    TORCH_CHECK_VALUE(t.is_contiguous(), "onebit backend: all_reduce of a non-contiguous tensor (shape ", t.sizes(),
                      ", strides ", t.strides(), ") at the address of the tagged tensor '", name,
                      "': pass the tagged tensor itself, or a contiguous copy (untagged calls go to gloo)");
    if (op == c10d::ReduceOp::SUM)
      return TaggedCall{t.data_ptr(), static_cast<std::size_t>(t.numel()), dtype, ONEBIT_SUM, name};
    if (op == c10d::ReduceOp::AVG)
      return TaggedCall{t.data_ptr(), static_cast<std::size_t>(t.numel()), dtype, ONEBIT_AVG, name};
    return std::nullopt;
  }

  // The queued calls run, then the communicator is destroyed between two calls (a synchronous
  // call on another thread ends first), its counters kept. Idempotent.
  void release_communicator() {
    calls_.close();
    calls_.between_calls([&] {
      std::lock_guard<std::mutex> lock(release_mutex_);
      if (comm_ == nullptr) return;
      core_.comm_stats(comm_, &final_stats_);
      core_.comm_destroy(comm_);
      comm_ = nullptr;
    });
  }

  intrusive_ptr<c10d::Backend> gloo_;
  Core core_;
  onebit_comm_t comm_;
  py::object setup_;
  CompressedCalls calls_;
  std::mutex release_mutex_;  // comm_ is written under it and calls_' calling lock; read under either
  onebit_stats_t final_stats_{};
  std::atomic<std::uint64_t> forwarded_calls_{0}, forwarded_bytes_{0};
};

}  // namespace onebit_c10d

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  py::module_::import("torch.distributed");  // c10d's Backend type, this class's base, registered first
  // A CallFailure reaches Python as onebit.OnebitError with its code, whichever binding it crossed
  // (Work.wait, a future's wait, ProcessGroup.allreduce): registered with pybind11's shared
  // internals, as torch's own translators are.
  static py::handle onebit_error = py::object(py::module_::import("onebit._errors").attr("OnebitError")).release();
  py::register_exception_translator([](std::exception_ptr error) {
    try {
      if (error) std::rethrow_exception(error);
    } catch (const onebit_c10d::CallFailure& failure) {
      py::object raised = onebit_error(failure.code(), failure.what());
      PyErr_SetObject(onebit_error.ptr(), raised.ptr());
    }
  });
  py::class_<onebit_c10d::OnebitBackend, c10d::Backend, c10::intrusive_ptr<onebit_c10d::OnebitBackend>>(
      module, "OnebitBackend", "A gloo backend whose all_reduce of a tagged tensor is onebit's (c10d_backend.cc).")
      .def(py::init<c10::intrusive_ptr<c10d::Backend>, std::uintptr_t, std::uintptr_t, py::object>(), py::arg("gloo"),
           py::arg("comm"), py::arg("library"), py::arg("setup"))
      .def("stats", &onebit_c10d::OnebitBackend::stats, py::call_guard<py::gil_scoped_release>())
      .def("drain", &onebit_c10d::OnebitBackend::drain, py::call_guard<py::gil_scoped_release>())
      .def("close", &onebit_c10d::OnebitBackend::close)
      .def_property_readonly("released", &onebit_c10d::OnebitBackend::released);
}
