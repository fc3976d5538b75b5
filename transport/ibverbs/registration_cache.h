// Memory registrations for the verbs transport. A registration (ibv_reg_mr) pins pages and costs
// tens of microseconds per MiB, so the engine's own long-lived buffers — announced by
// AlignedBuffer in common/buffer_registry.h — are registered once, whole, on first use, and stay
// registered until the buffer is released; the compressed allreduce's messages all live in such
// buffers, so its steady state registers nothing. Any other memory (a caller's tensor in the full-
// precision ring) is registered for one message and deregistered when it completes: onebit cannot
// see it being freed, and a cached registration of freed memory would pin pages that no longer
// back those addresses — an RDMA write would land in memory nobody reads, silently.
//
// The device calls sit behind Registrar, so the caching is tested without a device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

#include "common/buffer_registry.h"

namespace onebit::transport::ibverbs {

struct Registration {
  std::uint32_t lkey = 0;
  std::uint32_t rkey = 0;
  void* handle = nullptr;  // the device's (an ibv_mr*); null: nothing registered
};

class Registrar {
 public:
  virtual ~Registrar() = default;
  // Throws onebit::Error naming the range and the device's reason.
  virtual Registration register_memory(void* begin, std::size_t bytes) = 0;
  virtual void deregister(const Registration& registration) noexcept = 0;
};

class RegistrationCache {
 public:
  struct Lease {
    Registration registration;
    bool cached = false;  // false: this message's own registration, dropped by release()
  };
  struct Stats {
    std::uint64_t buffers_registered = 0;  // announced buffers registered (cache misses)
    std::uint64_t hits = 0;                // leases served by a cached registration
    std::uint64_t per_message = 0;         // leases of memory that is not an announced buffer
  };

  explicit RegistrationCache(Registrar& registrar);
  ~RegistrationCache();  // deregisters what is cached
  RegistrationCache(const RegistrationCache&) = delete;
  RegistrationCache& operator=(const RegistrationCache&) = delete;

  // A registration that covers [p, p + bytes). Zero bytes: an empty lease, nothing registered.
  Lease acquire(const void* p, std::size_t bytes);
  void release(const Lease& lease);

  std::size_t cached_buffers() const;
  Stats stats() const;

 private:
  void on_retire(const buffers::Span& span);

  Registrar& registrar_;
  mutable std::mutex mutex_;
  std::map<const void*, Registration> cached_;  // by announced buffer's begin
  Stats stats_;
  int subscription_ = 0;
};

}  // namespace onebit::transport::ibverbs
