#include "transport/tcp/tcp_transport.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>

#include "common/log.h"
#include "transport/progress.h"
#include "transport/wait_all.h"

namespace onebit::transport::tcp {
namespace {

// Messages smaller than this go whole on one socket; larger ones are striped over all of a peer's
// sockets, in segments aligned to a page.
constexpr std::size_t kStripeMinBytes = 256 * 1024;
constexpr std::size_t kSegmentAlign = 4096;
// Largest message held before its receive is posted (see on_segment_header).
constexpr std::uint64_t kMaxUnexpectedBytes = std::uint64_t{256} << 20;
// The progress thread moves at most this much per socket before looking at the others.
constexpr std::size_t kMaxBytesPerTurn = 4 << 20;

}  // namespace

struct TcpTransport::Unexpected {
  wire::CallShape shape;
  std::vector<std::uint8_t> data;
  std::size_t received = 0;
  Request* claimed = nullptr;
};

struct TcpTransport::Socket {
  Fd fd;
  int peer = -1;
  int index = 0;
  bool writing = false;    // EPOLLOUT armed
  bool closed = false;     // the peer closed it cleanly, with nothing of ours outstanding
  std::string abort_text;  // payload of an abort message being received

  struct Segment {
    Request* request;
    std::array<std::uint8_t, wire::SegmentHeader::kSize> header;
    std::size_t header_sent = 0;
    const std::uint8_t* payload;
    std::size_t payload_bytes;
    std::size_t payload_sent = 0;
  };
  std::deque<Segment> send_queue;

  // Receive side: a header, then its payload into `target`.
  std::array<std::uint8_t, wire::SegmentHeader::kSize> header{};
  std::size_t header_received = 0;
  bool in_payload = false;
  wire::SegmentHeader current;
  std::uint8_t* target = nullptr;
  std::size_t payload_left = 0;
};

struct TcpTransport::Peer {
  std::vector<std::unique_ptr<Socket>> sockets;
  bool closed = false;      // one of its sockets closed cleanly: the peer left after its last message
  bool all_closed = false;  // every socket closed: nothing more can arrive
  std::map<wire::MessageKey, Request*> posted;
  std::map<wire::MessageKey, Unexpected> unexpected;
  std::uint64_t unexpected_bytes = 0;  // what `unexpected` holds, bounded by max_unexpected_bytes
};

TcpTransport::TcpTransport(int rank, int size, const Address& root, const TransportOptions& options)
    : rank_(rank), size_(size), options_(options) {
  ONEBIT_CHECK(size >= 1, ONEBIT_INVALID_ARGUMENT, "world size ", size, " must be at least 1");
  ONEBIT_CHECK(rank >= 0 && rank < size, ONEBIT_INVALID_ARGUMENT, "rank ", rank, " is out of range for ", size,
               " ranks");
  ONEBIT_CHECK(options.sockets_per_peer >= 1 && options.sockets_per_peer <= 64, ONEBIT_INVALID_ARGUMENT,
               "ONEBIT_SOCKETS_PER_PEER=", options.sockets_per_peer, " must be in 1..64");
  peers_.resize(size);
  if (size == 1) return;  // nothing to connect; no progress thread
  bootstrap_and_connect(root);
  epoll_ = Fd(::epoll_create1(EPOLL_CLOEXEC));
  wakeup_ = Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  ONEBIT_CHECK(epoll_ && wakeup_, ONEBIT_SYSTEM_ERROR, "epoll/eventfd: ", errno_text(errno));
  epoll_event wake{};
  wake.events = EPOLLIN;
  wake.data.ptr = nullptr;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wakeup_.get(), &wake);
  for (auto& peer : peers_) {
    if (!peer) continue;
    for (auto& socket : peer->sockets) {
      epoll_event event{};
      event.events = EPOLLIN | EPOLLRDHUP;
      event.data.ptr = socket.get();
      ONEBIT_CHECK(::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, socket->fd.get(), &event) == 0, ONEBIT_SYSTEM_ERROR,
                   "epoll_ctl: ", errno_text(errno));
    }
  }
  progress_ = std::thread([this] { progress_loop(); });
}

