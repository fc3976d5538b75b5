// The compressed allreduce of docs/algorithm.md on CUDA buffers, over an NCCL communicator: the engine's
// device path, used by the ncclAllReduce front door. It shares the CPU engine's chunk geometry
// (chunk_geometry.h) and tag lifetime (a Tag owns its CudaTagState, as it owns its TagState), and
// moves bytes through transport/nccl. Everything is enqueued on the caller's stream:
//
//   worker kernel → group of pncclSend/pncclRecv: every rank's bits of chunk j and its scale to
//   rank j → server kernel → group: every server's bits and scale to every rank → unpack kernels
//   → revert_unless_finite (a NaN/Inf anywhere leaves the error state as it was)
//
// No host synchronisation and no allocation after a tag's first call on a communicator, so a call
// may be captured in a CUDA graph once its tag has run outside capture: which error buffer is
// current is a parity on the device, read by every kernel and flipped by the call's last one, so
// each replay builds on the one before. The first call allocates and zeroes the device state (and
// applies a restored checkpoint) and synchronises once. A call from another stream than the tag's
// last one waits for that call on the device (not across capture: a captured call records no
// event, and the replays are ordered by the stream the graph is launched on).
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>

#include "engine/tag_registry.h"
#include "kernels/cpu/cpu_kernels.h"

namespace onebit {

struct CudaAllreduceCall {
  const void* send;
  void* recv;
  std::size_t count;
  kernels::Dtype dtype;
  bool sum;  // ncclSum (W × the average) rather than ncclAvg
  ncclComm_t comm;
  std::uint64_t comm_id;  // process-unique, keys the tag's device state (a reused ncclComm_t address gets a new id)
  cudaStream_t stream;
  bool captured = false;  // enqueued into a CUDA graph being captured (replayed later, without the host)
  // Whether comm_id still names a live communicator, asked once the call holds its tag (null: not
  // asked): a call that took its id just before another thread began to destroy or abort the
  // communicator is refused before it makes state under the dead id (the front door's table).
  bool (*live)(ncclComm_t comm, std::uint64_t comm_id) = nullptr;
};

// Enqueues the call. Throws onebit::Error (nothing enqueued for this call's state if it throws
// before the first kernel). Holds tag.busy while enqueueing: a concurrent call on the same tag
// from another thread is an error, as on the CPU path. Returns the bytes this rank sends.
std::uint64_t cuda_compressed_allreduce(Tag& tag, const CudaAllreduceCall& call);

// Whether the tag's first call on this communicator (which allocates) has happened.
bool has_device_state(Tag& tag, std::uint64_t comm_id);

}  // namespace onebit
