#include "transport/gloo/gloo_transport.h"

#include <gloo/common/error.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>

#include "common/error.h"
#include "common/log.h"
#include "transport/gloo/libgloo.h"
#include "transport/wait_all.h"

namespace onebit::transport::gloo {

std::uint64_t slot_of(std::uint32_t channel, const wire::MessageKey& key) {
  return std::uint64_t{kSlotPrefix} << 56 | std::uint64_t{channel} << 24 |
         std::uint64_t{static_cast<std::uint8_t>(key.kind)} << 16 | key.part;
}

GlooTransport::GlooTransport(::gloo::Context* context) : context_(context), timeout_(timeout_of(context)) {}

std::chrono::milliseconds GlooTransport::timeout_of(::gloo::Context* context) {
  const Libgloo& gloo = libgloo();
  ONEBIT_CHECK(gloo.allreduce != nullptr, ONEBIT_INTERNAL_ERROR,
               "the gloo transport needs the process's libgloo.so.0: ", gloo.error);
  return gloo.get_timeout(context);
}

void GlooTransport::throw_if_failed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (failed_) ::onebit::fail(failure_code_, failure_message_);
}

void GlooTransport::fail(onebit_result_t code, const std::string& message) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!failed_) {
    failed_ = true;
    failure_code_ = code;
    failure_message_ = message;
    receive_matches_.clear();
    ONEBIT_LOG(WARN, "gloo transport of rank ", context_->rank, " broken: ", message);
    // Close every pair: its socket leaves gloo's event loop, so no pending receive of any call
    // touches its buffer again, and the peers' sockets reset, so every rank fails now rather than
    // at its own timeout. The context is lost either way (gloo's own timeouts close it too).
    for (int peer = 0; peer < context_->size; ++peer) {
      if (peer == context_->rank) continue;
      try {
        libgloo().get_pair(context_, peer)->close();
      } catch (const std::exception& error) {
        ONEBIT_LOG(WARN, "closing gloo pair to rank ", peer, ": ", error.what());
      }
    }
  }
  ::onebit::fail(code, message);
}

void GlooTransport::start(Request& request, bool is_send, int peer, std::uint32_t channel, const wire::MessageKey& key,
                          const wire::CallShape& shape, void* data, std::size_t bytes) {
  throw_if_failed();
  ONEBIT_CHECK(peer >= 0 && peer < context_->size && peer != context_->rank, ONEBIT_INTERNAL_ERROR, "rank ",
               context_->rank, ": no peer ", peer, " in a gloo context of size ", context_->size);
  request = Request::of(is_send, peer, key, shape, data, bytes);
  request.channel = channel;
  if (!is_send) hold_receive_match(request);
  try {
    std::shared_ptr<::gloo::transport::UnboundBuffer> buffer = libgloo().create_unbound_buffer(context_, data, bytes);
    const std::uint64_t slot = slot_of(channel, key);
    if (is_send) {
      buffer->send(peer, slot, 0, bytes);
    } else {
      buffer->recv(peer, slot, 0, bytes);
    }
    request.handle = std::move(buffer);
    request.state = Request::State::kPending;
  } catch (const std::exception& error) {
    // gloo::Exception, and gloo's GLOO_ENFORCE (EnforceNotMet, a std::exception only): either
    // breaks the transport, as every failure must.
    request.state = Request::State::kFailed;
    fail(ONEBIT_REMOTE_ERROR, "rank " + std::to_string(context_->rank) + ": gloo refused a " +
                                  (is_send ? "send to" : "receive from") + " rank " + std::to_string(peer) + ": " +
                                  error.what());
  }
}

void GlooTransport::hold_receive_match(const Request& request) {
  bool held_already = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    held_already = !receive_matches_.emplace(request.peer, request.channel, request.key).second;
  }
  if (held_already) fail(ONEBIT_INTERNAL_ERROR, second_receive_text(context_->rank, request.peer, request.key));
}

void GlooTransport::release_receive_match(const Request& request) {
  std::lock_guard<std::mutex> lock(mutex_);
  receive_matches_.erase({request.peer, request.channel, request.key});
}

void GlooTransport::isend(Request& request, int peer, std::uint32_t channel, const wire::MessageKey& key,
                          const wire::CallShape& shape, const void* data, std::size_t bytes) {
  // Gloo's buffers are not const; a send only reads.
  start(request, true, peer, channel, key, shape, const_cast<void*>(data), bytes);
}

void GlooTransport::irecv(Request& request, int peer, std::uint32_t channel, const wire::MessageKey& key,
                          const wire::CallShape& shape, void* data, std::size_t bytes) {
  start(request, false, peer, channel, key, shape, data, bytes);
}

void GlooTransport::wait_all(const std::vector<Request*>& requests, Deadline deadline,
                             const std::function<std::string(const Request&)>& describe) {
  throw_if_failed();
  for (Request* request : requests) {
    if (request->state != Request::State::kDone) wait_one(*request, deadline, describe);
  }
}

void GlooTransport::wait_one(Request& request, Deadline deadline,
                             const std::function<std::string(const Request&)>& describe) {
  const std::string what = (request.is_send ? "send to rank " : "receive from rank ") + std::to_string(request.peer) +
                           " (" + describe(request) + ")";
  if (request.state != Request::State::kPending || !request.handle) {
    request.state = Request::State::kFailed;
    fail(ONEBIT_INTERNAL_ERROR,
         "rank " + std::to_string(context_->rank) + ": wait on a request that was never started: " + what);
  }
  auto* buffer = static_cast<::gloo::transport::UnboundBuffer*>(request.handle.get());
  // At least a millisecond: gloo treats its own timeout as the failure that breaks the context,
  // which is what a wait past the deadline must do here too.
  const auto left = std::max(std::chrono::milliseconds(1),
                             std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
  bool done = false;
  try {
    done = request.is_send ? buffer->waitSend(nullptr, left) : buffer->waitRecv(nullptr, left);
  } catch (const ::gloo::Exception& error) {
    request.state = Request::State::kFailed;
    const std::string text = error.what();
    const bool timed_out = text.find("Timed out") != std::string::npos;
    fail(timed_out ? ONEBIT_TIMEOUT : ONEBIT_REMOTE_ERROR,
         "rank " + std::to_string(context_->rank) + ": " + what +
             (timed_out ? " timed out after " + std::to_string(timeout_.count()) + " ms (the gloo context's timeout)"
                        : " failed") +
             ": " + text);
  } catch (const std::exception& error) {  // GLOO_ENFORCE's EnforceNotMet is no gloo::Exception
    request.state = Request::State::kFailed;
    fail(ONEBIT_INTERNAL_ERROR,
         "rank " + std::to_string(context_->rank) + ": " + what + " failed in gloo: " + error.what());
  }
  if (!done) {  // outside the try: this failure too breaks the transport, not just the call
    request.state = Request::State::kFailed;
    fail(ONEBIT_INTERNAL_ERROR, "gloo aborted a wait onebit did not abort: " + what);
  }
  if (!request.is_send) release_receive_match(request);
  request.state = Request::State::kDone;
  request.handle.reset();
  (request.is_send ? bytes_sent_ : bytes_received_) += request.bytes;
}

TransportStats GlooTransport::stats() const {
  TransportStats s;
  s.bytes_sent = bytes_sent_;
  s.bytes_received = bytes_received_;
  return s;
}

}  // namespace onebit::transport::gloo
