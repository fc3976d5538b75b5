// A transport over a framework's gloo::Context: onebit's messages travel on the context's own pairs
// (the connections gloo already made), so a job intercepted by the Gloo front door needs no extra
// ports, addresses or bootstrap.
//
// Messages are gloo unbound-buffer sends and receives under onebit's own slot prefix,
//
//   slot = kSlotPrefix << 56 | channel << 24 | kind << 16 | part
//
// where channel is the framework's tag of the intercepted call. Gloo's collectives use prefixes
// 0x01–0x08 and Slot::build(prefix, tag) = prefix << 56 | tag << 24, so onebit's traffic can never
// match theirs, and two calls with distinct framework tags (PyTorch gives every collective its own)
// never match each other, whichever threads run them. Within a slot gloo matches in posting order.
//
// Gloo's unbound buffers rendezvous (a send moves once its receive is posted), so nothing arrives
// unexpected. Failures are gloo's: a pair that breaks fails the requests on it; a wait that runs out
// of time makes gloo signal every pair of the context (its own collectives do the same), so peers
// learn at once. onebit then breaks this transport for good, like the TCP one, and closes every pair
// of the context (see fail()).
#pragma once

#include <gloo/context.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <tuple>

#include "common/error.h"
#include "transport/transport.h"

namespace onebit::transport::gloo {

// onebit's slot prefix: above gloo's 0x01–0x08, and spelled like the name.
constexpr std::uint8_t kSlotPrefix = 0xb1;

std::uint64_t slot_of(std::uint32_t channel, const wire::MessageKey& key);

class GlooTransport final : public Transport {
 public:
  // Uses the context's rank, size and timeout. Not owning: the context must outlive every call
  // (the front door drops a context's communicator once the framework has destroyed the context).
  explicit GlooTransport(::gloo::Context* context);

  int rank() const override { return context_->rank; }
  int size() const override { return context_->size; }
  std::chrono::milliseconds timeout() const override { return timeout_; }

  void isend(Request& request, int peer, std::uint32_t channel, const wire::MessageKey& key,
             const wire::CallShape& shape, const void* data, std::size_t bytes) override;
  void irecv(Request& request, int peer, std::uint32_t channel, const wire::MessageKey& key,
             const wire::CallShape& shape, void* data, std::size_t bytes) override;
  void wait_all(const std::vector<Request*>& requests, Deadline deadline,
                const std::function<std::string(const Request&)>& describe) override;
  TransportStats stats() const override;

 private:
  static std::chrono::milliseconds timeout_of(::gloo::Context* context);  // libgloo's, checked found
  void start(Request& request, bool is_send, int peer, std::uint32_t channel, const wire::MessageKey& key,
             const wire::CallShape& shape, void* data, std::size_t bytes);
  // A receive's match is held from its posting until its wait ends: a second receive for it while
  // it is held breaks the transport naming the key (transport.h), as gloo would silently queue it.
  void hold_receive_match(const Request& request);
  void release_receive_match(const Request& request);
  void wait_one(Request& request, Deadline deadline, const std::function<std::string(const Request&)>& describe);
  [[noreturn]] void fail(onebit_result_t code, const std::string& message);
  void throw_if_failed() const;

  ::gloo::Context* const context_;
  const std::chrono::milliseconds timeout_;
  mutable std::mutex mutex_;
  bool failed_ = false;
  onebit_result_t failure_code_ = ONEBIT_SUCCESS;
  std::string failure_message_;
  std::set<std::tuple<int, std::uint32_t, wire::MessageKey>> receive_matches_;  // (peer, channel, key) held
  std::atomic<std::uint64_t> bytes_sent_{0};
  std::atomic<std::uint64_t> bytes_received_{0};
};

}  // namespace onebit::transport::gloo
