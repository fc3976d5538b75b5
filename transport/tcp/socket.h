// Blocking-with-deadline socket helpers for set-up (bootstrap, handshakes) and address handling.
// The data path does not use these: it runs non-blocking sockets on the progress thread.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/clock.h"
#include "onebit/onebit_types.h"

namespace onebit::transport::tcp {

using Clock = ::onebit::Clock;
using Deadline = ::onebit::Deadline;

// An owned file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset();
  explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

struct Address {
  sockaddr_storage storage{};
  socklen_t length = 0;

  std::string to_string() const;  // "10.0.0.1:1234" or "[::1]:1234"
  std::uint16_t port() const;
  void set_port(std::uint16_t port);
  // A loopback (127.0.0.0/8, ::1) or unspecified (0.0.0.0, ::) address: one that reaches this
  // host's own loopback whatever host it is dialled from, so names no host to another.
  bool local_only() const;
};

// "Connection refused (errno 111)"; for EMFILE/ENFILE also the descriptors open and the limit.
std::string errno_text(int err);

// "host:port", "[v6]:port". Resolves names. Throws Error(ONEBIT_INVALID_ARGUMENT) naming `what`.
Address parse_host_port(const std::string& text, const char* what);

// Whether interface `name` is selected by `spec`, in NCCL_SOCKET_IFNAME's syntax: comma-separated
// prefixes; "=name,..." for exact names; a leading "^" to exclude instead (exclusion never selects
// a loopback interface, as in NCCL). An empty spec selects every interface but loopback.
bool interface_matches(const std::string& spec, const std::string& name, bool loopback);

// The address of the first interface `ifname` selects (see interface_matches; IPv4 preferred).
// Throws when none matches.
Address interface_address(const std::string& ifname);

// A listening socket bound to `address` (port 0: any). Throws Error(ONEBIT_SYSTEM_ERROR).
Fd listen_on(const Address& address, int backlog);

// Connects, retrying refused connections until the deadline (the other side may not listen yet).
Fd connect_to(const Address& address, Deadline deadline, const std::string& peer_name);
// As connect_to, returning the last errno instead of throwing it (0: `connected` holds the socket),
// for a caller that words the failure itself; connect_failure_code is the code connect_to throws.
int connect_until(const Address& address, Deadline deadline, Fd* connected);
onebit_result_t connect_failure_code(int err);

// Accepts one connection before the deadline; an empty Fd on timeout.
Fd accept_until(int listen_fd, Deadline deadline);

// Full writes and reads on a blocking-mode socket, bounded by the deadline. Throw Error naming
// the peer: ONEBIT_TIMEOUT, or ONEBIT_REMOTE_ERROR when it closes.
void write_all(int fd, const void* data, std::size_t bytes, Deadline deadline, const std::string& peer_name);
void read_all(int fd, void* data, std::size_t bytes, Deadline deadline, const std::string& peer_name);

// This host's address on the route to `peer` (port 0). No packet is sent: connecting a UDP socket
// only asks the kernel for the route. Throws Error(ONEBIT_SYSTEM_ERROR) when there is none.
Address address_toward(const Address& peer);

Address local_address(int fd);
Address peer_address(int fd);

void set_nonblocking(int fd);
// TCP_NODELAY and large buffers, for data sockets.
void tune_data_socket(int fd);

}  // namespace onebit::transport::tcp
