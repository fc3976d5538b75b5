// The stand-in CUDA runtime and device of cuda_runtime.h: what it models, and what not, is said
// there. Memory: a registry of what cudaMalloc and cudaHostAlloc gave out. Launches: one at a time,
// a block's threads as OS threads meeting at barriers (each warp's exchanges under its mutex), the
// blocks in a shuffled order.
#include "cuda_runtime.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <barrier>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <semaphore>
#include <thread>
#include <vector>

#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#else
#define ASAN_POISON_MEMORY_REGION(start, bytes) ((void)(start), (void)(bytes))
#define ASAN_UNPOISON_MEMORY_REGION(start, bytes) ((void)(start), (void)(bytes))
#endif

namespace onebit_cuda_on_cpu {

Place& place() {
  thread_local Place here;
  return here;
}
namespace {

thread_local cudaError_t last_error = cudaSuccess;  // CUDA's is per host thread too

cudaError_t fail_with(cudaError_t error) {
  last_error = error;
  return error;
}

// A kernel broke a rule of CUDA's that a real device would not report (it would hang or compute
// garbage): the test stops here, saying which.
[[noreturn]] void broken_rule(const char* what, unsigned lane, unsigned mask) {
  std::fprintf(stderr, "cuda_on_cpu: block %u thread %u (lane %u, mask 0x%08x): %s\n", blockIdx.x, threadIdx.x, lane,
               mask, what);
  std::abort();
}

// ---- capture: a stream's state only (cuda_runtime.h) ----

std::mutex capture_mutex;
std::map<cudaStream_t, bool> captures;  // the capturing streams, and whether each capture is invalidated

bool capturing(cudaStream_t stream) {
  std::lock_guard lock(capture_mutex);
  return captures.count(stream) != 0;
}

// Work queued on a capturing stream would be recorded into a graph on a GPU; nothing records here,
// so a test that reaches this has queued what it meant to refuse: it stops, saying so.
void refuse_work_while_capturing(cudaStream_t stream, const char* what) {
  if (!capturing(stream)) return;
  std::fprintf(stderr, "cuda_on_cpu: %s on a stream capturing a CUDA graph: the stand-in records no graphs\n", what);
  std::abort();
}

// ---- memory ----

struct Allocation {
  std::size_t bytes;
  cudaMemoryType type;
};

std::mutex memory_mutex;
std::map<const char*, Allocation> allocations;  // by first byte

// The allocation holding [pointer, pointer + bytes), or none.
const Allocation* find_allocation(const void* pointer, std::size_t bytes) {
  const char* p = static_cast<const char*>(pointer);
  auto it = allocations.upper_bound(p);
  if (it == allocations.begin()) return nullptr;
  --it;
  const std::size_t offset = static_cast<std::size_t>(p - it->first);
  if (offset >= it->second.bytes || bytes > it->second.bytes - offset) return nullptr;
  return &it->second;
}

// Fresh memory holds 0xFF bytes (NaN as floats), as a GPU's holds whatever was there before; the
// rounding to CUDA's 256-byte granule is poisoned for ASan, so a kernel writing past its array is
// reported as it would corrupt a neighbour on a GPU.
std::size_t granules(std::size_t bytes) { return std::max<std::size_t>(256, (bytes + 255) / 256 * 256); }

cudaError_t allocate(void** pointer, std::size_t bytes, cudaMemoryType type) {
  if (pointer == nullptr) return fail_with(cudaErrorInvalidValue);
  const std::size_t rounded = granules(bytes);
  void* memory = std::aligned_alloc(256, rounded);
  if (memory == nullptr) return fail_with(cudaErrorMemoryAllocation);
  std::memset(memory, 0xFF, rounded);
  ASAN_POISON_MEMORY_REGION(static_cast<char*>(memory) + bytes, rounded - bytes);
  std::lock_guard lock(memory_mutex);
  allocations[static_cast<const char*>(memory)] = Allocation{bytes == 0 ? 1 : bytes, type};
  *pointer = memory;
  return cudaSuccess;
}

cudaError_t release(void* pointer, cudaMemoryType type) {
  if (pointer == nullptr) return cudaSuccess;
  std::lock_guard lock(memory_mutex);
  const auto it = allocations.find(static_cast<const char*>(pointer));
  if (it == allocations.end() || it->second.type != type) return fail_with(cudaErrorInvalidValue);
  ASAN_UNPOISON_MEMORY_REGION(pointer, granules(it->second.bytes));
  allocations.erase(it);
  std::free(pointer);
  return cudaSuccess;
}

// A copy's side that must be device memory (or mapped host memory, which the device reaches).
bool device_side(const void* pointer, std::size_t bytes) {
  std::lock_guard lock(memory_mutex);
  return find_allocation(pointer, bytes) != nullptr;
}

cudaError_t copy(void* to, const void* from, std::size_t bytes, cudaMemcpyKind kind) {
  if (bytes == 0) return cudaSuccess;
  const bool to_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool from_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (to == nullptr || from == nullptr || (to_device && !device_side(to, bytes)) ||
      (from_device && !device_side(from, bytes))) {
    return fail_with(cudaErrorInvalidValue);
  }
  std::memmove(to, from, bytes);
  return cudaSuccess;
}

// ---- the running block ----

// How long a launch may go without progress (a block ended, a __syncthreads or a warp exchange
// passed) before the test stops naming it: a kernel that would hang on a GPU, because some thread
// never reaches a barrier or a lane never joins an exchange, says so here instead.
constexpr auto kPatience = std::chrono::seconds(60);
std::atomic<std::uint64_t> progress{0};

// __shared__ variables: the lowering registers each (shared_memory below); every block finds them
// scribbled with 0xFF bytes (NaN as floats), as a GPU's shared memory holds whatever was there.
std::mutex shared_mutex;
std::map<void*, std::size_t> shared_regions;

void scribble_shared_memory() {
  std::lock_guard lock(shared_mutex);
  for (const auto& [start, bytes] : shared_regions) std::memset(start, 0xFF, bytes);
}

// A warp's votes and shuffles: the lanes of one exchange's mask each leave a value and wait until
// every lane of the mask has; then each takes its answer. Exchanges of disjoint masks meet apart.
// A lane of the mask that has left the kernel fails the exchange.
struct Exchange {
  unsigned arrived = 0;  // lanes of the mask that left their value
  std::uint64_t completed = 0;
  unsigned long long value[32] = {};
  unsigned long long answer[32] = {};  // the values as they were when the mask's last lane came
};

struct Warp {
  std::mutex mutex;  // for the fields below; only the warp's lanes wait on `changed`
  std::condition_variable changed;
  unsigned lanes = 0;   // that exist (the last warp of a block may have fewer)
  unsigned exited = 0;  // lanes that have left the kernel in this block
  std::map<unsigned, Exchange> by_mask;
};

struct Progressed {
  void operator()() noexcept { progress.fetch_add(1, std::memory_order_relaxed); }
};

// One block's meeting points: __syncthreads, a barrier of the threads still in the kernel; each
// warp's exchanges; and the block's end, which every thread reaches before the next block begins
// (the __shared__ statics are the next block's) and whose last arrival makes everything anew.
struct Block {
  unsigned threads = 0;
  std::optional<std::barrier<Progressed>> sync;
  std::vector<Warp> warps;

