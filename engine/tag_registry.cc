#include "engine/tag_registry.h"

#include <algorithm>

#include "common/error.h"
#include "common/log.h"
#include "engine/compressed_round.h"  // RoundScratch and HostScratch complete, for ~TagState
#include "engine/host_exchange.h"

namespace onebit {

TagRegistry& TagRegistry::instance() {
  static TagRegistry* registry = new TagRegistry();  // leaked: used from atexit paths of frameworks
  return *registry;
}

std::uint64_t TagRegistry::id_of(const std::string& name) {
  std::uint64_t hash = 14695981039346656037ull;
  for (unsigned char c : name) hash = (hash ^ c) * 1099511628211ull;
  return hash == 0 ? 1 : hash;
}

void TagRegistry::tag(const std::string& name, void* ptr, std::size_t count, kernels::Dtype dtype) {
  ONEBIT_CHECK(!name.empty(), ONEBIT_INVALID_ARGUMENT, "the tag name is empty");
  ONEBIT_CHECK(ptr != nullptr || count == 0, ONEBIT_INVALID_ARGUMENT, "tag '", name, "': ptr is NULL with count ",
               count);
  std::lock_guard<std::mutex> lock(mutex_);
  auto at_ptr = by_ptr_.find(ptr);
  if (at_ptr != by_ptr_.end() && at_ptr->second->name != name) {
    fail(ONEBIT_INVALID_ARGUMENT, "tag '", name, "': buffer ", ptr, " is already tagged '", at_ptr->second->name,
         "'; untag it first");
  }
  auto known = by_name_.find(name);
  if (known != by_name_.end()) {
    Tag& tag = *known->second;
    ONEBIT_CHECK(tag.count == count && tag.dtype == dtype, ONEBIT_INVALID_ARGUMENT, "tag '", name,
                 "' is registered with ", tag.count, " elements of ", kernels::dtype_name(tag.dtype),
                 "; re-tagging with ", count, " elements of ", kernels::dtype_name(dtype),
                 " is not allowed (untag it first, which resets its state)");
    if (tag.ptr != nullptr) by_ptr_.erase(tag.ptr);  // nullptr: detached (its buffer was freed)
    tag.ptr = ptr;
    by_ptr_[ptr] = known->second;
    ONEBIT_LOG(INFO, "tag '", name, "' moved to ", ptr, " (state kept)");
    return;
  }
  auto tag = std::make_shared<Tag>();
  tag->name = name;
  tag->id = id_of(name);
  tag->count = count;
  tag->dtype = dtype;
  tag->ptr = ptr;
  by_name_[name] = tag;
  by_ptr_[ptr] = tag;
  ONEBIT_LOG(INFO, "tag '", name, "': ", count, " elements of ", kernels::dtype_name(dtype), " at ", ptr);
}

void TagRegistry::untag(void* ptr) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = by_ptr_.find(ptr);
  ONEBIT_CHECK(found != by_ptr_.end(), ONEBIT_INVALID_ARGUMENT, "untag: buffer ", ptr, " is not tagged");
  by_name_.erase(found->second->name);
  by_ptr_.erase(found);
}

void TagRegistry::detach(void* ptr) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = by_ptr_.find(ptr);
  ONEBIT_CHECK(found != by_ptr_.end(), ONEBIT_INVALID_ARGUMENT, "detach: buffer ", ptr, " is not tagged");
  found->second->ptr = nullptr;
  by_ptr_.erase(found);
}

std::shared_ptr<Tag> TagRegistry::find(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = by_ptr_.find(ptr);
  return found == by_ptr_.end() ? nullptr : found->second;
}

std::shared_ptr<Tag> TagRegistry::find_name(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = by_name_.find(name);
  return found == by_name_.end() ? nullptr : found->second;
}

std::size_t TagRegistry::forget_communicator(std::uint64_t comm_id, InFlight in_flight) {
  std::vector<std::shared_ptr<Tag>> tags;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [name, tag] : by_name_) tags.push_back(tag);
  }
  std::size_t in_a_call = 0;
  for (const std::shared_ptr<Tag>& tag : tags) {
    std::unique_lock<std::mutex> busy(tag->busy, std::defer_lock);
    if (in_flight == InFlight::kWait) {
      busy.lock();
      tag->states.erase(comm_id);
      tag->device_states.erase(comm_id);
    } else if (busy.try_lock()) {
      std::lock_guard<std::mutex> lock(mutex_);
      set_aside(*tag, comm_id);
    } else {
      ++in_a_call;
      ONEBIT_LOG(WARN, "tag '", tag->name, "' is in a call while communicator ", comm_id, " is aborted: any state ",
                 "it has there is dropped at its next use");
    }
  }
  std::vector<std::unique_ptr<TagState>> states;
  std::vector<std::unique_ptr<DeviceState>> device_states;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (in_a_call > 0) aborted_.push_back(comm_id);
    if (in_flight == InFlight::kWait) {  // freed below, outside the lock
      states.swap(aside_states_);
      device_states.swap(aside_device_states_);
    }
  }
  return in_a_call;
}

