// onebit's verbs transport (ONEBIT_TRANSPORT=ibverbs): the transport/transport.h contract over
// InfiniBand or RoCE reliable-connected queue pairs, one per peer.
//
//   set-up    the TCP mesh of transport/tcp/mesh.h with one socket per peer (bootstrap at the root,
//             MAC'd hello), over which each pair swaps queue-pair endpoints (wire::VerbsEndpoint)
//             and moves its queue pairs INIT -> RTR -> RTS. The socket stays open: abort texts
//             travel on it, and its end is how a rank learns at once that a peer has gone.
//   data      receiver-driven rendezvous (rendezvous.h): a receive offers its registered buffer,
//             the send RDMA-writes into it with the offer's id as immediate data. Buffers are
//             registered through registration_cache.h: once per engine buffer, per message for
//             the caller's memory.
//   progress  one thread per transport sleeps on the completion channel and the set-up sockets
//             (epoll), so a rank waiting on the wire burns no CPU.
//
// Failures map to TCP's errors: a peer's end or a failed completion -> ONEBIT_REMOTE_ERROR naming
// the peer; a disagreement on a message -> ONEBIT_MISMATCH naming both ranks; the deadline ->
// ONEBIT_TIMEOUT with the same text. Any of them breaks the transport as TCP's does: every queue
// pair goes to the error state (so no peer's write can land in this rank's memory afterwards), the
// error text goes to every peer on its set-up socket, and every pending and later request fails
// with the first error.
#pragma once

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <infiniband/verbs.h>

#include "common/error.h"
#include "transport/ibverbs/registration_cache.h"
#include "transport/tcp/mesh.h"
#include "transport/transport.h"

namespace onebit::transport::ibverbs {

struct VerbsOptions {
  tcp::TransportOptions tcp;  // bootstrap, timeout, interface, auth key (one set-up socket per peer)
  std::string hca;            // ONEBIT_IB_HCA: device[:port]; empty: the first active port
  int gid_index = -1;         // ONEBIT_IB_GID_INDEX; -1: chosen (RoCE v2 with IPv4 first) or LID on IB
  int ack_timeout = 18;       // ONEBIT_IB_TIMEOUT
};

class IbverbsTransport final : public Transport {
 public:
  // Opens the device, joins the job at `root` and connects a queue pair to every other rank.
  // Throws: ONEBIT_SYSTEM_ERROR when libibverbs or a usable device is missing (naming what was
  // found), the mesh's errors, ONEBIT_REMOTE_ERROR for a peer's bad endpoint.
  IbverbsTransport(int rank, int size, const tcp::Address& root, const VerbsOptions& options);
  ~IbverbsTransport() override;
  IbverbsTransport(const IbverbsTransport&) = delete;
  IbverbsTransport& operator=(const IbverbsTransport&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::chrono::milliseconds timeout() const override { return options_.tcp.timeout; }

  void isend(Request& request, int peer, std::uint32_t channel, const wire::MessageKey& key,
             const wire::CallShape& shape, const void* data, std::size_t bytes) override;
  void irecv(Request& request, int peer, std::uint32_t channel, const wire::MessageKey& key,
             const wire::CallShape& shape, void* data, std::size_t bytes) override;
  void wait_all(const std::vector<Request*>& requests, Deadline deadline,
                const std::function<std::string(const Request&)>& describe) override;
  TransportStats stats() const override;
  void abort(onebit_result_t code, const std::string& why) override;

 private:
  struct Device;
  struct Peer;

  void open_device();
  void connect_queue_pairs(const tcp::Address& root);
  void progress_loop();
  void handle_completions();
  void on_completion(const ibv_wc& wc);
  void handle_side_socket(Peer& peer);
  void start_write(Peer& peer, Request& send, const wire::ClearToSend& offer);
  void send_offer(Peer& peer, const wire::ClearToSend& offer);
  void post_receive_slot(Peer& peer, std::uint32_t slot);
  void flush_waiting(Peer& peer);
  bool start_locked(Request& request, bool is_send, int peer, const wire::MessageKey& key, const wire::CallShape& shape,
                    void* data, std::size_t bytes);
  void complete(Request& request);
  void fail_locked(onebit_result_t code, const std::string& message);
  [[noreturn]] void throw_failure_locked() const;

  const int rank_;
  const int size_;
  const VerbsOptions options_;
  std::string description_;

  std::unique_ptr<Device> device_;            // destroyed last: the PD, CQ and context
  std::unique_ptr<RegistrationCache> cache_;  // over device_
  std::vector<std::unique_ptr<Peer>> peers_;  // by rank; null for this rank

  mutable std::mutex mutex_;
  std::condition_variable completed_;
  std::map<const Request*, RegistrationCache::Lease> leases_;  // every pending request's registration
  tcp::Fd epoll_;
  tcp::Fd wakeup_;
  std::thread progress_;
  bool stopping_ = false;
  bool failed_ = false;
  onebit_result_t failure_code_ = ONEBIT_SUCCESS;
  std::string failure_message_;
  TransportStats stats_;
};

}  // namespace onebit::transport::ibverbs
