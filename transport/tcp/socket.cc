#include "transport/tcp/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "transport/tcp/file_limit.h"

namespace onebit::transport::tcp {

Fd& Fd::operator=(Fd&& other) noexcept {
  if (this != &other) {
    reset();
    fd_ = other.release();
  }
  return *this;
}

void Fd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::string errno_text(int err) {
  return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")" + descriptor_note(err);
}

namespace {

int remaining_ms(Deadline deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return 0;
  return left > 1000000 ? 1000000 : static_cast<int>(left);
}

// Waits for `events` on fd; false on timeout.
bool wait_for(int fd, short events, Deadline deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, remaining_ms(deadline));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) fail(ONEBIT_SYSTEM_ERROR, "poll: ", errno_text(errno));
  }
}

}  // namespace

bool Address::local_only() const {
  if (storage.ss_family == AF_INET) {
    const std::uint32_t ip = ntohl(reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr.s_addr);
    return ip >> 24 == 127 || ip == 0;
  }
  if (storage.ss_family == AF_INET6) {
    const in6_addr& ip = reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(&ip)) return ip.s6_addr[12] == 127 || (ip.s6_addr32[3] == 0);
    return IN6_IS_ADDR_LOOPBACK(&ip) || IN6_IS_ADDR_UNSPECIFIED(&ip);
  }
  return false;
}

std::string Address::to_string() const {
  char host[INET6_ADDRSTRLEN] = "?";
  if (storage.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&storage);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    return std::string(host) + ":" + std::to_string(ntohs(in->sin_port));
  }
  if (storage.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&storage);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    std::string text = "[";  // appended, not "[" + std::string: GCC 12 warns falsely there (-Wrestrict)
    text += host;
    return text + "]:" + std::to_string(ntohs(in6->sin6_port));
  }
  return "(no address)";
}

std::uint16_t Address::port() const {
  if (storage.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  if (storage.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  return 0;
}

void Address::set_port(std::uint16_t port) {
  if (storage.ss_family == AF_INET) reinterpret_cast<sockaddr_in*>(&storage)->sin_port = htons(port);
  if (storage.ss_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(&storage)->sin6_port = htons(port);
}

Address parse_host_port(const std::string& text, const char* what) {
  std::string host, port;
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    ONEBIT_CHECK(close != std::string::npos && close + 1 < text.size() && text[close + 1] == ':',
                 ONEBIT_INVALID_ARGUMENT, what, "='", text, "' is not [ipv6]:port");
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    const auto colon = text.rfind(':');
    ONEBIT_CHECK(colon != std::string::npos && colon > 0, ONEBIT_INVALID_ARGUMENT, what, "='", text,
                 "' is not host:port");
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  char* end = nullptr;
  const long number = std::strtol(port.c_str(), &end, 10);
  ONEBIT_CHECK(!port.empty() && *end == '\0' && number >= 0 && number <= 65535, ONEBIT_INVALID_ARGUMENT, what, "='",
               text, "': '", port, "' is not a port number");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found);
  ONEBIT_CHECK(rc == 0 && found != nullptr, ONEBIT_INVALID_ARGUMENT, what, "='", text, "': cannot resolve '", host,
               "': ", gai_strerror(rc));
  Address address;
  std::memcpy(&address.storage, found->ai_addr, found->ai_addrlen);
  address.length = found->ai_addrlen;
  freeaddrinfo(found);
  address.set_port(static_cast<std::uint16_t>(number));
  return address;
}

bool interface_matches(const std::string& spec, const std::string& name, bool loopback) {
  if (spec.empty()) return !loopback;
  std::string pattern = spec;
  const bool exclude = pattern[0] == '^';
  if (exclude) pattern = pattern.substr(1);
  const bool exact = !pattern.empty() && pattern[0] == '=';
  if (exact) pattern = pattern.substr(1);
  bool any = false;
  std::size_t start = 0;
  while (start <= pattern.size()) {
    const std::size_t end = std::min(pattern.find(',', start), pattern.size());
    const std::string one = pattern.substr(start, end - start);
    if (!one.empty() && (exact ? name == one : name.rfind(one, 0) == 0)) any = true;
    start = end + 1;
  }
  return exclude ? !any && !loopback : any;
}

Address interface_address(const std::string& ifname) {
  ifaddrs* list = nullptr;
  ONEBIT_CHECK(getifaddrs(&list) == 0, ONEBIT_SYSTEM_ERROR, "getifaddrs: ", errno_text(errno));
  Address chosen;
  std::string seen;
  for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || (it->ifa_addr->sa_family != AF_INET && it->ifa_addr->sa_family != AF_INET6))
      continue;
    if (!(it->ifa_flags & IFF_UP)) continue;
    const std::string candidate = it->ifa_name;
    seen += (seen.empty() ? "" : ", ") + candidate;
    if (!interface_matches(ifname, candidate, (it->ifa_flags & IFF_LOOPBACK) != 0)) continue;
    // Prefer IPv4: the first IPv4 address wins over an earlier IPv6 one.
    if (chosen.length != 0 && !(chosen.storage.ss_family == AF_INET6 && it->ifa_addr->sa_family == AF_INET)) continue;
    chosen.length = it->ifa_addr->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    std::memcpy(&chosen.storage, it->ifa_addr, chosen.length);
  }
  freeifaddrs(list);
  ONEBIT_CHECK(chosen.length != 0, ONEBIT_INVALID_ARGUMENT, "ONEBIT_SOCKET_IFNAME='", ifname,
               "' matches no interface that is up (interfaces: ", seen, ")");
  chosen.set_port(0);
  return chosen;
}

