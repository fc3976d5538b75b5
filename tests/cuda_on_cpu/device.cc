// The stand-in CUDA runtime and device of cuda_runtime.h: what it models, and what not, is said
// there. Memory: a registry of what cudaMalloc and cudaHostAlloc gave out. Launches: one at a time,
// on the launching thread, a block's threads as fibers meeting at __syncthreads and in their warps'
// exchanges, resumed in a shuffled order; the blocks one after another, in a shuffled order.
#include "cuda_runtime.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <vector>

#include <dlfcn.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#else
#define ASAN_POISON_MEMORY_REGION(start, bytes) ((void)(start), (void)(bytes))
#define ASAN_UNPOISON_MEMORY_REGION(start, bytes) ((void)(start), (void)(bytes))
inline void __sanitizer_start_switch_fiber(void**, const void*, std::size_t) {}
inline void __sanitizer_finish_switch_fiber(void*, const void**, std::size_t*) {}
#endif

namespace onebit_cuda_on_cpu {

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

// ---- the running launch: a block's CUDA threads as fibers ----
//
// One launch at a time runs, on the launching OS thread: each CUDA thread of a block is a fiber (a
// stack and a saved context) that runs until it must wait (at __syncthreads, in a vote or shuffle
// whose lanes have not all come) or leaves the kernel. The scheduler resumes the fibers that can go
// on, in a shuffled order each round, so that a thread reading what another writes without a
// __syncthreads between them reads it before it is written in some rounds: a missing barrier gives
// wrong answers, the same ones in every run of the same tests. When no fiber can go on and some are
// still in the kernel, the kernel would hang on a GPU; the test stops instead, naming the block.

// __shared__ variables: the lowering registers each (shared_memory below); every block finds them
// scribbled with 0xFF bytes (NaN as floats), as a GPU's shared memory holds whatever was there.
std::mutex shared_mutex;
std::map<void*, std::size_t> shared_regions;

void scribble_shared_memory() {
  std::lock_guard lock(shared_mutex);
  for (const auto& [start, bytes] : shared_regions) std::memset(start, 0xFF, bytes);
}

// What a fiber waits for, if anything, when it is not running.
enum class Waiting { kNothing, kSyncthreads, kExchange, kExited };

struct Fiber {
  ucontext_t context{};
  char* stack = nullptr;  // kStackBytes, the lowest page a guard
  void* asan_fake_stack = nullptr;
  Place place;
  unsigned flat_thread = 0;  // threadIdx, flattened
  Waiting waiting = Waiting::kExited;
  bool started = false;  // resumed once: parked in play() since
};

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
  unsigned lanes = 0;   // that exist (the last warp of a block may have fewer)
  unsigned exited = 0;  // lanes that have left the kernel in this block
  std::map<unsigned, Exchange> by_mask;
};

// The running block's meeting points: __syncthreads, a barrier of the threads still in the kernel,
// and each warp's exchanges.
struct Block {
  std::vector<Fiber*> fibers;  // fibers[t] plays CUDA thread t
  unsigned in_kernel = 0;
  unsigned at_syncthreads = 0;
  std::vector<Warp> warps;
};

// The running launch (launch_mutex held), on the thread that launched it: the kernel, its block,
// the fiber running now. Per thread, so that another thread (a rank as a thread) is never taken to
// be inside this launch's kernel. A fiber never moves to another thread.
thread_local const std::function<void()>* running_kernel = nullptr;
thread_local Block* running_block = nullptr;
thread_local Fiber* running_fiber = nullptr;

// glibc's swapcontext; under ASan, past ASan's interception of it (which warns of false positives
// and clears the whole target stack's shadow at every switch): each switch is told to ASan as a
// fiber switch instead (Fibers::resume and wait).
int swap_context(ucontext_t* from, const ucontext_t* to) {
#if defined(__SANITIZE_ADDRESS__)
  using Swap = int (*)(ucontext_t*, const ucontext_t*);
  static const Swap libc_swapcontext = [] {
    void* libc = dlopen("libc.so.6", RTLD_NOLOAD | RTLD_LAZY);
    return libc == nullptr ? nullptr : reinterpret_cast<Swap>(dlsym(libc, "swapcontext"));
  }();
  if (libc_swapcontext != nullptr) return libc_swapcontext(from, to);
#endif
  return swapcontext(from, to);
}

