// libFuzzer target: a rank reading the bootstrap root's reply (transport/tcp/bootstrap.cc) from a
// real socket that carries arbitrary bytes: statuses, error texts, address tables, MACs. It may
// refuse (onebit::Error); it must not crash, hang past its deadline, or over-read. The rank side is
// bootstrap_fixture.h's, keyed by a secret or not (data[1] & 1).
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>

#include "common/error.h"
#include "tests/fuzz/bootstrap_fixture.h"

using namespace onebit;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2 || size > 60000) return 0;
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) return 0;
  int buffer = 1 << 20;
  ::setsockopt(fds[0], SOL_SOCKET, SO_SNDBUF, &buffer, sizeof(buffer));
  ::setsockopt(fds[1], SOL_SOCKET, SO_RCVBUF, &buffer, sizeof(buffer));
  const int world = 1 + data[0] % 8;
  static const transport::tcp::Credentials keyed = fuzzing::reply_credentials(true),
                                           open = fuzzing::reply_credentials(false);
  const transport::tcp::Credentials& credentials = data[1] & 1 ? keyed : open;
  [[maybe_unused]] ssize_t written = ::write(fds[0], data + 2, size - 2);
  ::shutdown(fds[0], SHUT_WR);
  try {
    const auto result =
        transport::tcp::read_root_reply(fds[1], world, transport::tcp::Clock::now() + std::chrono::milliseconds(50),
                                        fuzzing::reply_hello(), credentials);
    (void)result;
  } catch (const Error&) {
  }
  ::close(fds[0]);
  ::close(fds[1]);
  return 0;
}
