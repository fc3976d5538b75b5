#include "transport/nccl/nccl_exchange.h"

#include "common/error.h"
#include "transport/nccl/nccl_api.h"

namespace onebit::transport::nccl {

std::uint64_t exchange_with_every_peer(ncclComm_t comm, cudaStream_t stream, int rank, int size,
                                       const std::function<DeviceBytes(int)>& out,
                                       const std::function<DeviceBytes(int)>& in, float* scales,
                                       std::uint64_t* digests) {
  const NcclApi& api = nccl_api();
  std::uint64_t sent = 0;
  check_nccl(api.group_start(), "pncclGroupStart");
  try {
    for (int p = 0; p < size; ++p) {
      if (p == rank) continue;
      const DeviceBytes o = out(p), i = in(p);
      check_nccl(api.send(o.data, o.size, ncclUint8, p, comm, stream), "pncclSend (bits)");
      check_nccl(api.recv(i.data, i.size, ncclUint8, p, comm, stream), "pncclRecv (bits)");
      check_nccl(api.send(scales + rank, 1, ncclFloat32, p, comm, stream), "pncclSend (scale)");
      check_nccl(api.recv(scales + p, 1, ncclFloat32, p, comm, stream), "pncclRecv (scale)");
      sent += o.size + sizeof(float);
      if (digests != nullptr) {
        check_nccl(api.send(digests + rank, 8, ncclUint8, p, comm, stream), "pncclSend (settings digest)");
        check_nccl(api.recv(digests + p, 8, ncclUint8, p, comm, stream), "pncclRecv (settings digest)");
        sent += 8;
      }
    }
  } catch (...) {
    api.group_end();  // close the group this call opened; the first error is the one reported
    throw;
  }
  check_nccl(api.group_end(), "pncclGroupEnd");
  return sent;
}

}  // namespace onebit::transport::nccl