  explicit Block(unsigned n) : threads(n), warps((n + 31) / 32) {
    for (unsigned w = 0; w < warps.size(); ++w) warps[w].lanes = std::min(32u, n - 32 * w);
    sync.emplace(n);
  }
  void next() noexcept {  // no thread is inside the kernel
    sync.emplace(threads);
    for (Warp& w : warps) {
      w.exited = 0;
      w.by_mask.clear();
    }
    scribble_shared_memory();
    progress.fetch_add(1, std::memory_order_relaxed);
  }
};

thread_local Block* running = nullptr;  // the block this thread is part of
thread_local unsigned flat_thread = 0;  // threadIdx, flattened

// This thread's kernel has returned: it leaves the block's barrier and its warp's exchanges (one
// waiting on it fails now).
void leave_kernel() {
  Warp& warp = running->warps[flat_thread / 32];
  {
    std::lock_guard lock(warp.mutex);
    warp.exited |= 1u << (flat_thread % 32);
  }
  warp.changed.notify_all();
  running->sync->arrive_and_drop();
}

// One exchange of `value` among the lanes of `mask`; returns every lane's value.
std::array<unsigned long long, 32> exchange(unsigned mask, unsigned long long value) {
  if (running == nullptr) broken_rule("a warp function called outside a kernel", 0, mask);
  Warp& warp = running->warps[flat_thread / 32];
  const unsigned lane = flat_thread % 32;
  const unsigned existing = warp.lanes == 32 ? ~0u : (1u << warp.lanes) - 1;
  if ((mask & ~existing) != 0) broken_rule("the mask names lanes this warp does not have", lane, mask);
  if ((mask >> lane & 1u) == 0) broken_rule("a lane outside the mask called a warp function", lane, mask);
  std::unique_lock lock(warp.mutex);
  Exchange& e = warp.by_mask[mask];
  e.value[lane] = value;
  e.arrived |= 1u << lane;
  const std::uint64_t mine = e.completed;
  if (e.arrived == mask) {
    std::copy(std::begin(e.value), std::end(e.value), std::begin(e.answer));
    e.arrived = 0;
    ++e.completed;
    progress.fetch_add(1, std::memory_order_relaxed);
    warp.changed.notify_all();
  } else {
    warp.changed.wait(lock, [&] { return e.completed != mine || (warp.exited & mask) != 0; });
    if (e.completed == mine) {
      broken_rule("a lane of the mask left the kernel (a vote or shuffle needs every lane of its mask)", lane, mask);
    }
  }
  std::array<unsigned long long, 32> answer;
  std::copy(std::begin(e.answer), std::end(e.answer), answer.begin());
  return answer;
}

dim3 unflatten(unsigned i, dim3 shape) { return dim3(i % shape.x, i / shape.x % shape.y, i / shape.x / shape.y); }

bool launchable(dim3 grid, dim3 block, std::size_t shared_bytes) {
  const unsigned long long threads = 1ull * block.x * block.y * block.z;
  return threads >= 1 && threads <= 1024 && block.z <= 64 && grid.x >= 1 && grid.y >= 1 && grid.z >= 1 &&
         grid.x <= 2147483647u && grid.y <= 65535 && grid.z <= 65535 && shared_bytes == 0;
}

// The OS threads that play a launch's CUDA threads, made once and kept: making 256 threads per
// launch cost more than most launches' work. Thread t of the pool plays CUDA thread t.
class Workers {
 public:
  // Runs play(t) on threads t = 0 .. count - 1; returns when every one has returned. A launch
  // that makes no progress for kPatience stops the test: it would hang on a GPU.
  void run(unsigned count, const std::function<void(unsigned)>& play) {
    if (owner_ != getpid()) forget_after_fork();
    while (workers_.size() < count) start(static_cast<unsigned>(workers_.size()));
    play_ = &play;
    playing_.store(count);
    for (unsigned t = 0; t < count; ++t) workers_[t]->go.release();
    std::uint64_t seen = progress.load();
    auto since = std::chrono::steady_clock::now();
    while (!finished_.try_acquire_for(std::chrono::seconds(1))) {
      if (progress.load() != seen) {
        seen = progress.load();
        since = std::chrono::steady_clock::now();
      } else if (std::chrono::steady_clock::now() - since > kPatience) {
        std::fprintf(stderr,
                     "cuda_on_cpu: a launch of %u threads a block made no progress for 60 s: some thread "
                     "never reaches a __syncthreads, or some lane never joins a vote or shuffle of its mask\n",
                     count);
        std::abort();
      }
    }
  }