TcpTransport::~TcpTransport() { stop_progress_thread(progress_, mutex_, stopping_, wakeup_.get()); }

std::string TcpTransport::peer_name(int peer) const { return "rank " + std::to_string(peer); }

void TcpTransport::bootstrap_and_connect(const Address& root) {
  Mesh mesh = connect_mesh(rank_, size_, root, options_, options_.sockets_per_peer);
  job_id_ = mesh.job_id;
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    peers_[peer] = std::make_unique<Peer>();
    for (int index = 0; index < options_.sockets_per_peer; ++index) {
      auto socket = std::make_unique<Socket>();
      socket->fd = std::move(mesh.sockets[peer][index]);
      socket->peer = peer;
      socket->index = index;
      set_nonblocking(socket->fd.get());
      tune_data_socket(socket->fd.get());
      peers_[peer]->sockets.push_back(std::move(socket));
    }
  }
}

// ---- requests ----

bool TcpTransport::start_locked(Request& request, bool is_send, int peer, const wire::MessageKey& key,
                                const wire::CallShape& shape, void* data, std::size_t bytes) {
  ONEBIT_CHECK(peer >= 0 && peer < size_ && peer != rank_, ONEBIT_INTERNAL_ERROR, "rank ", rank_,
               ": no connection to rank ", peer);
  request = Request::of(is_send, peer, key, shape, data, bytes);
  request.state = failed_ ? Request::State::kFailed : Request::State::kPending;
  return !failed_;
}

void TcpTransport::fail_left_peer_locked(Request& request, int peer) {
  request.state = Request::State::kFailed;
  fail_locked(ONEBIT_REMOTE_ERROR, "rank " + std::to_string(rank_) + ": rank " + std::to_string(peer) +
                                       " closed the connection (it left the job or exited)");
}

void TcpTransport::isend(Request& request, int peer, std::uint32_t, const wire::MessageKey& key,
                         const wire::CallShape& shape, const void* data, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!start_locked(request, true, peer, key, shape, const_cast<void*>(data), bytes)) return;
  Peer& p = *peers_[peer];
  if (p.closed) {
    fail_left_peer_locked(request, peer);
    return;
  }
  const int sockets = static_cast<int>(p.sockets.size());
  // Small messages whole on one socket (spread by key); large ones in one segment per socket.
  int segments = 1;
  std::size_t segment_bytes = bytes;
  if (bytes >= kStripeMinBytes && sockets > 1) {
    segment_bytes = ((bytes + sockets - 1) / sockets + kSegmentAlign - 1) / kSegmentAlign * kSegmentAlign;
    segments = static_cast<int>((bytes + segment_bytes - 1) / segment_bytes);
  }
  // A segment's length travels as 32 bits. The engine's messages are a few MiB; this guards the
  // transport's other users.
  ONEBIT_CHECK(segment_bytes <= UINT32_MAX, ONEBIT_INVALID_ARGUMENT, "rank ", rank_, ": a message of ", bytes,
               " bytes to rank ", peer, " exceeds 4 GiB per socket (", sockets, " sockets)");
  const int first_socket =
      segments == 1 ? static_cast<int>((key.part + key.seq + static_cast<int>(key.kind)) % sockets) : 0;
  request.pending_segments = segments;
  for (int s = 0; s < segments; ++s) {
    wire::SegmentHeader header;
    header.key = key;
    header.shape = shape;
    header.total_bytes = bytes;
    header.offset = static_cast<std::uint64_t>(s) * segment_bytes;
    header.segment_bytes = static_cast<std::uint32_t>(std::min(segment_bytes, bytes - header.offset));
    Socket& socket = *p.sockets[(first_socket + s) % sockets];
    socket.send_queue.push_back(
        Socket::Segment{&request, header.encode(), 0, request.data + header.offset, header.segment_bytes, 0});
    update_interest(socket);
  }
}