constexpr std::size_t kStackBytes = 128 * 1024;

// The fibers of one OS thread's launches, made once and kept (fiber t plays CUDA thread t of every
// block); each is parked between blocks where it left its last kernel.
class Fibers {
 public:
  Fibers() = default;
  Fibers(const Fibers&) = delete;
  Fibers& operator=(const Fibers&) = delete;
  // At the thread's end: each fiber is resumed once more to leave for good, telling ASan so (which
  // then frees the fiber's fake stack, kept when stack-use-after-return detection is on), then its
  // stack is unmapped.
  ~Fibers() {
    ending_ = true;
    for (auto& fiber : fibers_) {
      if (fiber->started) resume(*fiber);
      ASAN_UNPOISON_MEMORY_REGION(fiber->stack, kStackBytes);
      munmap(fiber->stack, kStackBytes);
    }
  }

  // The first `count` fibers, made if missing.
  std::vector<Fiber*> first(unsigned count) {
    while (fibers_.size() < count) fibers_.push_back(make());
    std::vector<Fiber*> chosen(count);
    for (unsigned t = 0; t < count; ++t) chosen[t] = fibers_[t].get();
    return chosen;
  }

  // Runs `fiber` until it waits or leaves the kernel.
  void resume(Fiber& fiber) {
    fiber.started = true;
    running_fiber = &fiber;
    void* fake_stack = nullptr;
    __sanitizer_start_switch_fiber(&fake_stack, fiber.stack, kStackBytes);
    swap_context(&scheduler_, &fiber.context);
    __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
    running_fiber = nullptr;
  }

  // The running fiber gives the thread back to the scheduler until resumed.
  void wait(Waiting what) {
    Fiber& fiber = *running_fiber;
    fiber.waiting = what;
    __sanitizer_start_switch_fiber(&fiber.asan_fake_stack, scheduler_stack_, scheduler_stack_bytes_);
    swap_context(&fiber.context, &scheduler_);
    __sanitizer_finish_switch_fiber(fiber.asan_fake_stack, &scheduler_stack_, &scheduler_stack_bytes_);
  }

 private:
  std::unique_ptr<Fiber> make() {
    auto fiber = std::make_unique<Fiber>();
    void* stack =
        mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (stack == MAP_FAILED || mprotect(stack, 4096, PROT_NONE) != 0 || getcontext(&fiber->context) != 0) {
      std::fprintf(stderr, "cuda_on_cpu: no memory for a CUDA thread's stack\n");
      std::abort();
    }
    fiber->stack = static_cast<char*>(stack);
    fiber->context.uc_stack.ss_sp = stack;
    fiber->context.uc_stack.ss_size = kStackBytes;
    fiber->context.uc_link = nullptr;  // play() never returns
    makecontext(&fiber->context, &Fibers::play, 0);
    return fiber;
  }

  // A fiber's life: the running block's kernel, then parked until the next block it plays.
  static void play();

  std::vector<std::unique_ptr<Fiber>> fibers_;
  ucontext_t scheduler_{};
  const void* scheduler_stack_ = nullptr;  // for ASan: the OS thread's own stack
  std::size_t scheduler_stack_bytes_ = 0;
  bool ending_ = false;  // the thread ends: a resumed fiber leaves for good
};

Fibers& this_threads_fibers() {
  thread_local Fibers fibers;
  return fibers;
}

