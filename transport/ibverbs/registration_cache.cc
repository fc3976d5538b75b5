#include "transport/ibverbs/registration_cache.h"

namespace onebit::transport::ibverbs {

RegistrationCache::RegistrationCache(Registrar& registrar) : registrar_(registrar) {
  subscription_ = buffers::subscribe([this](const buffers::Span& span) { on_retire(span); });
}

RegistrationCache::~RegistrationCache() {
  buffers::unsubscribe(subscription_);
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [begin, registration] : cached_) registrar_.deregister(registration);
  cached_.clear();
}

RegistrationCache::Lease RegistrationCache::acquire(const void* p, std::size_t bytes) {
  if (bytes == 0) return Lease{};
  // Looked up before this cache's lock is taken: retire() calls on_retire without the registry's
  // lock, and on_retire takes this one.
  const std::optional<buffers::Span> buffer = buffers::containing(p, bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  if (!buffer) {
    ++stats_.per_message;
    return Lease{registrar_.register_memory(const_cast<void*>(p), bytes), false};
  }
  auto found = cached_.find(buffer->begin);
  if (found != cached_.end()) {
    ++stats_.hits;
    return Lease{found->second, true};
  }
  const Registration registration = registrar_.register_memory(const_cast<void*>(buffer->begin), buffer->bytes);
  cached_[buffer->begin] = registration;
  ++stats_.buffers_registered;
  return Lease{registration, true};
}

void RegistrationCache::release(const Lease& lease) {
  if (!lease.cached && lease.registration.handle != nullptr) registrar_.deregister(lease.registration);
}

void RegistrationCache::on_retire(const buffers::Span& span) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = cached_.find(span.begin);
  if (found == cached_.end()) return;
  registrar_.deregister(found->second);
  cached_.erase(found);
}

std::size_t RegistrationCache::cached_buffers() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cached_.size();
}

RegistrationCache::Stats RegistrationCache::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

}  // namespace onebit::transport::ibverbs