void TcpTransport::irecv(Request& request, int peer, std::uint32_t, const wire::MessageKey& key,
                         const wire::CallShape& shape, void* data, std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!start_locked(request, false, peer, key, shape, data, bytes)) return;
  Peer& p = *peers_[peer];
  auto found = p.unexpected.find(key);
  if (p.posted.count(key) != 0 || (found != p.unexpected.end() && found->second.claimed != nullptr)) {
    // Keys are unique among one peer's messages in flight (transport.h): a second receive would
    // take the first one's message and leave the first waiting for the timeout.
    request.state = Request::State::kFailed;
    fail_locked(ONEBIT_INTERNAL_ERROR, second_receive_text(rank_, peer, key));
    return;
  }
  if (found == p.unexpected.end()) {
    if (p.all_closed) {
      fail_left_peer_locked(request, peer);
      return;
    }
    p.posted[key] = &request;
    return;
  }
  Unexpected& early = found->second;
  if (!(early.shape == request.shape) || early.data.size() != bytes) {
    fail_locked(ONEBIT_MISMATCH,
                "rank " + std::to_string(rank_) + " and rank " + std::to_string(peer) + " disagree on a " +
                    wire::kind_name(key.kind) + " message: rank " + std::to_string(rank_) + " expects " +
                    std::to_string(shape.count) + " elements of dtype " + std::to_string(shape.dtype) + " op " +
                    std::to_string(shape.op) + " (" + std::to_string(bytes) + " bytes), rank " + std::to_string(peer) +
                    " sent " + std::to_string(early.shape.count) + " elements of dtype " +
                    std::to_string(early.shape.dtype) + " op " + std::to_string(early.shape.op) + " (" +
                    std::to_string(early.data.size()) + " bytes)");
    return;
  }
  if (early.received == early.data.size()) {
    if (bytes > 0) std::memcpy(request.data, early.data.data(), bytes);
    request.transferred = bytes;
    p.unexpected_bytes -= early.data.size();
    p.unexpected.erase(found);
    complete(request);
  } else {
    early.claimed = &request;
  }
}

void TcpTransport::wait_all(const std::vector<Request*>& requests, Deadline deadline,
                            const std::function<std::string(const Request&)>& describe) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (const Request* late = wait_until_settled(lock, completed_, requests, deadline, [this] { return failed_; })) {
    fail_locked(ONEBIT_TIMEOUT, timeout_text(rank_, options_.timeout, *late, describe));
  }
  if (!all_done(requests)) throw_failure_locked();
}

TransportStats TcpTransport::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void TcpTransport::abort(onebit_result_t code, const std::string& why) {
  std::lock_guard<std::mutex> lock(mutex_);
  fail_locked(code, why);
}

void TcpTransport::throw_failure_locked() const { throw Error(failure_code_, failure_message_); }