void TagRegistry::set_aside(Tag& tag, std::uint64_t comm_id) {
  if (auto it = tag.states.find(comm_id); it != tag.states.end()) {
    aside_states_.push_back(std::move(it->second));
    tag.states.erase(it);
  }
  if (auto it = tag.device_states.find(comm_id); it != tag.device_states.end()) {
    aside_device_states_.push_back(std::move(it->second));
    tag.device_states.erase(it);
  }
}

void TagRegistry::drop_aborted_states(Tag& tag) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (std::uint64_t comm_id : aborted_) set_aside(tag, comm_id);
}

namespace {
void check_one_state(const Tag& tag) {
  const std::size_t used = tag.states.size() + tag.device_states.size();
  ONEBIT_CHECK(used <= 1, ONEBIT_INVALID_ARGUMENT, "tag '", tag.name, "' has been used on ", used,
               " communicators; a checkpoint holds one state");
}
}  // namespace

void Tag::saved_sizes(std::size_t* worker_count, std::size_t* server_count) const {
  check_one_state(*this);
  *worker_count = count;
  if (!states.empty()) {
    *server_count = states.begin()->second->server[0].size();
  } else if (!device_states.empty()) {
    *server_count = device_states.begin()->second->server_count();
  } else {
    *server_count = restored ? restored_server.size() : 0;
  }
}

void Tag::save(float* worker, float* server) const {
  std::size_t worker_count = 0, server_count = 0;
  saved_sizes(&worker_count, &server_count);
  ONEBIT_CHECK(worker != nullptr || worker_count == 0, ONEBIT_INVALID_ARGUMENT, "worker is NULL");
  ONEBIT_CHECK(server != nullptr || server_count == 0, ONEBIT_INVALID_ARGUMENT, "server is NULL");
  if (!states.empty()) {
    // A hierarchical state holds the worker error of this rank's shard only (the host's mean is
    // what its rail compresses); the rest of the tag's worker error is zero.
    const TagState& state = *states.begin()->second;
    const std::size_t held = state.worker[state.current].size();
    std::fill(worker, worker + worker_count, 0.0f);
    kernels::materialize_error(state.worker[state.current].data(), state.worker_scale, worker + state.offset, held);
    kernels::materialize_error(state.server[state.current].data(), state.server_scale, server, server_count);
  } else if (!device_states.empty()) {
    device_states.begin()->second->save(worker, server);
  } else if (restored) {  // restored and not used yet: save what was restored
    std::copy(restored_worker.begin(), restored_worker.end(), worker);
    std::copy(restored_server.begin(), restored_server.end(), server);
  } else {
    std::fill(worker, worker + worker_count, 0.0f);
  }
}

void Tag::check_load(std::size_t worker_count) const {
  ONEBIT_CHECK(!has_run(), ONEBIT_INVALID_ARGUMENT, "tag '", name,
               "' has already run; its error feedback loads only before its first allreduce (an optimizer "
               "that took compressed steps takes no checkpoint: load it into a new one)");
  ONEBIT_CHECK(worker_count == count, ONEBIT_INVALID_ARGUMENT, "tag '", name, "' has ", count,
               " elements; the saved worker error has ", worker_count);
}

void Tag::load(const float* worker, std::size_t worker_count, const float* server, std::size_t server_count) {
  check_load(worker_count);
  ONEBIT_CHECK((worker != nullptr || worker_count == 0) && (server != nullptr || server_count == 0),
               ONEBIT_INVALID_ARGUMENT, "worker or server is NULL");
  // Saved before the tag's first call (an optimizer checkpointed in warmup): zero worker error and
  // no server error yet, which is exactly the state a fresh tag starts from, whatever its chunk.
  if (server_count == 0 && std::all_of(worker, worker + worker_count, [](float e) { return e == 0.0f; })) {
    restored_worker.clear();
    restored_server.clear();
    restored = false;
    return;
  }
  restored_worker.assign(worker, worker + worker_count);
  restored_server.assign(server, server + server_count);
  restored = true;
}

std::unique_lock<std::mutex> claim_tag_for_call(Tag& tag, const std::string& where) {
  std::unique_lock<std::mutex> busy(tag.busy, std::try_to_lock);
  ONEBIT_CHECK(busy.owns_lock(), ONEBIT_INVALID_ARGUMENT, where, where.empty() ? "" : ": ", "tag '", tag.name,
               "' is already in an allreduce on another thread; calls on one tag must not overlap");
  TagRegistry::instance().drop_aborted_states(tag);
  return busy;
}

std::uint64_t Tag::calls_made() const {
  std::uint64_t on_device = 0;
  for (const auto& [comm, state] : device_states) on_device += state->completed_calls();
  return std::max(calls, on_device);
}

TagState::TagState() = default;
TagState::~TagState() = default;

TagState& state_on(Tag& tag, std::uint64_t comm_id) {
  std::unique_ptr<TagState>& slot = tag.states[comm_id];
  if (!slot) slot = std::make_unique<TagState>();
  return *slot;
}

}  // namespace onebit
