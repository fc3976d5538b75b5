// The process-wide tag registry: which buffers are compressed, and their error-feedback state.
//
// A tag is a stable name (the tensor's), not a pointer: the state survives re-tagging the name at a
// new pointer, and is freed by untag. The state of a tag is kept per communicator (its server
// chunk depends on the communicator's rank and size).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "common/aligned_buffer.h"
#include "transport/shm/host_segment.h"
#include "transport/transport.h"

namespace onebit {

// One tag's error feedback on one communicator, in the kernels' one-pass form: worker[current]
// holds the stored y of the last call and worker_scale its scale; the other buffer receives the
// next call's values, and a successful call commits by flipping `current`. Likewise the server.
struct TagState {
  AlignedBuffer<float> worker[2];
  AlignedBuffer<float> server[2];
  int current = 0;
  float worker_scale = 0.0f;
  float server_scale = 0.0f;
  std::uint64_t seq = 0;  // calls of this tag on this communicator; part of every message key
  // What the state was sized for: the round's elements and ranks, and where its elements sit in
  // the tag's buffer (hierarchical: this rank's shard; flat: the whole buffer at 0).
  std::size_t round_elements = 0;
  int round_ranks = 0;
  std::size_t offset = 0;

  // Scratch, reused by every call.
  AlignedBuffer<std::uint8_t> packed;         // this rank's bits of the whole buffer
  AlignedBuffer<std::uint8_t> received;       // W × chunk bits, from each rank (server stage)
  AlignedBuffer<float> scales;                // W worker scales
  AlignedBuffer<std::uint8_t> results;        // W × (8 + chunk bits): every server's result
  std::vector<Request> requests;         // every message of a call, sized once
  std::vector<Request*> stage1, all;     // what the call waits for
  std::vector<const std::uint8_t*> chunk_bits;  // the server stage's W inputs
  std::vector<const std::uint8_t*> block_bits;  // the same, at one block

  // Hierarchical calls only: the host's exchange.
  AlignedBuffer<std::uint8_t> host_inputs;    // (L−1) × shard elements: the local peers' inputs of my shard
  AlignedBuffer<float> host_mean;             // fp16/bf16 calls: the host mean of my shard, the rail input
  AlignedBuffer<std::uint8_t> host_results;   // the local peers' rail results, as `results`
  std::vector<Request> host_requests;
  std::vector<Request*> host_all;
  // The host reduce through shared memory (when the host's ranks could set it up): every local
  // rank's region, and the calls it has carried (its ready counters count blocks since then).
  bool host_segment_tried = false;
  shm::HostSegment host_segment;
  std::uint32_t host_segment_calls = 0;
};

// A tag's state kept by a front door outside the engine's host memory: the NCCL door's device
// buffers (engine/cuda_allreduce.h). Owned by the Tag like TagState, so untag frees it with
// the tag and forget_communicator drops it; a re-tagged name starts from a new Tag and new state.
struct DeviceState {
  virtual ~DeviceState() = default;
  // The elements of this rank's server error (its chunk on that communicator).
  virtual std::size_t server_count() const = 0;
  // The true errors e and s (checkpoints): waits for the state's last call to finish.
  virtual void save(float* worker, float* server) const = 0;
};

struct Tag {
  std::string name;
  std::uint64_t id = 0;  // FNV-1a of the name; never 0 (0 is the untagged stream)
  std::size_t count = 0;
  kernels::Dtype dtype = kernels::Dtype::kFloat32;
  void* ptr = nullptr;

  std::mutex busy;  // held for the duration of a call: one call per tag at a time
  std::map<std::uint64_t, std::unique_ptr<TagState>> states;  // by communicator id
  std::map<std::uint64_t, std::unique_ptr<DeviceState>> device_states;  // by the front door's communicator id
  std::uint64_t calls = 0;
  std::uint64_t bytes_sent = 0;
  // A state restored from a checkpoint, applied by the tag's first call on a communicator.
  std::vector<float> restored_worker, restored_server;
  bool restored = false;

  // Checkpoints (onebit_tag_state_*); the caller holds `busy`. A tag has one state to save: the
  // one of the one communicator it ran on, host or device, or what was restored and not used yet.
  void saved_sizes(std::size_t* worker_count, std::size_t* server_count) const;
  void save(float* worker, float* server) const;  // zeros before the first call
  void load(const float* worker, std::size_t worker_count, const float* server, std::size_t server_count);
  bool has_run() const { return !states.empty() || !device_states.empty(); }
};

// The preamble of every compressed call (flat, hierarchical, the NCCL door's): the tag's busy lock,
// taken without waiting — calls on one tag must not overlap, and a second one is
// ONEBIT_INVALID_ARGUMENT naming the tag (after `where`, e.g. "rank 2/4", when given), not a wait.
std::unique_lock<std::mutex> claim_tag_for_call(Tag& tag, const std::string& where);

// `tag`'s host state on communicator `comm_id`, made on its first call there. Under the busy lock.
TagState& state_on(Tag& tag, std::uint64_t comm_id);

class TagRegistry {
 public:
  static TagRegistry& instance();

  // Throws Error(ONEBIT_INVALID_ARGUMENT) naming the conflict.
  void tag(const std::string& name, void* ptr, std::size_t count, kernels::Dtype dtype);
  void untag(void* ptr);
  // The buffer at `ptr` is being freed: it is no longer tagged, but its name keeps the tag and its
  // state, so tagging the name at another buffer moves it (as a re-tag before the free would have).
  void detach(void* ptr);
  // The tag of exactly this pointer, or null.
  std::shared_ptr<Tag> find(const void* ptr) const;
  std::shared_ptr<Tag> find_name(const std::string& name) const;
  // Frees every state a communicator owns (on destroy).
  void forget_communicator(std::uint64_t comm_id);

  static std::uint64_t id_of(const std::string& name);

 private:
  mutable std::mutex mutex_;
  std::map<std::string, std::shared_ptr<Tag>> by_name_;
  std::map<const void*, std::shared_ptr<Tag>> by_ptr_;
};

}  // namespace onebit