void TcpTransport::fail_locked(onebit_result_t code, const std::string& message) {
  if (failed_) return;
  failed_ = true;
  failure_code_ = code;
  failure_message_ = message;
  ONEBIT_LOG(WARN, "transport of rank ", rank_, " broken: ", message);
  for (auto& peer : peers_) {
    if (!peer) continue;
    for (auto& [key, request] : peer->posted) request->state = Request::State::kFailed;
    peer->posted.clear();
    for (auto& [key, early] : peer->unexpected) {
      if (early.claimed) early.claimed->state = Request::State::kFailed;
    }
    peer->unexpected.clear();
    peer->unexpected_bytes = 0;
    // Tell the peer why, on the sockets that are between messages, so that it can name the first
    // failure rather than this rank's disconnection. Best effort: one non-blocking send each.
    for (auto& socket : peer->sockets) {
      if (!socket || socket->closed || !socket->send_queue.empty()) continue;
      const std::string text = message.substr(0, 4000);
      wire::SegmentHeader header;
      header.key.kind = wire::Kind::kAbort;
      header.total_bytes = text.size();
      header.segment_bytes = static_cast<std::uint32_t>(text.size());
      const auto bytes = header.encode();
      iovec parts[2] = {{const_cast<std::uint8_t*>(bytes.data()), bytes.size()},
                        {const_cast<char*>(text.data()), text.size()}};
      msghdr frame{};
      frame.msg_iov = parts;
      frame.msg_iovlen = 2;
      // On every idle socket: the peer may see the end of any of them first.
      [[maybe_unused]] ssize_t sent = ::sendmsg(socket->fd.get(), &frame, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    for (auto& socket : peer->sockets) {
      if (!socket) continue;
      for (auto& segment : socket->send_queue) segment.request->state = Request::State::kFailed;
      socket->send_queue.clear();
      socket->in_payload = false;
      socket->target = nullptr;
      // Peers see the connection end at once, instead of waiting for their own timeout.
      if (socket->fd) ::shutdown(socket->fd.get(), SHUT_RDWR);
      if (epoll_) ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, socket->fd.get(), nullptr);
    }
  }
  completed_.notify_all();
}

void TcpTransport::complete(Request& request) {
  request.state = Request::State::kDone;
  completed_.notify_all();
}

void TcpTransport::update_interest(Socket& socket) {
  const bool want = !socket.send_queue.empty();
  if (want == socket.writing || !epoll_) return;
  epoll_event event{};
  event.events = EPOLLIN | EPOLLRDHUP | (want ? EPOLLOUT : 0u);
  event.data.ptr = &socket;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, socket.fd.get(), &event);
  socket.writing = want;
}

// ---- the progress thread ----

void TcpTransport::progress_loop() {
  epoll_event events[64];
  for (;;) {
    const int n = ::epoll_wait(epoll_.get(), events, 64, -1);
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return;
    if (n < 0) {
      if (errno == EINTR) continue;
      fail_locked(ONEBIT_SYSTEM_ERROR, "epoll_wait: " + errno_text(errno));
      continue;
    }
    for (int i = 0; i < n && !failed_; ++i) {
      auto* socket = static_cast<Socket*>(events[i].data.ptr);
      if (socket == nullptr) continue;  // wake-up
      try {
        if (socket->closed) continue;
        if (events[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) handle_readable(*socket);
        if (!failed_ && !socket->closed && (events[i].events & EPOLLOUT)) handle_writable(*socket);
      } catch (const Error& error) {
        fail_locked(error.code(), "rank " + std::to_string(rank_) + ": " + error.what());
      } catch (const std::bad_alloc&) {
        fail_locked(ONEBIT_SYSTEM_ERROR, "rank " + std::to_string(rank_) + ": out of memory receiving from rank " +
                                             std::to_string(socket->peer));
      } catch (const std::exception& error) {
        // Nothing may escape the progress thread: that would terminate the training process.
        fail_locked(ONEBIT_INTERNAL_ERROR, "rank " + std::to_string(rank_) + ": internal error: " + error.what());
      }
    }
  }
}

void TcpTransport::handle_readable(Socket& socket) {
  std::size_t moved = 0;
  while (moved < kMaxBytesPerTurn && !failed_) {
    ssize_t n;
    if (!socket.in_payload) {
      n = ::recv(socket.fd.get(), socket.header.data() + socket.header_received,
                 socket.header.size() - socket.header_received, MSG_DONTWAIT);
    } else {
      n = ::recv(socket.fd.get(), socket.target, socket.payload_left, MSG_DONTWAIT);
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n == 0) {
      on_end_of_stream(socket);
      return;
    }
    if (n < 0)
      ::onebit::fail(ONEBIT_REMOTE_ERROR, "lost the connection to rank ", socket.peer, ": ", errno_text(errno));
    moved += static_cast<std::size_t>(n);
    stats_.bytes_received += static_cast<std::uint64_t>(n);
    if (!socket.in_payload) {
      socket.header_received += static_cast<std::size_t>(n);
      if (socket.header_received < socket.header.size()) continue;
      socket.header_received = 0;
      on_segment_header(socket,
                        wire::SegmentHeader::decode(socket.header.data(), "rank " + std::to_string(socket.peer)));
    } else {
      socket.target += n;
      socket.payload_left -= static_cast<std::size_t>(n);
      if (socket.payload_left == 0) on_segment_done(socket);
    }
  }
}

void TcpTransport::on_end_of_stream(Socket& socket) {
  // A peer that has sent everything and destroyed its communicator closes its sockets: that is not
  // an error unless this rank still expects something from it, or still has something for it. The
  // sockets close one by one, and data can still be in flight on the others: the socket's own state
  // is checked now, the peer's pending receives when its last socket has closed.
  Peer& peer = *peers_[socket.peer];
  if (socket.in_payload || socket.header_received > 0 || !socket.send_queue.empty()) {
    ::onebit::fail(ONEBIT_REMOTE_ERROR, "rank ", socket.peer, " closed the connection (it exited, crashed or aborted)");
  }
  socket.closed = true;
  peer.closed = true;  // it has left: nothing new may be sent to it
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, socket.fd.get(), nullptr);
  bool all_closed = true;
  for (auto& s : peer.sockets) all_closed = all_closed && s->closed;
  if (!all_closed) return;
  bool expecting = !peer.posted.empty();
  for (auto& [key, early] : peer.unexpected) expecting = expecting || early.claimed != nullptr;
  if (expecting) {
    ::onebit::fail(ONEBIT_REMOTE_ERROR, "rank ", socket.peer, " closed the connection (it exited, crashed or aborted)");
  }
  peer.all_closed = true;
}

