// The connecting side of onebit's NCCL_NET connections (net_comm.h): connect_step opens the handle's
// sockets without blocking and sends each a hello MAC'd under the handle's secret, keeping its
// state between NCCL's retries in the handle (PendingNetConnect).
#include "transport/tcp/net_comm.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "common/params.h"
#include "transport/tcp/connection.h"
#include "transport/tcp/net_internal.h"

namespace onebit::transport::tcp {
namespace {

SipKey key_of(const NetHandle& handle) {
  SipKey key;
  std::memcpy(key.data(), handle.secret, sizeof(handle.secret));
  return key;
}

}  // namespace

class PendingNetConnect {
 public:
  explicit PendingNetConnect(const NetHandle& handle)
      : address_(address_of(handle)), deadline_(Clock::now() + std::chrono::milliseconds(param::TimeoutMs())) {
    ONEBIT_CHECK(handle.magic == kHandleMagic && handle.version == kHandleVersion, ONEBIT_INVALID_ARGUMENT,
                 "not a onebit NCCL net handle (magic ", handle.magic, ", version ", handle.version,
                 "): are both sides using NCCL_NET_PLUGIN=onebit?");
    ONEBIT_CHECK(handle.sockets >= 1 && handle.sockets <= kMaxSockets, ONEBIT_INVALID_ARGUMENT, "handle asks for ",
                 handle.sockets, " sockets");
    const SipKey key = key_of(handle);
    const std::uint64_t connection = random64();
    for (int i = 0; i < handle.sockets; ++i) {
      Outgoing out;
      out.fd = Fd(::socket(address_.storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
      ONEBIT_CHECK(out.fd, ONEBIT_SYSTEM_ERROR, "socket: ", errno_string(errno));
      const int rc = ::connect(out.fd.get(), reinterpret_cast<const sockaddr*>(&address_.storage), address_.length);
      ONEBIT_CHECK(rc == 0 || errno == EINPROGRESS, ONEBIT_SYSTEM_ERROR, "connect to ", address_.to_string(), ": ",
                   errno_string(errno));
      wire::Hello hello;
      hello.socket_index = static_cast<std::uint16_t>(i);
      hello.sockets_per_peer = handle.sockets;
      hello.job_id = connection;
      out.hello = signed_hello(hello, key);
      out_.push_back(std::move(out));
    }
  }

  std::unique_ptr<NetComm> step() {
    bool all = true;
    for (Outgoing& out : out_) {
      if (out.sent == out.hello.size()) continue;
      if (!out.connected) {
        pollfd p{out.fd.get(), POLLOUT, 0};
        if (::poll(&p, 1, 0) <= 0) {
          all = false;
          continue;
        }
        int error = 0;
        socklen_t length = sizeof(error);
        ::getsockopt(out.fd.get(), SOL_SOCKET, SO_ERROR, &error, &length);
        ONEBIT_CHECK(error == 0, error == ECONNREFUSED ? ONEBIT_REMOTE_ERROR : ONEBIT_SYSTEM_ERROR, "connect to ",
                     address_.to_string(), ": ", errno_string(error));
        out.connected = true;
      }
      const ssize_t sent =
          ::send(out.fd.get(), out.hello.data() + out.sent, out.hello.size() - out.sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (sent > 0) out.sent += static_cast<std::size_t>(sent);
      if (sent < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        ::onebit::fail(ONEBIT_REMOTE_ERROR, "hello to ", address_.to_string(), ": ", errno_string(errno));
      }
      if (out.sent < out.hello.size()) all = false;
    }
    if (!all) {
      ONEBIT_CHECK(Clock::now() < deadline_, ONEBIT_TIMEOUT, "connecting to ", address_.to_string(), " took more than ",
                   param::TimeoutMs(), " ms (ONEBIT_TIMEOUT_MS)");
      return nullptr;
    }
    std::vector<Fd> fds;
    for (Outgoing& out : out_) fds.push_back(std::move(out.fd));
    return std::make_unique<NetComm>(true, std::move(fds), address_.to_string());
  }

 private:
  struct Outgoing {
    Fd fd;
    bool connected = false;
    std::array<std::uint8_t, wire::Hello::kSize> hello{};
    std::size_t sent = 0;
  };
  Address address_;
  Deadline deadline_;
  std::vector<Outgoing> out_;
};

std::unique_ptr<NetComm> connect_step(NetHandle& handle) {
  if (handle.pending == nullptr) handle.pending = new PendingNetConnect(handle);
  auto* pending = static_cast<PendingNetConnect*>(handle.pending);
  std::unique_ptr<NetComm> comm;
  try {
    comm = pending->step();
  } catch (...) {
    delete pending;
    handle.pending = nullptr;
    throw;
  }
  if (comm) {
    delete pending;
    handle.pending = nullptr;
  }
  return comm;
}

}  // namespace onebit::transport::tcp
