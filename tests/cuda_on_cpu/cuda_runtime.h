// A stand-in for the CUDA runtime and device, so that onebit's CUDA kernels (kernels/cuda,
// optim/cuda), the device steps' ABI (plugin/capi/device_steps.cc) and their GPU tests (tests/cuda)
// run on a machine without a GPU, against the same CPU oracles (docs/design/gpu.md, "The CUDA code on
// the CPU"). The .cu files are compiled as C++ after lower_launches.py has rewritten each
// `kernel<<<grid, block, shared, stream>>>(args)` into a call of launch() below.
//
// What it models: one device (0); device memory is host memory that this runtime allocated and
// remembers (cudaPointerGetAttributes tells it from host memory), holding 0xFF bytes until written,
// its rounding to 256 bytes poisoned for ASan; every launch runs to completion before it returns
// (streams are in order anyway; synchronizing has nothing to wait for). A launch's arguments are
// evaluated once, on the launching thread; its blocks run one after another in a shuffled order, so
// __shared__ variables are function statics (scribbled with 0xFF for each block); a block's threads
// are fibers on the launching thread, one per CUDA thread, each running until it waits at
// __syncthreads (a barrier of the threads still in the kernel) or in a vote or shuffle, resumed in
// a shuffled order: a missing __syncthreads gives a wrong answer, the same in every run of the same
// tests. Votes and shuffles meet the lanes of their mask (disjoint masks apart) and refuse, loudly,
// a lane of the mask that has left the kernel, a mask naming lanes that do not exist, or a shuffle
// reading outside its mask. A block whose threads all wait where none can go on stops the test
// naming it, where a GPU would hang. CUDA's launch limits (grid and block sizes, an empty grid)
// fail the launch as cudaErrorInvalidConfiguration, read by cudaGetLastError.
//
// What it does not model: the GPU's memory model beyond barriers, its intrinsics' own rounding
// (__fadd_rn and friends are the host's IEEE operations, compiled without contraction; half and
// bfloat16 conversions are kernels/cpu/half.h's), graphs (a capture is only a stream's state: see
// cudaStreamBeginCapture), several devices, speed (events time the host's clock), a host thread
// reading device memory (one address space here), a thread that spins waiting for another
// without a barrier (a fiber is never preempted: the launch never returns, and ctest's limit ends
// it).
#pragma once

#include <math.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static  // the blocks of a launch run one after another

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

namespace onebit_cuda_on_cpu {
// This thread's place in the running launch (set by launch() for each of its threads). A function,
// not extern thread_local objects: GCC's UBSan misreads those through their TLS wrappers.
struct Place {
  dim3 thread, block, block_dim, grid_dim;
};
Place& place();
}  // namespace onebit_cuda_on_cpu
#define threadIdx (::onebit_cuda_on_cpu::place().thread)
#define blockIdx (::onebit_cuda_on_cpu::place().block)
#define blockDim (::onebit_cuda_on_cpu::place().block_dim)
#define gridDim (::onebit_cuda_on_cpu::place().grid_dim)

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevice = 101,
  cudaErrorIllegalState = 401,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorStreamCaptureImplicit = 906,
};
using cudaError = cudaError_t;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

enum cudaMemoryType {
  cudaMemoryTypeUnregistered = 0,
  cudaMemoryTypeHost = 1,
  cudaMemoryTypeDevice = 2,
  cudaMemoryTypeManaged = 3,
};

struct cudaPointerAttributes {
  cudaMemoryType type;
  int device;
  void* devicePointer;
  void* hostPointer;
};

struct CUstream_st;
using cudaStream_t = CUstream_st*;
struct CUevent_st;
using cudaEvent_t = CUevent_st*;  // the host's clock when recorded: every launch has finished by then

struct cudaDeviceProp {
  char name[256];
  int multiProcessorCount;
  int maxThreadsPerBlock;
};