// This thread's kernel has returned: it leaves the block's barrier (releasing it if every other
// thread still in the kernel waits there) and its warp's exchanges (lanes waiting on it wake to
// fail).
void leave_kernel() {
  Block& block = *running_block;
  Fiber& me = *running_fiber;
  Warp& warp = block.warps[me.flat_thread / 32];
  warp.exited |= 1u << (me.flat_thread % 32);
  for (unsigned lane = 0; lane < warp.lanes; ++lane) {
    Fiber& other = *block.fibers[me.flat_thread / 32 * 32 + lane];
    if (other.waiting == Waiting::kExchange) other.waiting = Waiting::kNothing;  // to look again
  }
  --block.in_kernel;
  if (block.at_syncthreads != 0 && block.at_syncthreads == block.in_kernel) {
    for (Fiber* fiber : block.fibers) {
      if (fiber->waiting == Waiting::kSyncthreads) fiber->waiting = Waiting::kNothing;
    }
    block.at_syncthreads = 0;
  }
}

void Fibers::play() {
  Fibers& self = this_threads_fibers();
  __sanitizer_finish_switch_fiber(nullptr, &self.scheduler_stack_, &self.scheduler_stack_bytes_);
  for (;;) {
    (*running_kernel)();
    leave_kernel();
    self.wait(Waiting::kExited);
    if (self.ending_) {  // never resumed again: ASan may free this fiber's fake stack
      Fiber& fiber = *running_fiber;
      __sanitizer_start_switch_fiber(nullptr, self.scheduler_stack_, self.scheduler_stack_bytes_);
      swap_context(&fiber.context, &self.scheduler_);
    }
  }
}

// The block can make no progress: some threads wait at __syncthreads or in an exchange that can
// never complete. A GPU would hang; the test stops, naming the block and who waits where.
[[noreturn]] void stuck(const Block& block) {
  unsigned at_syncthreads = 0, in_exchange = 0;
  for (const Fiber* fiber : block.fibers) {
    at_syncthreads += fiber->waiting == Waiting::kSyncthreads;
    in_exchange += fiber->waiting == Waiting::kExchange;
  }
  const dim3 where = block.fibers[0]->place.block;
  std::fprintf(stderr,
               "cuda_on_cpu: block (%u,%u,%u) can make no progress (a GPU would hang): %u threads wait at "
               "__syncthreads, %u in a vote or shuffle whose lanes are not all coming\n",
               where.x, where.y, where.z, at_syncthreads, in_exchange);
  std::abort();
}

// Runs one block of the running launch to its end: rounds of resuming, in a shuffled order, every
// fiber that can go on.
void run_block(Block& block, dim3 block_index, std::mt19937_64& rng) {
  for (Warp& warp : block.warps) {
    warp.exited = 0;
    warp.by_mask.clear();
  }
  block.in_kernel = static_cast<unsigned>(block.fibers.size());
  block.at_syncthreads = 0;
  for (Fiber* fiber : block.fibers) {
    fiber->place.block = block_index;
    fiber->waiting = Waiting::kNothing;
  }
  scribble_shared_memory();
  Fibers& fibers = this_threads_fibers();
  std::vector<Fiber*> round;
  for (;;) {
    round.clear();
    for (Fiber* fiber : block.fibers) {
      if (fiber->waiting == Waiting::kNothing) round.push_back(fiber);
    }
    if (round.empty()) {
      if (block.in_kernel == 0) return;
      stuck(block);
    }
    std::shuffle(round.begin(), round.end(), rng);
    for (Fiber* fiber : round) fibers.resume(*fiber);  // only a fiber itself starts waiting
  }
}

