// The transport interface the engine's algorithms run over: W ranks, tagged point-to-point messages,
// non-blocking sends and receives completed by wait_all. Three backends have this shape:
//
//   transport/tcp      onebit's own TCP mesh (the C API's communicators, ONEBIT_TRANSPORT=tcp);
//   transport/ibverbs  InfiniBand / RoCE queue pairs (ONEBIT_TRANSPORT=ibverbs);
//   transport/gloo     a framework's gloo::Context, over its own pairs (the Gloo front door's default).
//
// Contract every backend keeps:
//   - A message is matched by (peer, channel, key); messages with the same match are delivered in
//     the order they were posted. Receives may be posted before or after the matching send.
//   - Buffers belong to the caller until wait_all has returned or thrown for their requests; after
//     that the backend never touches them again.
//   - Any failure (a peer gone, a mismatch, the deadline) breaks the transport: wait_all throws an
//     onebit::Error naming the peer, and every later request fails with the first error. Breaking
//     it is how every rank learns quickly: the backend tells its peers (closes, aborts) as it can.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/error.h"
#include "transport/wire.h"

namespace onebit {

// A send or a receive in flight. The caller owns it and keeps it (and its buffer) alive until
// wait_all has returned or thrown for it.
struct Request {
  enum class State { kIdle, kPending, kDone, kFailed };
  State state = State::kIdle;
  bool is_send = false;
  int peer = -1;
  wire::MessageKey key;
  wire::CallShape shape;
  std::uint8_t* data = nullptr;
  std::size_t bytes = 0;
  // Backend bookkeeping.
  std::size_t transferred = 0;   // tcp: payload bytes moved so far
  int pending_segments = 0;      // tcp: stripes still in flight
  std::shared_ptr<void> handle;  // gloo: the request's gloo::transport::UnboundBuffer
  std::uint32_t channel = 0;     // gloo: the channel it was posted on

  // A fresh request for one message (state kIdle; the backend sets it).
  static Request of(bool is_send, int peer, const wire::MessageKey& key, const wire::CallShape& shape, void* data,
                    std::size_t bytes) {
    Request r;
    r.is_send = is_send;
    r.peer = peer;
    r.key = key;
    r.shape = shape;
    r.data = static_cast<std::uint8_t*>(data);
    r.bytes = bytes;
    return r;
  }
};

struct TransportStats {
  std::uint64_t bytes_sent = 0;  // payload and the backend's own headers, as far as it knows
  std::uint64_t bytes_received = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // How long one call may wait for its peers.
  virtual std::chrono::milliseconds timeout() const = 0;

  // A message is matched by (peer, key): keys are unique among one peer's messages in flight (the
  // engine's keys carry the tag's stream and the call's sequence number), and a second receive
  // posted for a key whose first is still pending breaks the transport with ONEBIT_INTERNAL_ERROR
  // naming the key — never a silent replacement that leaves the first waiting.
  // `channel` separates concurrent calls that share keys on a backend that cannot see onebit's
  // keys in full (gloo: the framework's tag of the intercepted call, which is unique per call
  // there); the C API's calls pass 0, as only the Gloo door runs on gloo. Every rank passes the
  // same channel for the same message.
  virtual void isend(Request& request, int peer, std::uint32_t channel, const wire::MessageKey& key,
                     const wire::CallShape& shape, const void* data, std::size_t bytes) = 0;
  virtual void irecv(Request& request, int peer, std::uint32_t channel, const wire::MessageKey& key,
                     const wire::CallShape& shape, void* data, std::size_t bytes) = 0;

  // Waits until every request completes. Throws the first failure, or ONEBIT_TIMEOUT (naming the
  // peer and describe(request) of one still pending) at the deadline; either breaks the transport.
  virtual void wait_all(const std::vector<Request*>& requests, Deadline deadline,
                        const std::function<std::string(const Request&)>& describe) = 0;

  virtual TransportStats stats() const = 0;

  // Breaks the transport from outside, as a failure would (onebit_comm_destroy while a call runs on
  // another thread): every pending and later request fails with `code` and `why`, and peers are told
  // as on any failure. A backend that cannot interrupt its waits (gloo: the framework's context)
  // leaves this a no-op; then the call ends at its own deadline.
  virtual void abort(onebit_result_t code, const std::string& why) {
    (void)code;
    (void)why;
  }
};

}  // namespace onebit
