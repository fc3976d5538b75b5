#include "transport/tcp/connection.h"

#include "common/error.h"
#include "common/log.h"

namespace onebit::transport::tcp {
namespace {
// A stranger on a listener gets this long to send its hello.
constexpr auto kHelloGrace = std::chrono::seconds(5);
}  // namespace

Listener::Listener(Fd fd) : fd_(std::move(fd)), gate_(fd_.get(), wire::Hello::kSize, kHelloGrace, "data listener") {}

Listener Listener::listen(const Address& where) { return Listener(listen_on(where, 1024)); }

std::optional<Listener::Accepted> Listener::accept(
    Deadline deadline, const SipKey& key, const std::function<void(const wire::Hello&, const std::string& who)>& check,
    const std::string& who_accepts) {
  for (;;) {
    auto arrival = gate_.next(deadline);
    if (!arrival) return std::nullopt;
    try {
      const wire::Hello hello = verify_hello(arrival->record.data(), key, arrival->who);
      check(hello, arrival->who);
      return Accepted{std::move(arrival->fd), hello};
    } catch (const Error& error) {
      // A stranger, a scanner or a stale process: close it and go on; the job is not its business.
      ONEBIT_LOG(WARN, who_accepts, ": rejected a ", error.what());
    }
  }
}

std::array<std::uint8_t, wire::Hello::kSize> signed_hello(wire::Hello hello, const SipKey& key) {
  hello.mac = hello.compute_mac(key);
  return hello.encode();
}

wire::Hello verify_hello(const std::uint8_t* bytes, const SipKey& key, const std::string& who) {
  const wire::Hello hello = wire::Hello::decode(bytes, who);
  // Membership first: nothing a connection says counts before it proves it.
  ONEBIT_CHECK(mac_equal(hello.mac, hello.compute_mac(key)), ONEBIT_REMOTE_ERROR, who,
               " fails the handshake MAC (not of this job or connection, or a different ONEBIT_AUTH_KEY)");
  return hello;
}

Fd connect(const Address& handle, wire::Hello hello, const SipKey& key, Deadline deadline,
           const std::string& peer_name) {
  Fd fd = connect_to(handle, deadline, peer_name);
  const auto bytes = signed_hello(hello, key);
  write_all(fd.get(), bytes.data(), bytes.size(), deadline, peer_name);
  return fd;
}

}  // namespace onebit::transport::tcp
