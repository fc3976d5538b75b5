// One data connection, set up the way NCCL's net API sets one up: a Listener gives a handle (its
// address); connect(handle) opens a socket and sends a hello that proves, with a MAC under the
// job's data key, that it belongs to the job; Listener::accept hands over only connections whose
// hello proves it and passes the caller's checks — anything else is logged, closed and forgotten.
// Hellos are read concurrently, each within 5 s of its connection (gate.h).
//
// The handshake itself (signed_hello, verify_hello) is shared with the NCCL_NET plugin's
// connections (net_comm.h), which run the same exchange without blocking.
#pragma once

#include <array>
#include <functional>
#include <optional>
#include <string>

#include "common/siphash.h"
#include "transport/tcp/gate.h"
#include "transport/tcp/socket.h"
#include "transport/wire.h"

namespace onebit::transport::tcp {

class Listener {
 public:
  explicit Listener(Fd fd);
  // Listens on `where` (port 0: any free port).
  static Listener listen(const Address& where);

  Address handle() const { return local_address(fd_.get()); }

  struct Accepted {
    Fd fd;
    wire::Hello hello;
  };
  // `check` throws onebit::Error to refuse a hello (wrong job, rank, socket index, ...). Returns
  // nothing when the deadline passes first. `who_accepts` prefixes the log lines ("rank 3").
  std::optional<Accepted> accept(Deadline deadline, const SipKey& key,
                                 const std::function<void(const wire::Hello&, const std::string& who)>& check,
                                 const std::string& who_accepts);

 private:
  Fd fd_;
  Gate gate_;  // connections send their hellos concurrently (gate.h)
};

// The bytes a connecting socket sends: `hello` with its MAC under `key`.
std::array<std::uint8_t, wire::Hello::kSize> signed_hello(wire::Hello hello, const SipKey& key);
// Decodes a received hello and proves it (constant-time MAC comparison) before anything it says
// counts; throws Error(ONEBIT_REMOTE_ERROR) naming `who` otherwise.
wire::Hello verify_hello(const std::uint8_t* bytes, const SipKey& key, const std::string& who);

// Opens a data connection to `handle` and sends `hello` with its MAC under `key`.
Fd connect(const Address& handle, wire::Hello hello, const SipKey& key, Deadline deadline,
           const std::string& peer_name);

}  // namespace onebit::transport::tcp
