// onebit's messages over an NCCL communicator: the compressed allreduce's two exchanges as groups
// of pncclSend/pncclRecv on the caller's stream (architecture.md, "Which mover a front door
// uses"). NCCL matches a group's sends and receives per peer in posting order, so every rank must
// build its groups from the same geometry — which ChunkGeometry guarantees.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <functional>

namespace onebit::transport::nccl {

struct DeviceBytes {
  void* data;
  std::size_t size;
};

// One NCCL group on `stream` in which this rank swaps with every other rank p: out(p) for in(p),
// then its own scale scales[rank] for p's scales[p] (device floats), and, with `digests`, its own
// digests[rank] for p's digests[p] (device, 8 bytes each). Returns the bytes it sends.
std::uint64_t exchange_with_every_peer(ncclComm_t comm, cudaStream_t stream, int rank, int size,
                                       const std::function<DeviceBytes(int)>& out,
                                       const std::function<DeviceBytes(int)>& in, float* scales,
                                       std::uint64_t* digests = nullptr);

}  // namespace onebit::transport::nccl