 private:
  struct Worker {
    std::binary_semaphore go{0};
  };

  void start(unsigned t) {
    workers_.push_back(std::make_unique<Worker>());
    Worker* worker = workers_.back().get();
    std::thread([this, worker, t] {
      for (;;) {
        worker->go.acquire();
        (*play_)(t);
        if (playing_.fetch_sub(1) == 1) finished_.release();
      }
    }).detach();  // parked on `go` until the process ends
  }

  // A forked child (a death test) has none of the parent's threads: their semaphores are left.
  void forget_after_fork() {
    for (auto& worker : workers_) worker.release();
    workers_.clear();
    owner_ = getpid();
  }

  std::vector<std::unique_ptr<Worker>> workers_;
  const std::function<void(unsigned)>* play_ = nullptr;
  std::atomic<unsigned> playing_{0};
  std::binary_semaphore finished_{0};
  pid_t owner_ = getpid();
};

std::mutex launch_mutex;  // one launch at a time: __shared__ variables are statics, one pool

// The order a launch runs its blocks in: shuffled, the same way in every run (a seed per launch),
// so that a kernel whose blocks depend on each other's order or race fails here too.
std::vector<unsigned long long> block_order(unsigned long long blocks) {
  static std::uint64_t launches = 0;
  std::vector<unsigned long long> order(blocks);
  for (unsigned long long b = 0; b < blocks; ++b) order[b] = b;
  std::mt19937_64 rng(++launches);
  std::shuffle(order.begin(), order.end(), rng);
  return order;
}

}  // namespace

void launch(const std::function<void()>& kernel, dim3 grid, dim3 block, std::size_t shared_bytes, cudaStream_t stream) {
  refuse_work_while_capturing(stream, "a kernel launch");
  if (!launchable(grid, block, shared_bytes)) {  // dynamic shared memory is not modelled: refused too
    fail_with(cudaErrorInvalidConfiguration);
    return;
  }
  std::lock_guard one_launch(launch_mutex);
  static Workers* const workers = new Workers;  // never destroyed: its threads outlive main
  const unsigned threads = block.x * block.y * block.z;
  const unsigned long long blocks = 1ull * grid.x * grid.y * grid.z;
  Block shared(threads);
  struct NextBlock {
    Block* block;
    void operator()() noexcept { block->next(); }
  };
  std::barrier block_done(threads, NextBlock{&shared});
  const std::vector<unsigned long long> order = block_order(blocks);
  scribble_shared_memory();
  workers->run(threads, [&](unsigned t) {
    running = &shared;
    flat_thread = t;
    place() = Place{unflatten(t, block), dim3(), block, grid};
    for (unsigned long long b : order) {
      place().block = unflatten(static_cast<unsigned>(b), grid);
      kernel();
      leave_kernel();
      block_done.arrive_and_wait();
    }
    running = nullptr;
  });
}

void shared_memory(void* start, std::size_t bytes) {
  std::lock_guard lock(shared_mutex);
  if (shared_regions.emplace(start, bytes).second) std::memset(start, 0xFF, bytes);  // before any thread writes
}

}  // namespace onebit_cuda_on_cpu

