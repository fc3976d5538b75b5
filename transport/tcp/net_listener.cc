// The listening side of onebit's NCCL_NET connections (net_comm.h): NetListener makes the listen
// handle (address, socket count, secret) and accepts, without blocking, the socket groups whose
// hellos carry the secret's MAC; refused and dropped connections go to the log sink.
#include "transport/tcp/net_comm.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/log.h"
#include "common/params.h"
#include "transport/tcp/connection.h"
#include "transport/tcp/net_internal.h"

namespace onebit::transport::tcp {
namespace {

// A connection from a stranger gets this long (at most ONEBIT_TIMEOUT_MS) to send its hello.
constexpr std::chrono::milliseconds kHelloGrace{5000};

void default_sink(bool warning, const std::string& text) {
  if (warning) {
    ONEBIT_LOG(WARN, text);
  } else {
    ONEBIT_LOG(INFO, text);
  }
}
LogSink log_sink = default_sink;

}  // namespace

void set_log_sink(LogSink sink) { log_sink = sink != nullptr ? sink : default_sink; }

NetListener::NetListener(const NetDevice& device, int sockets) {
  ONEBIT_CHECK(sockets >= 1 && sockets <= kMaxSockets, ONEBIT_INVALID_ARGUMENT, "ONEBIT_SOCKETS_PER_PEER=", sockets,
               " must be 1..", kMaxSockets);
  fd_ = listen_on(device.address, 16384);
  set_nonblocking(fd_.get());
  handle_.magic = kHandleMagic;
  handle_.version = kHandleVersion;
  handle_.sockets = static_cast<std::uint16_t>(sockets);
  handle_.address = wire::to_wire(local_address(fd_.get()).storage);
  key_ = {random64(), random64()};
  std::memcpy(handle_.secret, key_.data(), sizeof(handle_.secret));
  handle_.pending = nullptr;
}

NetListener::~NetListener() = default;

std::unique_ptr<NetComm> NetListener::accept() {
  for (;;) {  // everything waiting in the backlog
    const int fd = ::accept4(fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) break;
      ::onebit::fail(ONEBIT_SYSTEM_ERROR, "accept on ", describe(handle_), ": ", errno_string(errno));
    }
    incoming_.push_back(
        Incoming{Fd(fd), {}, 0, Clock::now() + std::min(kHelloGrace, std::chrono::milliseconds(param::TimeoutMs()))});
  }
  const auto now = Clock::now();
  for (auto it = incoming_.begin(); it != incoming_.end();) {
    const ssize_t got = ::recv(it->fd.get(), it->hello.data() + it->read, it->hello.size() - it->read, MSG_DONTWAIT);
    const std::string from = peer_address(it->fd.get()).to_string();
    if (got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      log_sink(true, "a connection from " + from + " to " + describe(handle_) + " closed before its hello");
      it = incoming_.erase(it);
      continue;
    }
    if (got > 0) it->read += static_cast<std::size_t>(got);
    if (it->read < it->hello.size()) {
      if (now >= it->deadline) {
        log_sink(true, "dropped a connection from " + from + " to " + describe(handle_) + ": no hello within " +
                           std::to_string(param::TimeoutMs()) + " ms (ONEBIT_TIMEOUT_MS)");
        it = incoming_.erase(it);
      } else {
        ++it;
      }
      continue;
    }
    try {
      const wire::Hello hello = verify_hello(it->hello.data(), key_, "connection from " + from);
      ONEBIT_CHECK(hello.sockets_per_peer == handle_.sockets && hello.socket_index < handle_.sockets,
                   ONEBIT_REMOTE_ERROR, "socket ", hello.socket_index, " of ", hello.sockets_per_peer, ", expected ",
                   handle_.sockets);
      PendingGroup& group = groups_[hello.job_id];
      if (group.sockets.empty()) {
        group.sockets.resize(handle_.sockets);
        group.from = from;
        group.deadline = now + std::chrono::milliseconds(param::TimeoutMs());
      }
      ONEBIT_CHECK(!group.sockets[hello.socket_index], ONEBIT_REMOTE_ERROR, "socket ", hello.socket_index,
                   " came twice");
      group.sockets[hello.socket_index] = std::move(it->fd);
    } catch (const Error& error) {
      log_sink(true, "refused a connection from " + from + " to " + describe(handle_) + ": " + error.what());
    }
    it = incoming_.erase(it);
  }
  for (auto it = groups_.begin(); it != groups_.end();) {
    const auto arrived =
        std::count_if(it->second.sockets.begin(), it->second.sockets.end(), [](const Fd& fd) { return bool(fd); });
    if (arrived == static_cast<long>(it->second.sockets.size())) {
      const std::string peer = peer_address(it->second.sockets[0].get()).to_string();
      auto comm = std::make_unique<NetComm>(false, std::move(it->second.sockets), peer);
      groups_.erase(it);
      return comm;
    }
    if (now >= it->second.deadline) {
      // A peer that died mid-connect: its sockets would otherwise stay open as long as the listener.
      log_sink(true, "dropped an incomplete connection from " + it->second.from + " to " + describe(handle_) + ": " +
                         std::to_string(arrived) + " of " + std::to_string(it->second.sockets.size()) +
                         " sockets within " + std::to_string(param::TimeoutMs()) + " ms (ONEBIT_TIMEOUT_MS)");
      it = groups_.erase(it);
      continue;
    }
    ++it;
  }
  return nullptr;
}

}  // namespace onebit::transport::tcp
