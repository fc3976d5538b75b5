// libFuzzer target: a rank reading the bootstrap root's reply (transport/tcp/bootstrap.cc) from a
// real socket that carries arbitrary bytes: statuses, error texts, address tables, MACs. It may
// refuse (onebit::Error); it must not crash, hang past its deadline, or over-read.
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>

#include "common/error.h"
#include "transport/tcp/bootstrap.h"

using namespace onebit;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2 || size > 60000) return 0;
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) return 0;
  int buffer = 1 << 20;
  ::setsockopt(fds[0], SOL_SOCKET, SO_SNDBUF, &buffer, sizeof(buffer));
  ::setsockopt(fds[1], SOL_SOCKET, SO_RCVBUF, &buffer, sizeof(buffer));
  const int world = 1 + data[0] % 8;
  std::optional<SipKey> auth;
  if (data[1] & 1) auth = SipKey{0x0123456789abcdefull, 0xfedcba9876543210ull};
  [[maybe_unused]] ssize_t written = ::write(fds[0], data + 2, size - 2);
  ::shutdown(fds[0], SHUT_WR);
  try {
    const auto result = tcp::read_root_reply(fds[1], world, tcp::Clock::now() + std::chrono::milliseconds(50), auth);
    (void)result;
  } catch (const Error&) {
  }
  ::close(fds[0]);
  ::close(fds[1]);
  return 0;
}