using namespace onebit_cuda_on_cpu;

void __syncthreads() {
  if (running == nullptr) broken_rule("__syncthreads called outside a kernel", 0, 0);
  running->sync->arrive_and_wait();
}

unsigned __ballot_sync(unsigned mask, bool predicate) {
  const auto values = exchange(mask, predicate ? 1 : 0);
  unsigned word = 0;
  for (unsigned lane = 0; lane < 32; ++lane) {
    if ((mask >> lane & 1u) != 0 && values[lane] != 0) word |= 1u << lane;
  }
  return word;
}

unsigned long long onebit_cuda_on_cpu_shuffle_down(unsigned mask, unsigned long long bits, unsigned delta) {
  const unsigned lane = flat_thread % 32;
  const auto values = exchange(mask, bits);
  // CUDA: a source lane past the warp's width (32) gives the caller's own value; one that is not
  // in the mask (absent lanes of a partial warp included) is undefined.
  const unsigned source = lane + delta;
  if (source >= 32) return bits;
  if ((mask >> source & 1u) == 0) broken_rule("__shfl_down_sync reads a lane outside the mask", lane, mask);
  return values[source];
}

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return fail_with(cudaErrorInvalidValue);
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return fail_with(cudaErrorInvalidValue);
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : fail_with(cudaErrorInvalidDevice); }

cudaError_t cudaMalloc(void** pointer, std::size_t bytes) { return allocate(pointer, bytes, cudaMemoryTypeDevice); }

cudaError_t cudaFree(void* pointer) { return release(pointer, cudaMemoryTypeDevice); }

cudaError_t cudaHostAlloc(void** pointer, std::size_t bytes, unsigned) {
  return allocate(pointer, bytes, cudaMemoryTypeHost);
}

cudaError_t cudaFreeHost(void* pointer) { return release(pointer, cudaMemoryTypeHost); }

cudaError_t cudaHostGetDevicePointer(void** device, void* host, unsigned) {
  std::lock_guard lock(memory_mutex);
  const Allocation* found = find_allocation(host, 1);
  if (device == nullptr || found == nullptr || found->type != cudaMemoryTypeHost) {
    return fail_with(cudaErrorInvalidValue);
  }
  *device = host;  // one address space
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* pointer) {
  if (attributes == nullptr) return fail_with(cudaErrorInvalidValue);
  std::lock_guard lock(memory_mutex);
  const Allocation* found = find_allocation(pointer, 1);
  const cudaMemoryType type = found == nullptr ? cudaMemoryTypeUnregistered : found->type;
  *attributes = cudaPointerAttributes{type, type == cudaMemoryTypeDevice ? 0 : -1,
                                      found == nullptr ? nullptr : const_cast<void*>(pointer),
                                      type == cudaMemoryTypeDevice ? nullptr : const_cast<void*>(pointer)};
  return cudaSuccess;  // as CUDA ≥ 11 answers for memory it does not know: unregistered
}