void TcpTransport::on_segment_header(Socket& socket, const wire::SegmentHeader& header) {
  Peer& peer = *peers_[socket.peer];
  socket.current = header;
  if (header.key.kind == wire::Kind::kAbort) {
    socket.abort_text.assign(std::min<std::size_t>(header.segment_bytes, 4000), '\0');
    ONEBIT_CHECK(header.segment_bytes <= 4000, ONEBIT_REMOTE_ERROR, "rank ", socket.peer, " aborted the job");
    socket.target = reinterpret_cast<std::uint8_t*>(socket.abort_text.data());
    socket.payload_left = header.segment_bytes;
    socket.in_payload = socket.payload_left > 0;
    if (!socket.in_payload) on_segment_done(socket);
    return;
  }
  auto posted = peer.posted.find(header.key);
  if (posted != peer.posted.end()) {
    Request& request = *posted->second;
    if (!(request.shape == header.shape) || request.bytes != header.total_bytes) {
      ::onebit::fail(ONEBIT_MISMATCH, "rank ", rank_, " and rank ", socket.peer, " disagree on a ",
                     wire::kind_name(header.key.kind), " message: rank ", rank_, " expects ", request.shape.count,
                     " elements of dtype ", int(request.shape.dtype), " op ", int(request.shape.op), " (",
                     request.bytes, " bytes), rank ", socket.peer, " sent ", header.shape.count, " elements of dtype ",
                     int(header.shape.dtype), " op ", int(header.shape.op), " (", header.total_bytes, " bytes)");
    }
    socket.target = request.data + header.offset;
  } else {
    // A message that arrives before its receive is posted is held here. The protocol's messages
    // are blocks and segments of a few MiB at most; a header announcing more is a broken or hostile
    // peer, and must not make this process allocate what it says.
    ONEBIT_CHECK(header.total_bytes <= kMaxUnexpectedBytes, ONEBIT_REMOTE_ERROR, "rank ", socket.peer,
                 " announced an unsolicited ", wire::kind_name(header.key.kind), " message of ", header.total_bytes,
                 " bytes (at most ", kMaxUnexpectedBytes, " are accepted before the receive is posted)");
    auto held = peer.unexpected.find(header.key);
    if (held == peer.unexpected.end()) {
      // Early messages are a call or two ahead at most; a peer that sends far more than any call
      // has asked for would grow this process without end.
      ONEBIT_CHECK(peer.unexpected_bytes + header.total_bytes <= options_.max_unexpected_bytes, ONEBIT_REMOTE_ERROR,
                   "rank ", socket.peer, " sent ", (peer.unexpected_bytes + header.total_bytes) >> 20,
                   " MiB of messages that no call of rank ", rank_, " has asked for (", peer.unexpected.size() + 1,
                   " messages; ONEBIT_UNEXPECTED_MB=", options_.max_unexpected_bytes >> 20,
                   " bounds them): a broken or hostile peer, or ranks whose calls have parted");
      held = peer.unexpected.emplace(header.key, Unexpected{}).first;
      held->second.shape = header.shape;
      held->second.data.resize(header.total_bytes);
      peer.unexpected_bytes += header.total_bytes;
    }
    Unexpected& early = held->second;
    ONEBIT_CHECK(early.data.size() == header.total_bytes, ONEBIT_REMOTE_ERROR, "rank ", socket.peer,
                 " sent inconsistent segments of one message");
    socket.target = early.data.data() + header.offset;
  }
  socket.payload_left = header.segment_bytes;
  socket.in_payload = socket.payload_left > 0;
  if (!socket.in_payload) on_segment_done(socket);
}

