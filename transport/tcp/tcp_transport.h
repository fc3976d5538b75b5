// onebit's TCP transport: a full mesh of W ranks, several sockets per peer, messages striped across
// them, non-blocking sockets driven by one progress thread (epoll) per transport.
//
// Its pieces have the shape of NCCL's net API: a Listener (listen → handle), connect(handle) and
// accept with the handshake of connection.h — which the NCCL_NET plugin's connections (net_comm.h)
// share — and isend / irecv / wait_all on requests. The mesh is built from those at construction,
// after a bootstrap at the root.
//
// Failure model: any error — a peer closing, a bad header, a mismatch, a timeout — breaks the whole
// transport: every socket is shut down (so peers learn at once), every pending request fails with
// the first error, and every later request fails with it too. The progress thread touches a
// request's buffer only while the request is pending; once wait_all returns (or throws), no
// buffer of any of its requests is touched again.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "transport/tcp/mesh.h"
#include "transport/tcp/socket.h"
#include "transport/transport.h"
#include "transport/wire.h"

namespace onebit::transport::tcp {

class TcpTransport final : public Transport {
 public:
  // Rank `rank` of `size` joins the job whose bootstrap root listens at `root` (rank 0 serves it).
  // Blocks until the mesh is up, or throws (timeout naming the missing ranks, bind errors, ...).
  TcpTransport(int rank, int size, const Address& root, const TransportOptions& options);
  ~TcpTransport();
  TcpTransport(const TcpTransport&) = delete;
  TcpTransport& operator=(const TcpTransport&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::chrono::milliseconds timeout() const override { return options_.timeout; }

  // The channel is not needed here (keys carry the tag and the call's sequence) and is ignored.
  void isend(Request& request, int peer, std::uint32_t channel, const wire::MessageKey& key,
             const wire::CallShape& shape, const void* data, std::size_t bytes) override;
  void irecv(Request& request, int peer, std::uint32_t channel, const wire::MessageKey& key,
             const wire::CallShape& shape, void* data, std::size_t bytes) override;

  void wait_all(const std::vector<Request*>& requests, Deadline deadline,
                const std::function<std::string(const Request&)>& describe) override;

  TransportStats stats() const override;
  void abort(onebit_result_t code, const std::string& why) override;

 private:
  struct Socket;
  struct Peer;
  struct Unexpected;

  void bootstrap_and_connect(const Address& root);
  // Fills in a request; false (request failed) when the transport is already broken.
  bool start_locked(Request& request, bool is_send, int peer, const wire::MessageKey& key, const wire::CallShape& shape,
                    void* data, std::size_t bytes);
  void fail_left_peer_locked(Request& request, int peer);
  void progress_loop();
  void handle_readable(Socket& socket);
  void handle_writable(Socket& socket);
  void on_end_of_stream(Socket& socket);
  void on_segment_header(Socket& socket, const wire::SegmentHeader& header);
  void on_segment_done(Socket& socket);
  void complete(Request& request);
  void update_interest(Socket& socket);
  void fail_locked(onebit_result_t code, const std::string& message);
  [[noreturn]] void throw_failure_locked() const;
  std::string peer_name(int peer) const;

  const int rank_;
  const int size_;
  const TransportOptions options_;
  std::uint64_t job_id_ = 0;

  mutable std::mutex mutex_;
  std::condition_variable completed_;
  std::vector<std::unique_ptr<Peer>> peers_;
  Fd epoll_;
  Fd wakeup_;  // eventfd: tells the progress thread to stop
  std::thread progress_;
  bool stopping_ = false;
  bool failed_ = false;
  onebit_result_t failure_code_ = ONEBIT_SUCCESS;
  std::string failure_message_;
  TransportStats stats_;
};

}  // namespace onebit::transport::tcp