cudaError_t cudaMemcpy(void* to, const void* from, std::size_t bytes, cudaMemcpyKind kind) {
  return copy(to, from, bytes, kind);
}

cudaError_t cudaMemcpyAsync(void* to, const void* from, std::size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  refuse_work_while_capturing(stream, "cudaMemcpyAsync");
  return copy(to, from, bytes, kind);
}

cudaError_t cudaMemset(void* pointer, int value, std::size_t bytes) {
  if (bytes != 0 && !device_side(pointer, bytes)) return fail_with(cudaErrorInvalidValue);
  std::memset(pointer, value, bytes);
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  if (stream == nullptr) return fail_with(cudaErrorInvalidValue);
  *stream = reinterpret_cast<cudaStream_t>(new char);
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  {
    std::lock_guard lock(capture_mutex);
    captures.erase(stream);  // its address may be a new stream's next
  }
  delete reinterpret_cast<char*>(stream);
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {  // every launch has finished
  std::lock_guard lock(capture_mutex);
  const auto capture = captures.find(stream);
  if (capture == captures.end()) return cudaSuccess;
  capture->second = true;  // as CUDA: the capture is invalidated
  return fail_with(cudaErrorStreamCaptureUnsupported);
}

cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode) {
  if (stream == nullptr) return fail_with(cudaErrorStreamCaptureUnsupported);  // the legacy stream cannot capture
  std::lock_guard lock(capture_mutex);
  if (!captures.emplace(stream, false).second) return fail_with(cudaErrorIllegalState);
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  if (graph == nullptr) return fail_with(cudaErrorInvalidValue);
  std::lock_guard lock(capture_mutex);
  const auto capture = captures.find(stream);
  if (capture == captures.end()) return fail_with(cudaErrorIllegalState);
  const bool invalidated = capture->second;
  captures.erase(capture);
  *graph = nullptr;
  return invalidated ? fail_with(cudaErrorStreamCaptureInvalidated) : cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  if (status == nullptr) return fail_with(cudaErrorInvalidValue);
  std::lock_guard lock(capture_mutex);
  if (stream == nullptr && !captures.empty()) return fail_with(cudaErrorStreamCaptureImplicit);  // the legacy stream
  const auto capture = captures.find(stream);
  *status = capture == captures.end() ? cudaStreamCaptureStatusNone
            : capture->second         ? cudaStreamCaptureStatusInvalidated
                                      : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  return graph == nullptr ? cudaSuccess : fail_with(cudaErrorInvalidValue);
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* properties, int device) {
  if (properties == nullptr || device != 0)
    return fail_with(properties == nullptr ? cudaErrorInvalidValue : cudaErrorInvalidDevice);
  *properties = cudaDeviceProp{};
  std::snprintf(properties->name, sizeof properties->name, "the CPU's CUDA stand-in (tests/cuda_on_cpu)");
  properties->multiProcessorCount = 1;
  properties->maxThreadsPerBlock = 1024;
  return cudaSuccess;
}

struct CUevent_st {
  std::chrono::steady_clock::time_point recorded;
  bool was_recorded = false;
};

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  if (event == nullptr) return fail_with(cudaErrorInvalidValue);
  *event = new CUevent_st;
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned) { return cudaEventCreate(event); }

cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t event, unsigned) {
  return event == nullptr ? fail_with(cudaErrorInvalidValue) : cudaSuccess;  // it has happened: launches finish
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete event;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t) {
  if (event == nullptr) return fail_with(cudaErrorInvalidValue);
  event->recorded = std::chrono::steady_clock::now();
  event->was_recorded = true;
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  return event == nullptr ? fail_with(cudaErrorInvalidValue) : cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* milliseconds, cudaEvent_t start, cudaEvent_t end) {
  if (milliseconds == nullptr || start == nullptr || end == nullptr || !start->was_recorded || !end->was_recorded) {
    return fail_with(cudaErrorInvalidValue);
  }
  *milliseconds = std::chrono::duration<float, std::milli>(end->recorded - start->recorded).count();
  return cudaSuccess;
}

cudaError_t cudaGetLastError() {
  const cudaError_t error = last_error;
  last_error = cudaSuccess;
  return error;
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureImplicit:
      return "operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorIllegalState: return "the operation is not permitted in the current state";
  }
  return "unrecognized error code";
}
