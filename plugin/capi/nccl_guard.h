// The boundary between onebit's C++ and NCCL's C ABI, shared by both NCCL-facing libraries (the
// ncclAllReduce front door and the NCCL_NET plugin), as abi_guard.h is for onebit's own ABI: every
// extern "C" body runs inside nccl_guard, nothing throws across the ABI, the error is logged once
// with the entry point's name, and onebit's code becomes NCCL's by the one table below
// (docs/usage/nccl.md, "Errors at the NCCL boundary").
//
// The header needs no nccl.h: the NCCL_NET plugin declares the ABI itself (nccl_net_abi.h), the
// front door includes nccl.h. Each passes its ncclResult_t as `Result`; the values are NCCL's
// ABI, stable since NCCL 2.0, and checked against nccl.h where it is included.
#pragma once

#include <new>
#include <string>

#include "common/error.h"

namespace onebit {

// ncclResult_t's values.
enum class NcclCode : int {
  kSuccess = 0,
  kUnhandledCudaError = 1,
  kSystemError = 2,
  kInternalError = 3,
  kInvalidArgument = 4,
  kInvalidUsage = 5,
  kRemoteError = 6,
};

// The one mapping of onebit's codes to NCCL's.
constexpr NcclCode nccl_code_of(onebit_result_t code) {
  switch (code) {
    case ONEBIT_SUCCESS: return NcclCode::kSuccess;
    case ONEBIT_INVALID_ARGUMENT: return NcclCode::kInvalidArgument;  // the caller's argument (NCCL's, or the user's)
    case ONEBIT_NUMERIC_ERROR: return NcclCode::kInvalidArgument;     // the input holds NaN or Inf
    case ONEBIT_MISMATCH: return NcclCode::kInvalidUsage;             // ranks called differently
    case ONEBIT_SYSTEM_ERROR: return NcclCode::kSystemError;          // this host: sockets, CUDA, memory
    case ONEBIT_TIMEOUT: return NcclCode::kRemoteError;               // a peer that does not answer in time
    case ONEBIT_REMOTE_ERROR: return NcclCode::kRemoteError;          // a peer that failed or went away
    default: return NcclCode::kInternalError;
  }
}

// Runs `body`; an exception becomes `Result` and one line through `log(warning, text)`.
template <typename Result, typename Log, typename Body>
Result nccl_guard(const char* entry_point, Log&& log, Body&& body) noexcept {
  NcclCode result = NcclCode::kInternalError;
  try {
    std::string text;
    try {
      body();
      return static_cast<Result>(static_cast<int>(NcclCode::kSuccess));
    } catch (const Error& error) {
      result = nccl_code_of(error.code());
      text = error.what();
    } catch (const std::bad_alloc&) {
      result = NcclCode::kSystemError;
      text = "out of memory";
    } catch (const std::exception& error) {
      text = std::string("internal error: ") + error.what();
    } catch (...) {
      text = "internal error: unknown exception";
    }
    log(true, std::string(entry_point) + ": " + text);
  } catch (...) {  // out of memory for the log line itself: the code still goes back
  }
  return static_cast<Result>(static_cast<int>(result));
}

}  // namespace onebit