void TcpTransport::on_segment_done(Socket& socket) {
  socket.in_payload = false;
  socket.target = nullptr;
  const wire::SegmentHeader& header = socket.current;
  if (header.key.kind == wire::Kind::kAbort) {
    ::onebit::fail(ONEBIT_REMOTE_ERROR, "rank ", socket.peer,
                   " failed and left the job: ", printable(socket.abort_text));
  }
  Peer& peer = *peers_[socket.peer];
  auto posted = peer.posted.find(header.key);
  if (posted != peer.posted.end()) {
    Request& request = *posted->second;
    request.transferred += header.segment_bytes;
    if (request.transferred == request.bytes) {
      peer.posted.erase(posted);
      complete(request);
    }
    return;
  }
  auto found = peer.unexpected.find(header.key);
  if (found == peer.unexpected.end()) return;
  Unexpected& early = found->second;
  early.received += header.segment_bytes;
  if (early.received == early.data.size() && early.claimed != nullptr) {
    Request& request = *early.claimed;
    if (request.bytes > 0) std::memcpy(request.data, early.data.data(), request.bytes);
    request.transferred = request.bytes;
    peer.unexpected_bytes -= early.data.size();
    peer.unexpected.erase(found);
    complete(request);
  }
}

void TcpTransport::handle_writable(Socket& socket) {
  std::size_t moved = 0;
  while (!socket.send_queue.empty() && moved < kMaxBytesPerTurn) {
    Socket::Segment& segment = socket.send_queue.front();
    iovec parts[2];
    int count = 0;
    if (segment.header_sent < segment.header.size()) {
      parts[count++] = iovec{segment.header.data() + segment.header_sent, segment.header.size() - segment.header_sent};
    }
    if (segment.payload_sent < segment.payload_bytes) {
      parts[count++] = iovec{const_cast<std::uint8_t*>(segment.payload) + segment.payload_sent,
                             segment.payload_bytes - segment.payload_sent};
    }
    ssize_t n = 0;
    if (count > 0) {
      msghdr message{};
      message.msg_iov = parts;
      message.msg_iovlen = static_cast<std::size_t>(count);
      n = ::sendmsg(socket.fd.get(), &message, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
      if (n < 0)
        ::onebit::fail(ONEBIT_REMOTE_ERROR, "lost the connection to rank ", socket.peer, ": ", errno_text(errno));
    }
    moved += static_cast<std::size_t>(n);
    stats_.bytes_sent += static_cast<std::uint64_t>(n);
    std::size_t advance = static_cast<std::size_t>(n);
    const std::size_t header_part = std::min(advance, segment.header.size() - segment.header_sent);
    segment.header_sent += header_part;
    advance -= header_part;
    segment.payload_sent += advance;
    if (segment.header_sent == segment.header.size() && segment.payload_sent == segment.payload_bytes) {
      Request& request = *segment.request;
      request.transferred += segment.payload_bytes;
      socket.send_queue.pop_front();
      if (--request.pending_segments == 0) complete(request);
    }
  }
  update_interest(socket);
}

}  // namespace onebit::transport::tcp