Fd listen_on(const Address& address, int backlog) {
  Fd fd(::socket(address.storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ONEBIT_CHECK(fd, ONEBIT_SYSTEM_ERROR, "socket: ", errno_text(errno));
  int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  ONEBIT_CHECK(::bind(fd.get(), reinterpret_cast<const sockaddr*>(&address.storage), address.length) == 0,
               ONEBIT_SYSTEM_ERROR, "cannot listen on ", address.to_string(), ": bind: ", errno_text(errno));
  ONEBIT_CHECK(::listen(fd.get(), backlog) == 0, ONEBIT_SYSTEM_ERROR, "listen on ", address.to_string(), ": ",
               errno_text(errno));
  return fd;
}

int connect_until(const Address& address, Deadline deadline, Fd* connected) {
  int last_error = 0;
  do {
    Fd fd(::socket(address.storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    ONEBIT_CHECK(fd, ONEBIT_SYSTEM_ERROR, "socket: ", errno_text(errno));
    int rc = ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&address.storage), address.length);
    if (rc != 0 && errno == EINPROGRESS) {
      if (wait_for(fd.get(), POLLOUT, deadline)) {
        socklen_t len = sizeof(last_error);
        ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &last_error, &len);
        rc = last_error == 0 ? 0 : -1;
      } else {
        last_error = ETIMEDOUT;
      }
    } else if (rc != 0) {
      last_error = errno;
    }
    if (rc == 0) {
      const int flags = ::fcntl(fd.get(), F_GETFL);
      ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
      *connected = std::move(fd);
      return 0;
    }
    if (last_error != ECONNREFUSED && last_error != ETIMEDOUT && last_error != EINTR && last_error != ECONNRESET &&
        last_error != EHOSTUNREACH && last_error != ENETUNREACH) {
      break;
    }
    // Refused: the listener is not up yet. Poll again shortly (bounded by the deadline).
    pollfd none{-1, 0, 0};
    ::poll(&none, 0, remaining_ms(deadline) < 20 ? remaining_ms(deadline) : 20);
  } while (Clock::now() < deadline);
  return last_error;
}

onebit_result_t connect_failure_code(int err) {
  return err == ETIMEDOUT || err == ECONNREFUSED ? ONEBIT_TIMEOUT : ONEBIT_SYSTEM_ERROR;
}

Fd connect_to(const Address& address, Deadline deadline, const std::string& peer_name) {
  Fd fd;
  const int err = connect_until(address, deadline, &fd);
  if (err != 0)
    fail(connect_failure_code(err), "cannot connect to ", peer_name, " at ", address.to_string(), ": ",
         errno_text(err));
  return fd;
}

Fd accept_until(int listen_fd, Deadline deadline) {
  while (wait_for(listen_fd, POLLIN, deadline)) {
    Fd fd(::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC));
    if (fd) return fd;
    if (errno != EINTR && errno != ECONNABORTED && errno != EAGAIN) {
      fail(ONEBIT_SYSTEM_ERROR, "accept: ", errno_text(errno));
    }
  }
  return Fd();
}

void write_all(int fd, const void* data, std::size_t bytes, Deadline deadline, const std::string& peer_name) {
  const auto* p = static_cast<const std::uint8_t*>(data);
  while (bytes > 0) {
    ONEBIT_CHECK(wait_for(fd, POLLOUT, deadline), ONEBIT_TIMEOUT, "timed out sending to ", peer_name);
    const ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    ONEBIT_CHECK(n > 0, ONEBIT_REMOTE_ERROR, "lost the connection to ", peer_name, ": ", errno_text(errno));
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

void read_all(int fd, void* data, std::size_t bytes, Deadline deadline, const std::string& peer_name) {
  auto* p = static_cast<std::uint8_t*>(data);
  while (bytes > 0) {
    ONEBIT_CHECK(wait_for(fd, POLLIN, deadline), ONEBIT_TIMEOUT, "timed out waiting for ", peer_name);
    const ssize_t n = ::recv(fd, p, bytes, MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    ONEBIT_CHECK(n != 0, ONEBIT_REMOTE_ERROR, peer_name, " closed the connection");
    ONEBIT_CHECK(n > 0, ONEBIT_REMOTE_ERROR, "lost the connection to ", peer_name, ": ", errno_text(errno));
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

Address address_toward(const Address& peer) {
  Fd fd(::socket(peer.storage.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  ONEBIT_CHECK(fd, ONEBIT_SYSTEM_ERROR, "socket: ", errno_text(errno));
  Address target = peer;
  if (target.port() == 0) target.set_port(9);  // any port: nothing is sent
  ONEBIT_CHECK(::connect(fd.get(), reinterpret_cast<const sockaddr*>(&target.storage), target.length) == 0,
               ONEBIT_SYSTEM_ERROR, "no route to ", peer.to_string(), ": ", errno_text(errno));
  Address mine = local_address(fd.get());
  mine.set_port(0);
  return mine;
}

Address local_address(int fd) {
  Address address;
  address.length = sizeof(address.storage);
  ONEBIT_CHECK(::getsockname(fd, reinterpret_cast<sockaddr*>(&address.storage), &address.length) == 0,
               ONEBIT_SYSTEM_ERROR, "getsockname: ", errno_text(errno));
  return address;
}

Address peer_address(int fd) {
  Address address;
  address.length = sizeof(address.storage);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&address.storage), &address.length) != 0) address.length = 0;
  return address;
}

void set_nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  ONEBIT_CHECK(flags >= 0 && ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0, ONEBIT_SYSTEM_ERROR,
               "fcntl(O_NONBLOCK): ", errno_text(errno));
}

void tune_data_socket(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

}  // namespace onebit::transport::tcp
