#include "plugin/engine/tag_registry.h"

#include "common/error.h"
#include "common/log.h"

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
  ONEBIT_CHECK(ptr != nullptr || count == 0, ONEBIT_INVALID_ARGUMENT, "tag '", name, "': ptr is NULL with count ", count);
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
                 "' is registered with ", tag.count, " elements of ", kernels::dtype_name(tag.dtype), "; re-tagging with ",
                 count, " elements of ", kernels::dtype_name(dtype), " is not allowed (untag it first, which resets its state)");
    by_ptr_.erase(tag.ptr);
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

void TagRegistry::forget_communicator(std::uint64_t comm_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [name, tag] : by_name_) {
    std::lock_guard<std::mutex> busy(tag->busy);
    tag->states.erase(comm_id);
  }
}

}  // namespace onebit
