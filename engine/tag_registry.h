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

#include "common/aligned_buffer.h"
#include "kernels/cpu/cpu_kernels.h"

namespace onebit {

// The scratch of one tag's calls, owned by the algorithm that uses it and reused by the tag's next
// call there: a round's messages, packed bits and results (compressed_round.h), the hierarchical
// host exchange's (host_exchange.h). Made by the first call that needs it; nothing in it outlives a
// call's meaning, so checkpoints never look at it.
struct RoundScratch;
struct HostScratch;

// One tag's lasting state on one communicator: what checkpoints save and the next call builds on.
// The error feedback is in the kernels' one-pass form: worker[current] holds the stored y of the
// last call and worker_scale its scale; the other buffer receives the next call's values, and a
// successful call commits by flipping `current`. Likewise the server.
struct TagState {
  TagState();
  ~TagState();  // where the scratch types are complete (tag_registry.cc)

  AlignedBuffer<float> worker[2];
  AlignedBuffer<float> server[2];
  int current = 0;
  float worker_scale = 0.0f;
  float server_scale = 0.0f;
  std::uint64_t seq = 0;  // calls of this tag on this communicator; part of every message key
  // What the state was sized for: the round's elements and ranks, and where its elements sit in
  // the tag's buffer (hierarchical: this rank's shard; flat: the whole buffer at 0). 0 ranks: the
  // tag has not run a round here yet.
  std::size_t round_elements = 0;
  int round_ranks = 0;
  std::size_t offset = 0;

  std::unique_ptr<RoundScratch> round;  // the compressed round's (flat, and each hierarchical rail round)
  std::unique_ptr<HostScratch> host;    // the hierarchical host exchange's
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
  // Calls that have run to their end on the device, replays of a captured CUDA graph included
  // (which the host never sees); may lag the calls enqueued.
  virtual std::uint64_t completed_calls() const = 0;
};

struct Tag {
  std::string name;
  std::uint64_t id = 0;  // FNV-1a of the name; never 0 (0 is the untagged stream)
  std::size_t count = 0;
  kernels::Dtype dtype = kernels::Dtype::kFloat32;
  void* ptr = nullptr;

  std::mutex busy;  // held for the duration of a call: one call per tag at a time
  std::map<std::uint64_t, std::unique_ptr<TagState>> states;            // by communicator id
  std::map<std::uint64_t, std::unique_ptr<DeviceState>> device_states;  // by the front door's communicator id
  std::uint64_t calls = 0;
  std::uint64_t bytes_sent = 0;
  // What every rank must share for the tag's next calls (an optimizer's lr, betas, step, stage),
  // set by onebit_tag_set_step_settings: its digest travels in each worker head and a difference
  // fails the call on every rank; the text names this rank's values in that error. 0: none set.
  std::mutex settings_mutex;
  std::uint64_t settings = 0;
  std::string settings_text;
  std::uint64_t settings_digest() {
    std::lock_guard<std::mutex> lock(settings_mutex);
    return settings;
  }
  std::string settings_said() {
    std::lock_guard<std::mutex> lock(settings_mutex);
    return settings_text.empty() ? std::string("none set") : settings_text;
  }
  // A state restored from a checkpoint, applied by the tag's first call on a communicator.
  std::vector<float> restored_worker, restored_server;
  bool restored = false;

  // Checkpoints (onebit_tag_state_*); the caller holds `busy`. A tag has one state to save: the
  // one of the one communicator it ran on, host or device, or what was restored and not used yet.
  void saved_sizes(std::size_t* worker_count, std::size_t* server_count) const;
  void save(float* worker, float* server) const;  // zeros before the first call
  void load(const float* worker, std::size_t worker_count, const float* server, std::size_t server_count);
  // What load() refuses whatever the values: a tag that has run, a worker error of another count.
  void check_load(std::size_t worker_count) const;
  bool has_run() const { return !states.empty() || !device_states.empty(); }
  // What onebit_tag_stats reports: the calls made — on the device, the larger of those enqueued and
  // those finished there, so that graph replays count. The caller holds `busy`.
  std::uint64_t calls_made() const;
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
  // How forget_communicator ends a communicator's states.
  enum class InFlight {
    // A destroy: waits for a tag's call in flight, frees the states at once — and the states that
    // earlier aborts set aside.
    kWait,
    // An abort (PyTorch's watchdog, on a communicator that may be stuck): never waits and never
    // frees, since freeing device memory waits for the whole device. States are set aside, freed
    // at the next destroy; a tag in a call keeps its state until its next use (drop_aborted_states).
    kKeep,
  };
  // Ends every state a communicator owns (on destroy or abort); returns how many tags were in a
  // call (kKeep: their states are dropped at their next use). Holds the registry's lock only to
  // list the tags and set states aside, never while waiting on a call.
  std::size_t forget_communicator(std::uint64_t comm_id, InFlight in_flight = InFlight::kWait);
  // Sets aside the tag's states on communicators aborted while it was in a call, so that they
  // count for nothing (checkpoints, has_run, the one-communicator rule). Under the tag's busy lock:
  // claim_tag_for_call and the C API's tag-state calls call it.
  void drop_aborted_states(Tag& tag);

  static std::uint64_t id_of(const std::string& name);

 private:
  void set_aside(Tag& tag, std::uint64_t comm_id);  // under mutex_ and the tag's busy lock

  mutable std::mutex mutex_;
  std::map<std::string, std::shared_ptr<Tag>> by_name_;
  std::map<const void*, std::shared_ptr<Tag>> by_ptr_;
  std::vector<std::uint64_t> aborted_;                   // communicators aborted while a tag of theirs was in a call
  std::vector<std::unique_ptr<TagState>> aside_states_;  // of aborted communicators, freed at a destroy
  std::vector<std::unique_ptr<DeviceState>> aside_device_states_;
};

}  // namespace onebit
