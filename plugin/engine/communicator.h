// A communicator: W ranks over a transport (onebit's TCP mesh, or a framework's gloo context), and
// the two allreduces the engine offers — compressed (tagged buffers, algorithm.md) and an exact
// full-precision ring (everything else).
//
// Threading: calls on different tags may run concurrently from different threads; calls on one tag
// are serialised (a second concurrent call on the same tag is an error, not a wait, since it would
// reorder that tag's calls across ranks). Untagged calls are serialised and must be issued in the
// same order on every rank, as with NCCL.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "onebit/onebit.h"
#include "plugin/engine/aligned_buffer.h"
#include "plugin/engine/tag_registry.h"
#include "transport/transport.h"

namespace onebit {

enum class ReduceOp : std::uint8_t { kSum = 0, kAvg = 1 };

// Where the compressed allreduces of a communicator spent their time on this rank, in seconds,
// summed over calls: the profile behind docs/benchmarks.md's per-stage breakdown.
struct StageTimes {
  double worker = 0;        // worker pass over all chunks (sends queued as chunks are packed)
  double wait_inputs = 0;   // waiting for every rank's bits and scale
  double server = 0;        // server pass over this rank's chunk
  double wait_results = 0;  // waiting for every server's result (and this rank's sends)
  double unpack = 0;        // writing the result into the caller's buffer
  std::uint64_t calls = 0;
};

// Where a communicator comes from: explicit values, or the environment (docs/usage.md).
struct CommSetup {
  int rank = -1;
  int size = -1;
  std::string root;  // host:port
  // Zero / empty: from the ONEBIT_* variables.
  std::int64_t timeout_ms = 0;
  int sockets_per_peer = 0;
  std::string socket_ifname;
  std::string auth_key;
  static CommSetup from_environment();
};

class Communicator {
 public:
  // Over onebit's TCP transport, bootstrapped as `setup` says.
  explicit Communicator(const CommSetup& setup);
  // Over a transport made elsewhere (the Gloo front door's, over a framework's gloo context).
  explicit Communicator(std::unique_ptr<Transport> transport);
  ~Communicator();

  int rank() const { return transport_->rank(); }
  int size() const { return transport_->size(); }

  // In-place allreduce. Tagged (same pointer and count) → compressed; otherwise → ring.
  void allreduce(void* buffer, std::size_t count, kernels::Dtype dtype, ReduceOp op);

  // The two algorithms, callable directly (the benchmark compares them).
  // `channel`: see Transport::isend (the framework's tag of an intercepted call; 0 otherwise).
  void compressed_allreduce(Tag& tag, void* buffer, std::size_t count, kernels::Dtype dtype, ReduceOp op,
                            std::uint32_t channel = 0);
  void ring_allreduce(void* buffer, std::size_t count, kernels::Dtype dtype, ReduceOp op);

  onebit_stats_t stats() const;
  StageTimes compressed_stage_times() const;

 private:
  Deadline call_deadline() const;
  std::string where() const;  // "rank 2/4"

  const std::uint64_t id_;  // process-unique: keys this communicator's tag states
  std::unique_ptr<Transport> transport_;
  const kernels::CpuKernels& kernels_;

  std::mutex ring_mutex_;  // untagged calls run one at a time
  std::uint64_t ring_seq_ = 0;
  AlignedBuffer<float> ring_accumulator_;
  AlignedBuffer<float> ring_staging_;
  std::vector<Request> ring_sends_, ring_recvs_;

  mutable std::mutex stage_mutex_;
  StageTimes stage_times_;
  std::atomic<std::uint64_t> compressed_calls_{0};
  std::atomic<std::uint64_t> full_precision_calls_{0};
  std::atomic<std::uint64_t> compressed_bytes_{0};
  std::atomic<std::uint64_t> full_precision_bytes_{0};
};

}  // namespace onebit
