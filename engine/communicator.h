// A communicator: W ranks over a transport (onebit's TCP mesh, or a framework's gloo context), and
// the two allreduces the engine offers — compressed (tagged buffers, docs/algorithm.md) and an exact
// full-precision ring (everything else).
//
// Threading: calls on different tags may run concurrently from different threads; calls on one tag
// are serialised (a second concurrent call on the same tag is an error, not a wait, since it would
// reorder that tag's calls across ranks). Untagged calls are serialised and must be issued in the
// same order on every rank, as with NCCL.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/aligned_buffer.h"
#include "engine/tag_registry.h"
#include "kernels/cpu/cpu_kernels.h"
#include "onebit/onebit_types.h"
#include "transport/transport.h"

namespace onebit {

enum class ReduceOp : std::uint8_t { kSum = 0, kAvg = 1 };

// Where the compressed allreduces of a communicator spent their time on this rank, in seconds,
// summed over calls: the profile behind docs/benchmarks/allreduce.md's per-stage breakdown.
struct StageTimes {
  double worker = 0;        // worker pass over all chunks (sends queued as chunks are packed)
  double wait_inputs = 0;   // waiting for every rank's bits and scale
  double server = 0;        // server pass over this rank's chunk
  double wait_results = 0;  // waiting for every server's result (and this rank's sends)
  double unpack = 0;        // writing the result into the caller's buffer
  std::uint64_t calls = 0;
};

// Where a communicator comes from: explicit values, or the environment (docs/usage/c-cpp.md, "Joining a job").
struct CommSetup {
  int rank = -1;
  int size = -1;
  std::string root;  // host:port
  // Zero / empty: from the ONEBIT_* variables.
  std::int64_t timeout_ms = 0;
  int sockets_per_peer = 0;
  std::string socket_ifname;
  std::string auth_key;
  // Who may join (transport/tcp/bootstrap.h): the communicator's identity (empty: the launcher's,
  // common/launcher.h) and a secret from the job's rendezvous (empty: none).
  std::string identity;
  std::string secret;
  // Ranks per host for hierarchical compression; 0: ONEBIT_LOCAL_SIZE, else torchrun's
  // LOCAL_WORLD_SIZE, for a communicator of the job's whole world (docs/usage/c-cpp.md).
  int local_size = 0;
  // Rank 0 binds the root and serves it in one go (no listener opened ahead): from_environment's.
  bool root_served_at_once = false;
  static CommSetup from_environment();
};

class Communicator {
 public:
  // The most ranks a communicator takes: the ring's 2 (W-1) steps are numbered in the 16-bit part
  // field of its messages (wire.h). Larger worlds are refused when the communicator is made.
  static constexpr int kMaxRanks = 32768;

  // Over onebit's TCP transport, bootstrapped as `setup` says.
  explicit Communicator(const CommSetup& setup);
  // Over a transport made elsewhere (the Gloo front door's, over a framework's gloo context);
  // ranks per host as `local_size` says (0: from the environment, as CommSetup::local_size).
  explicit Communicator(std::unique_ptr<Transport> transport, int local_size = 0);
  ~Communicator();

  int rank() const { return transport_->rank(); }
  int size() const { return transport_->size(); }
  // Ranks per host (1: one per host, or unknown). Ranks h·L … h·L+L−1 share host h.
  int local_size() const { return local_size_; }
  // The ranks per host a communicator of `size` ranks, this process rank `rank` of it, takes from
  // the environment (as CommSetup::local_size 0 does): 1 when it compresses flat.
  static int ranks_per_host_from_environment(int rank, int size);
  // Whether tagged calls run hierarchically: several ranks per host and more than one host.
  bool hierarchical() const { return local_size_ > 1 && local_size_ < size(); }

  // In-place allreduce. Tagged (same pointer and count) → compressed; otherwise → ring.
  void allreduce(void* buffer, std::size_t count, kernels::Dtype dtype, ReduceOp op);

  // A tagged call, as the front doors make it: hierarchical when hierarchical(), else flat.
  // `channel`: see Transport::isend (the framework's tag of an intercepted call; 0 otherwise).
  void compressed_allreduce(Tag& tag, void* buffer, std::size_t count, kernels::Dtype dtype, ReduceOp op,
                            std::uint32_t channel = 0);

