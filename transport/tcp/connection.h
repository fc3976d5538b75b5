// One data connection, set up the way NCCL's net API sets one up, so that the NCCL_NET plugin and
// the engine's mesh share it: a Listener gives a handle (its address); connect(handle) opens a
// socket and sends a hello that proves, with a MAC under the job's data key, that it belongs to
// the job; Listener::accept hands over only connections whose hello proves it and passes the
// caller's checks — anything else is logged, closed and forgotten.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "common/siphash.h"
#include "transport/tcp/socket.h"
#include "transport/wire.h"

namespace onebit::tcp {

class Listener {
 public:
  explicit Listener(Fd fd) : fd_(std::move(fd)) {}
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
};

// Opens a data connection to `handle` and sends `hello` with its MAC under `key`.
Fd connect(const Address& handle, wire::Hello hello, const SipKey& key, Deadline deadline, const std::string& peer_name);

}  // namespace onebit::tcp
