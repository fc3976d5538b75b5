#include "transport/tcp/bootstrap.h"

#include <algorithm>
#include <random>
#include <string>

#include "common/error.h"
#include "common/log.h"
#include "transport/wire.h"

namespace onebit::tcp {
namespace {

// How much longer than the root a rank waits for the root's answer.
constexpr auto kReplyGrace = std::chrono::seconds(2);
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

SipKey data_key_of(std::uint64_t job_id, const std::uint64_t secret[2], const std::optional<SipKey>& auth) {
  if (!auth) return {secret[0], secret[1]};
  std::uint8_t material[25];
  wire::Writer(material).put(secret[0]).put(secret[1]).put(job_id).put(std::uint8_t{0});
  const std::uint64_t k0 = siphash24(*auth, material, sizeof(material));
  material[24] = 1;
  return {k0, siphash24(*auth, material, sizeof(material))};
}

void serve_root(Fd listener, int size, int sockets_per_peer, Deadline deadline, const std::optional<SipKey>& auth) {
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
    if (auth && !mac_equal(hello.mac, hello.compute_mac(*auth))) {
      // A stranger, or a rank with another ONEBIT_AUTH_KEY: it proves nothing, so it decides nothing.
      ONEBIT_LOG(WARN, "bootstrap root: ignoring a ", who, " that claims rank ", hello.rank,
                 " but fails the ONEBIT_AUTH_KEY check (a stranger, or a rank with a different key)");
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
  auto random64 = [&] { return (static_cast<std::uint64_t>(entropy()) << 32) ^ entropy(); };
  wire::BootstrapReplyHead head;
  head.job_id = random64();
  head.size = static_cast<std::uint32_t>(size);
  head.secret[0] = random64();
  head.secret[1] = random64();
  const std::size_t table_end = wire::BootstrapReplyHead::kSize + size * wire::WireAddress::kSize;
  std::vector<std::uint8_t> reply(table_end + 8);
  const auto head_bytes = head.encode();
  std::copy(head_bytes.begin(), head_bytes.end(), reply.begin());
  wire::Writer w(reply.data() + wire::BootstrapReplyHead::kSize);
  for (const Arrival& a : arrived) {
    w.put(a.hello.listener.family).put(a.hello.listener.port).bytes(a.hello.listener.ip.data(), 16);
  }
  w.put(auth ? siphash24(*auth, reply.data(), table_end) : std::uint64_t{0});
  for (int r = 0; r < size; ++r) {
    try {
      write_all(arrived[r].fd.get(), reply.data(), reply.size(), deadline, "rank " + std::to_string(r));
    } catch (const Error& error) {
      ONEBIT_LOG(WARN, "bootstrap root: ", error.what());
    }
  }
}

BootstrapResult exchange_with_root(int rank, int size, int sockets_per_peer, const Address& root,
                                   const std::string& ifname, Deadline deadline, const std::optional<SipKey>& auth,
                                   Fd* data_listener) {
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
  if (auth) hello.mac = hello.compute_mac(*auth);
  const auto hello_bytes = hello.encode();
  write_all(fd.get(), hello_bytes.data(), hello_bytes.size(), deadline, "the bootstrap root");
  try {
    // The root answers at its own deadline at the latest (with the error naming the missing
    // ranks); a little grace lets that answer arrive rather than this rank's own timeout.
    return read_root_reply(fd.get(), size, deadline + kReplyGrace, auth);
  } catch (const Error& error) {
    if (error.code() != ONEBIT_TIMEOUT && error.code() != ONEBIT_REMOTE_ERROR) throw;
    fail(error.code(), "bootstrap: no answer from the root at ", root.to_string(), ": ", error.what(),
         auth ? " (ONEBIT_AUTH_KEY is set: the root ignores ranks whose key differs from its own)" : "");
  }
}

BootstrapResult read_root_reply(int fd, int size, Deadline deadline, const std::optional<SipKey>& auth) {
  const std::string root = "the bootstrap root";
  std::vector<std::uint8_t> reply(wire::BootstrapReplyHead::kSize);
  read_all(fd, reply.data(), reply.size(), deadline, root);
  const auto head = wire::BootstrapReplyHead::decode(reply.data(), root);
  if (head.status != ONEBIT_SUCCESS) {
    std::uint8_t length[2];
    read_all(fd, length, 2, deadline, root);
    std::string text(length[0] | (length[1] << 8), '\0');
    read_all(fd, text.data(), text.size(), deadline, root);
    const bool known = head.status >= ONEBIT_INVALID_ARGUMENT && head.status <= ONEBIT_INTERNAL_ERROR;
    fail(known ? static_cast<onebit_result_t>(head.status) : ONEBIT_REMOTE_ERROR, "bootstrap failed: ", text);
  }
  ONEBIT_CHECK(head.size == static_cast<std::uint32_t>(size), ONEBIT_MISMATCH, "bootstrap: the root has ",
               head.size, " ranks, this rank was told ", size);
  const std::size_t table_end = reply.size() + size * wire::WireAddress::kSize;
  reply.resize(table_end + 8);
  read_all(fd, reply.data() + wire::BootstrapReplyHead::kSize, reply.size() - wire::BootstrapReplyHead::kSize, deadline,
           root);
  wire::Reader r(reply.data() + wire::BootstrapReplyHead::kSize);
  BootstrapResult result;
  result.job_id = head.job_id;
  for (int i = 0; i < size; ++i) {
    wire::WireAddress a;
    a.family = r.get<std::uint16_t>();
    a.port = r.get<std::uint16_t>();
    r.bytes(a.ip.data(), 16);
    ONEBIT_CHECK(a.family == 4 || a.family == 6, ONEBIT_REMOTE_ERROR, "bootstrap: the root sent rank ", i,
                 "'s address with family ", a.family);
    Address address;
    unsigned length = 0;
    wire::from_wire(a, &address.storage, &length);
    address.length = length;
    result.listeners.push_back(address);
  }
  const std::uint64_t mac = r.get<std::uint64_t>();
  if (auth) {
    ONEBIT_CHECK(mac_equal(mac, siphash24(*auth, reply.data(), table_end)), ONEBIT_REMOTE_ERROR,
                 "bootstrap: the root's reply fails the ONEBIT_AUTH_KEY check (rank 0 has a different key, or none)");
  }
  result.data_key = data_key_of(head.job_id, head.secret, auth);
  return result;
}

}  // namespace onebit::tcp
