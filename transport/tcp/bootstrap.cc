#include "transport/tcp/bootstrap.h"

#include <algorithm>
#include <random>
#include <string>

#include "common/error.h"
#include "common/log.h"
#include "transport/wire.h"

namespace onebit::tcp {
namespace {

// A stranger gets this long to say who it is before the root moves on.
constexpr auto kHelloGrace = std::chrono::seconds(5);

void send_error(int fd, onebit_result_t code, const std::string& message, Deadline deadline) {
  wire::BootstrapReplyHead head;
  head.status = static_cast<std::uint16_t>(code);
  const auto bytes = head.encode();
  const std::string text = message.substr(0, 60000);
  std::uint8_t length[2] = {static_cast<std::uint8_t>(text.size() & 0xFF), static_cast<std::uint8_t>(text.size() >> 8)};
  try {
    write_all(fd, bytes.data(), bytes.size(), deadline, "a rank");
    write_all(fd, length, 2, deadline, "a rank");
    write_all(fd, text.data(), text.size(), deadline, "a rank");
  } catch (const Error&) {
    // The rank is gone; it will time out on its own.
  }
}

}  // namespace

void serve_root(Fd listener, int size, int sockets_per_peer, Deadline deadline) {
  struct Arrival {
    Fd fd;
    wire::BootstrapHello hello;
  };
  std::vector<Arrival> arrived(size);
  int count = 0;
  auto fail_all = [&](onebit_result_t code, const std::string& message) {
    ONEBIT_LOG(WARN, "bootstrap root: ", message);
    const Deadline reply_deadline = Clock::now() + std::chrono::seconds(2);
    for (Arrival& a : arrived) {
      if (a.fd) send_error(a.fd.get(), code, message, reply_deadline);
    }
  };

  while (count < size) {
    Fd fd = accept_until(listener.get(), deadline);
    if (!fd) {
      std::string missing;
      for (int r = 0; r < size; ++r) {
        if (!arrived[r].fd) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
      fail_all(ONEBIT_TIMEOUT, "bootstrap timed out: rank(s) " + missing + " of " + std::to_string(size) +
                                   " never reached the root at " + local_address(listener.get()).to_string() +
                                   " (check ONEBIT_ROOT / MASTER_ADDR, the world size, and that they started)");
      return;
    }
    const std::string who = "connection from " + peer_address(fd.get()).to_string();
    wire::BootstrapHello hello;
    try {
      std::uint8_t bytes[wire::BootstrapHello::kSize];
      const Deadline hello_deadline = std::min(deadline, Clock::now() + kHelloGrace);
      read_all(fd.get(), bytes, sizeof(bytes), hello_deadline, who);
      hello = wire::BootstrapHello::decode(bytes, who);
    } catch (const Error& error) {
      ONEBIT_LOG(WARN, "bootstrap root: ignoring a ", who, ": ", error.what());
      continue;
    }
    if (hello.size != static_cast<std::uint32_t>(size)) {
      Arrival odd{std::move(fd), hello};
      const std::string message = "world size mismatch: rank " + std::to_string(hello.rank) + " says " +
                                  std::to_string(hello.size) + " ranks, rank 0 says " + std::to_string(size);
      send_error(odd.fd.get(), ONEBIT_MISMATCH, message, Clock::now() + std::chrono::seconds(2));
      fail_all(ONEBIT_MISMATCH, message);
      return;
    }
    if (hello.rank >= static_cast<std::uint32_t>(size) || arrived[hello.rank].fd) {
      const std::string message = hello.rank >= static_cast<std::uint32_t>(size)
                                      ? "rank " + std::to_string(hello.rank) + " is out of range for " + std::to_string(size) + " ranks"
                                      : "two processes claim rank " + std::to_string(hello.rank) + " (" +
                                            peer_address(arrived[hello.rank].fd.get()).to_string() + " and " +
                                            peer_address(fd.get()).to_string() + ")";
      send_error(fd.get(), ONEBIT_MISMATCH, message, Clock::now() + std::chrono::seconds(2));
      fail_all(ONEBIT_MISMATCH, message);
      return;
    }
    if (hello.sockets_per_peer != static_cast<std::uint32_t>(sockets_per_peer)) {
      const std::string message = "ONEBIT_SOCKETS_PER_PEER differs: rank " + std::to_string(hello.rank) + " uses " +
                                  std::to_string(hello.sockets_per_peer) + ", rank 0 uses " + std::to_string(sockets_per_peer);
      arrived[hello.rank] = Arrival{std::move(fd), hello};
      fail_all(ONEBIT_MISMATCH, message);
      return;
    }
    arrived[hello.rank] = Arrival{std::move(fd), hello};
    ++count;
  }

  std::random_device entropy;
  wire::BootstrapReplyHead head;
  head.job_id = (static_cast<std::uint64_t>(entropy()) << 32) ^ entropy();
  head.size = static_cast<std::uint32_t>(size);
  std::vector<std::uint8_t> reply(wire::BootstrapReplyHead::kSize + size * wire::WireAddress::kSize);
  const auto head_bytes = head.encode();
  std::copy(head_bytes.begin(), head_bytes.end(), reply.begin());
  wire::Writer w(reply.data() + wire::BootstrapReplyHead::kSize);
  for (const Arrival& a : arrived) {
    w.put(a.hello.listener.family).put(a.hello.listener.port).bytes(a.hello.listener.ip.data(), 16);
  }
  for (int r = 0; r < size; ++r) {
    try {
      write_all(arrived[r].fd.get(), reply.data(), reply.size(), deadline, "rank " + std::to_string(r));
    } catch (const Error& error) {
      ONEBIT_LOG(WARN, "bootstrap root: ", error.what());
    }
  }
}

BootstrapResult exchange_with_root(int rank, int size, int sockets_per_peer, const Address& root,
                                   const std::string& ifname, Deadline deadline, Fd* data_listener) {
  Fd fd = connect_to(root, deadline, "the bootstrap root (rank 0)");
  Address local = ifname.empty() ? local_address(fd.get()) : interface_address(ifname);
  local.set_port(0);
  *data_listener = listen_on(local, 1024);
  const Address bound = local_address(data_listener->get());

  wire::BootstrapHello hello;
  hello.rank = static_cast<std::uint32_t>(rank);
  hello.size = static_cast<std::uint32_t>(size);
  hello.sockets_per_peer = static_cast<std::uint32_t>(sockets_per_peer);
  hello.listener = wire::to_wire(bound.storage);
  const auto hello_bytes = hello.encode();
  write_all(fd.get(), hello_bytes.data(), hello_bytes.size(), deadline, "the bootstrap root");

  std::uint8_t head_bytes[wire::BootstrapReplyHead::kSize];
  try {
    read_all(fd.get(), head_bytes, sizeof(head_bytes), deadline, "the bootstrap root");
  } catch (const Error& error) {
    fail(error.code(), "bootstrap: no answer from the root at ", root.to_string(), ": ", error.what());
  }
  const auto head = wire::BootstrapReplyHead::decode(head_bytes, "the bootstrap root");
  if (head.status != ONEBIT_SUCCESS) {
    std::uint8_t length[2];
    read_all(fd.get(), length, 2, deadline, "the bootstrap root");
    std::string text(length[0] | (length[1] << 8), '\0');
    read_all(fd.get(), text.data(), text.size(), deadline, "the bootstrap root");
    fail(static_cast<onebit_result_t>(head.status), "bootstrap failed: ", text);
  }
  ONEBIT_CHECK(head.size == static_cast<std::uint32_t>(size), ONEBIT_MISMATCH, "bootstrap: the root has ",
               head.size, " ranks, this rank was told ", size);
  std::vector<std::uint8_t> table(size * wire::WireAddress::kSize);
  read_all(fd.get(), table.data(), table.size(), deadline, "the bootstrap root");
  BootstrapResult result;
  result.job_id = head.job_id;
  wire::Reader r(table.data());
  for (int i = 0; i < size; ++i) {
    wire::WireAddress a;
    a.family = r.get<std::uint16_t>();
    a.port = r.get<std::uint16_t>();
    r.bytes(a.ip.data(), 16);
    Address address;
    unsigned length = 0;
    wire::from_wire(a, &address.storage, &length);
    address.length = length;
    result.listeners.push_back(address);
  }
  return result;
}

}  // namespace onebit::tcp
