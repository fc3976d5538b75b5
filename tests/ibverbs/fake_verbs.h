// An in-process stand-in for an RDMA adapter, for the verbs transport's tests on hosts that have
// none (these machines cannot load rxe or siw). It is a test double for hardware only: the
// transport above it is the real one, and tools/rdma-check.sh runs the same tests on a device.
//
// One InfiniBand device "fake0", port 1, active, 4096-byte MTU. Queue pairs of every transport in
// the process (ranks are threads) reach each other by QP number; an RDMA write copies into the
// target's memory after checking its rkey and bounds, and both sides get completions as hardware
// gives them: the writer IBV_WC_RDMA_WRITE, the target IBV_WC_RECV_RDMA_WITH_IMM on a posted
// receive. A SEND waits at the target until it posts a receive (hardware's RNR retry, forever). A
// queue pair in the error state flushes its receives; work towards a destroyed one fails with
// IBV_WC_RETRY_EXC_ERR, as towards a dead host.
#pragma once

#include "transport/ibverbs/verbs_api.h"

namespace onebit::transport::ibverbs::testing {

const VerbsApi& fake_verbs();

// While alive, verbs() is the stand-in.
class UseFakeVerbs {
 public:
  UseFakeVerbs() { use_verbs_for_testing(&fake_verbs()); }
  ~UseFakeVerbs() { use_verbs_for_testing(nullptr); }
};

}  // namespace onebit::transport::ibverbs::testing