  // The algorithms, callable directly (the benchmark compares them). A tag keeps one state per
  // communicator, so one tag must not be used with both compressed algorithms on one communicator.
  //   flat:          docs/algorithm.md over all ranks;
  //   hierarchical:  fp32 average within each host, docs/algorithm.md over each rail of one rank per
  //                  host, the rails' bits gathered within each host (docs/design/engine.md);
  //   ring:          exact fp32.
  void flat_compressed_allreduce(Tag& tag, void* buffer, std::size_t count, kernels::Dtype dtype, ReduceOp op,
                                 std::uint32_t channel = 0);
  void hierarchical_allreduce(Tag& tag, void* buffer, std::size_t count, kernels::Dtype dtype, ReduceOp op,
                              std::uint32_t channel = 0);
  void ring_allreduce(void* buffer, std::size_t count, kernels::Dtype dtype, ReduceOp op);

  // Fails every call in flight on other threads (its transport is aborted) and waits for them to
  // leave; later calls fail at once. The destructor does this first, so onebit_comm_destroy during
  // a call fails that call instead of freeing what it uses.
  void close();

  onebit_stats_t stats() const;
  StageTimes compressed_stage_times() const;
  // Bytes the hierarchical calls sent to ranks on this rank's own host (part of
  // compressed_bytes_sent; they never cross a host's link).
  std::uint64_t intra_host_bytes() const { return intra_host_bytes_; }

 private:
  struct RankGroup;
  struct RoundResult;
  class Round;     // one compressed_round's steps (compressed_allreduce.cc)
  class HostCall;  // one hierarchical call's steps (hierarchical_allreduce.cc)
  class Ring;      // one untagged call's ring (ring_allreduce.cc)
  // The worker pass over block `block` of a round ([first, first + length) of its elements) into
  // the round's error buffers and bits: returns Σ y². Flat: worker_pass on the caller's buffer;
  // hierarchical: on the host's mean, once the local peers' inputs of the block are in.
  using RoundWorker = std::function<double(std::size_t block, std::size_t first, std::size_t length,
                                           const float* e_prev, float a_prev, float* e_next, std::uint8_t* bits)>;

  // Stages 1–2 of docs/algorithm.md over `group`, on n elements whose worker pass `worker` runs block
  // by block; see compressed_allreduce.cc.
  RoundResult compressed_round(Tag& tag, TagState& st, const RankGroup& group, std::size_t n, std::size_t offset,
                               const wire::CallShape& shape, std::uint32_t channel, const RoundWorker& worker);
  // After a successful round's results are written: adds its stage times (`more_waiting`: the
  // caller's own waits after the round; the unpack from `unpack_start` on) and commits its error
  // state by flipping buffers.
  void commit_round(TagState& st, const RoundResult& round, double more_waiting, Clock::time_point unpack_start);
  // Counts a public call in flight for close(); throws once the communicator is closing.
  class CallScope;
  // Once per communicator, before its first tagged call: every rank's ranks per host agree (flat
  // is 1), so that a flat and a hierarchical rank fail at once naming both, not at the timeout.
  void check_topology(const Tag& tag);
  // A tagged call too small to pay for its messages is said once per tag name, on rank 0.
  void say_if_too_small(const Tag& tag, std::size_t n);
  Deadline call_deadline() const;
  std::string where() const;  // "rank 2/4"

  const std::uint64_t id_;  // process-unique: keys this communicator's tag states
  std::unique_ptr<Transport> transport_;
  const kernels::CpuKernels& kernels_;
  const int local_size_;
  std::mutex topology_mutex_;
  bool topology_checked_ = false;

  std::mutex calls_mutex_;
  std::condition_variable calls_left_;
  int calls_in_flight_ = 0;
  bool closing_ = false;

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
  std::atomic<std::uint64_t> intra_host_bytes_{0};
};

class Communicator::CallScope {
 public:
  explicit CallScope(Communicator& comm);
  ~CallScope();
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;

 private:
  Communicator& comm_;
};

}  // namespace onebit
