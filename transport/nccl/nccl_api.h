// NCCL's own entry points, for the ncclAllReduce front door: the strong pncclX twins of the calls
// the door defines (facts.md: NCCL's public calls are weak), looked up in the libnccl.so.2 the
// process has loaded. Nothing here links NCCL, so the door loads, and does nothing, in a process
// without NCCL or a GPU.
#pragma once

#include <nccl.h>

#include <cstddef>

namespace onebit::transport::nccl {

struct NcclApi {
  decltype(&pncclAllReduce) all_reduce = nullptr;
  decltype(&pncclSend) send = nullptr;
  decltype(&pncclRecv) recv = nullptr;
  decltype(&pncclGroupStart) group_start = nullptr;
  decltype(&pncclGroupEnd) group_end = nullptr;
  decltype(&pncclCommCount) comm_count = nullptr;
  decltype(&pncclCommUserRank) comm_user_rank = nullptr;
  decltype(&pncclCommDestroy) comm_destroy = nullptr;
  decltype(&pncclCommAbort) comm_abort = nullptr;
  // The calls the door passes through only to learn about communicators and groups; absent from
  // older NCCLs, so not part of complete().
  decltype(&pncclGroupSimulateEnd) group_simulate_end = nullptr;
  decltype(&pncclCommInitRankConfig) comm_init_rank_config = nullptr;
  decltype(&pncclCommInitRankScalable) comm_init_rank_scalable = nullptr;
  decltype(&pncclCommSplit) comm_split = nullptr;
  decltype(&pncclCommShrink) comm_shrink = nullptr;

  // Everything the compressed path calls.
  bool complete() const {
    return all_reduce && send && recv && group_start && group_end && comm_count && comm_user_rank;
  }
};

// Looked up until complete: a program may call in before it has loaded NCCL (then its calls fail
// with ncclSystemError), and succeed once it has.
const NcclApi& nccl_api();

// The bytes of one element of `type`; 0 for a type this build does not know. NCCL 2.24 added the
// one-byte float8 types, 10 and 11, which older headers do not name.
inline std::size_t element_bytes(ncclDataType_t type) {
  switch (static_cast<int>(type)) {
    case ncclInt8:
    case ncclUint8:
    case 10:  // ncclFloat8e4m3
    case 11:  // ncclFloat8e5m2
      return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 0;
  }
}

// Throws onebit::Error naming `what` and NCCL's code when `result` is not ncclSuccess.
void check_nccl(ncclResult_t result, const char* what);

}  // namespace onebit::transport::nccl