// One exchange of `value` among the lanes of `mask`; returns every lane's value.
std::array<unsigned long long, 32> exchange(unsigned mask, unsigned long long value) {
  if (running_fiber == nullptr) broken_rule("a warp function called outside a kernel", 0, mask);
  const unsigned flat_thread = running_fiber->flat_thread;
  Warp& warp = running_block->warps[flat_thread / 32];
  const unsigned lane = flat_thread % 32;
  const unsigned existing = warp.lanes == 32 ? ~0u : (1u << warp.lanes) - 1;
  if ((mask & ~existing) != 0) broken_rule("the mask names lanes this warp does not have", lane, mask);
  if ((mask >> lane & 1u) == 0) broken_rule("a lane outside the mask called a warp function", lane, mask);
  Exchange& e = warp.by_mask[mask];
  e.value[lane] = value;
  e.arrived |= 1u << lane;
  const std::uint64_t mine = e.completed;
  if (e.arrived == mask) {
    std::copy(std::begin(e.value), std::end(e.value), std::begin(e.answer));
    e.arrived = 0;
    ++e.completed;
    for (unsigned l = 0; l < warp.lanes; ++l) {
      Fiber& other = *running_block->fibers[flat_thread / 32 * 32 + l];
      if ((mask >> l & 1u) != 0 && other.waiting == Waiting::kExchange) other.waiting = Waiting::kNothing;
    }
    this_threads_fibers().wait(Waiting::kNothing);  // the last to come goes on in a shuffled order too
  }
  while (e.completed == mine) {
    if ((warp.exited & mask) != 0) {
      broken_rule("a lane of the mask left the kernel (a vote or shuffle needs every lane of its mask)", lane, mask);
    }
    this_threads_fibers().wait(Waiting::kExchange);
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

std::mutex launch_mutex;  // one launch at a time: __shared__ variables are statics

// The order a launch runs its blocks in: shuffled, the same way in every run of the same tests (a
// seed per launch), so that a kernel whose blocks depend on each other's order or race fails here.
std::vector<unsigned long long> block_order(unsigned long long blocks, std::mt19937_64& rng) {
  std::vector<unsigned long long> order(blocks);
  for (unsigned long long b = 0; b < blocks; ++b) order[b] = b;
  std::shuffle(order.begin(), order.end(), rng);
  return order;
}

}  // namespace

Place& place() {
  static Place outside_any_kernel;
  return running_fiber != nullptr ? running_fiber->place : outside_any_kernel;
}

void launch(const std::function<void()>& kernel, dim3 grid, dim3 block, std::size_t shared_bytes, cudaStream_t stream) {
  refuse_work_while_capturing(stream, "a kernel launch");
  if (!launchable(grid, block, shared_bytes)) {  // dynamic shared memory is not modelled: refused too
    fail_with(cudaErrorInvalidConfiguration);
    return;
  }
  std::lock_guard one_launch(launch_mutex);
  static std::uint64_t launches = 0;
  std::mt19937_64 rng(++launches);
  const unsigned threads = block.x * block.y * block.z;
  Block running;
  running.fibers = this_threads_fibers().first(threads);
  running.warps.resize((threads + 31) / 32);
  for (unsigned w = 0; w < running.warps.size(); ++w) running.warps[w].lanes = std::min(32u, threads - 32 * w);
  for (unsigned t = 0; t < threads; ++t) {
    running.fibers[t]->flat_thread = t;
    running.fibers[t]->place = Place{unflatten(t, block), dim3(), block, grid};
  }
  running_kernel = &kernel;
  running_block = &running;
  for (unsigned long long b : block_order(1ull * grid.x * grid.y * grid.z, rng)) {
    run_block(running, unflatten(static_cast<unsigned>(b), grid), rng);
  }
  running_block = nullptr;
  running_kernel = nullptr;
}

void shared_memory(void* start, std::size_t bytes) {
  std::lock_guard lock(shared_mutex);
  if (shared_regions.emplace(start, bytes).second) std::memset(start, 0xFF, bytes);  // before any thread writes
}

}  // namespace onebit_cuda_on_cpu

using namespace onebit_cuda_on_cpu;

void __syncthreads() {
  if (running_fiber == nullptr) broken_rule("__syncthreads called outside a kernel", 0, 0);
  Block& block = *running_block;
  if (++block.at_syncthreads == block.in_kernel) {  // the last to come: every waiting thread goes on
    for (Fiber* fiber : block.fibers) {
      if (fiber->waiting == Waiting::kSyncthreads) fiber->waiting = Waiting::kNothing;
    }
    block.at_syncthreads = 0;
    this_threads_fibers().wait(Waiting::kNothing);  // the others may run first
    return;
  }
  this_threads_fibers().wait(Waiting::kSyncthreads);
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
  const unsigned lane = running_fiber == nullptr ? 0 : running_fiber->flat_thread % 32;
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