constexpr unsigned cudaHostAllocDefault = 0;
constexpr unsigned cudaHostAllocMapped = 2;

cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaMalloc(void** pointer, std::size_t bytes);
template <typename T>
cudaError_t cudaMalloc(T** pointer, std::size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(pointer), bytes);
}
cudaError_t cudaFree(void* pointer);
cudaError_t cudaHostAlloc(void** pointer, std::size_t bytes, unsigned flags);
cudaError_t cudaFreeHost(void* pointer);
cudaError_t cudaHostGetDevicePointer(void** device, void* host, unsigned flags);
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* pointer);
cudaError_t cudaMemcpy(void* to, const void* from, std::size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* to, const void* from, std::size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
cudaError_t cudaMemset(void* pointer, int value, std::size_t bytes);
cudaError_t cudaStreamCreate(cudaStream_t* stream);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
enum cudaStreamCaptureStatus {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2,
};
enum cudaStreamCaptureMode {
  cudaStreamCaptureModeGlobal = 0,
  cudaStreamCaptureModeThreadLocal = 1,
  cudaStreamCaptureModeRelaxed = 2,
};
struct CUgraph_st;
using cudaGraph_t = CUgraph_st*;
// Capture as far as a caller can see it without a graph: between begin and end the stream reports
// capturing, a synchronize of it fails as CUDA's does and invalidates the capture (end then says
// so), and any work queued on it stops the test (nothing here records a graph). End gives no graph.
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* properties, int device);
cudaError_t cudaEventCreate(cudaEvent_t* event);
constexpr unsigned cudaEventDisableTiming = 2;
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags = 0);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float* milliseconds, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaGetLastError();
const char* cudaGetErrorString(cudaError_t error);

// Device functions.
void __syncthreads();
unsigned __ballot_sync(unsigned mask, bool predicate);
unsigned long long onebit_cuda_on_cpu_shuffle_down(unsigned mask, unsigned long long bits, unsigned delta);
template <typename T>
T __shfl_down_sync(unsigned mask, T value, unsigned delta) {
  static_assert(sizeof(T) <= sizeof(unsigned long long), "a shuffle moves at most 8 bytes");
  unsigned long long bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  bits = onebit_cuda_on_cpu_shuffle_down(mask, bits, delta);
  std::memcpy(&value, &bits, sizeof(T));
  return value;
}
inline unsigned atomicAdd(unsigned* address, unsigned value) {
  return __atomic_fetch_add(address, value, __ATOMIC_RELAXED);
}
inline unsigned long long atomicAdd(unsigned long long* address, unsigned long long value) {
  return __atomic_fetch_add(address, value, __ATOMIC_RELAXED);
}
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
using std::isfinite;

namespace onebit_cuda_on_cpu {

// Runs `kernel` (the lowered launch's call of the kernel with its arguments) on every thread of
// every block of the grid; returns when all have finished. A launch CUDA would refuse runs nothing
// and leaves cudaErrorInvalidConfiguration for cudaGetLastError.
void launch(const std::function<void()>& kernel, dim3 grid, dim3 block, std::size_t shared_bytes = 0,
            cudaStream_t stream = nullptr);

// A lowered launch: the arguments evaluated once, on the launching thread, as CUDA evaluates them;
// each CUDA thread calls the kernel with copies.
template <typename Arguments, typename Kernel>
void launch_kernel(const Arguments& arguments, const Kernel& kernel, dim3 grid, dim3 block,
                   std::size_t shared_bytes = 0, cudaStream_t stream = nullptr) {
  launch([&] { std::apply(kernel, arguments); }, grid, block, shared_bytes, stream);
}

// Registers a __shared__ variable (the lowering calls it right after each declaration): it holds
// 0xFF bytes when each block begins, as a GPU's shared memory holds whatever was there.
void shared_memory(void* start, std::size_t bytes);

}  // namespace onebit_cuda_on_cpu
