// Bootstrap: every rank tells the root (a listener that rank 0 serves at ONEBIT_ROOT) where its data
// listener is; the root answers each rank, once all have arrived, with a fresh job id and every
// rank's listener.
//
// Who gets in (docs/reliability.md, "Who is in a communicator"). Every communicator has an
// identity — text its ranks share and no other communicator has: a random id broadcast over the
// group's gloo half (torch backend) or gloo context (Gloo door), or the launcher's job identity
// (C API; common/launcher.h) — and a bootstrap key derived from the identity and whatever secrets
// the ranks hold (ONEBIT_AUTH_KEY; a random secret sent with the identity). The exchange:
//
//   root -> rank  challenge: a fresh nonce, the root's identity and key flags
//   rank -> root  hello: rank, size, listener, a nonce, its identity, HMAC(key, challenge + hello)
//   root -> rank  reply (once all arrived): job id, job secret, listeners, HMAC(key, hello + reply)
//
// A hello of another identity, another key or a stale challenge is refused — that connection is
// answered with an error naming both identities, logged and closed — and the bootstrap goes on;
// a rank never takes as its root one whose reply fails its check. Ranks that prove they belong but
// disagree (world size, duplicate rank, sockets per peer) fail the whole bootstrap with an error
// naming them, sent to every rank that arrived. The root reads hellos concurrently (gate.h).
//
// Without a secret the key follows from the identity alone: that keeps out other jobs, groups and
// attempts and anything that does not speak the protocol, not someone who knows the identity.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common/crypto.h"
#include "common/siphash.h"
#include "onebit/onebit_types.h"
#include "transport/tcp/root_listener.h"
#include "transport/tcp/socket.h"
#include "transport/wire.h"

namespace onebit::transport::tcp {

// What a rank knows about the communicator it joins.
struct Membership {
  std::string identity;  // shared by its ranks only; may be empty (then only the world size tells jobs apart)
  std::string auth_key;  // ONEBIT_AUTH_KEY, or empty; never logged
  std::string secret;    // from the job's rendezvous, or empty; never logged
};

// "'label' (digest 0a1b…)", as messages name a communicator.
std::string describe(const wire::WireIdentity& identity);
// Whether two identities are one (their digests, compared in constant time).
bool same_identity(const wire::WireIdentity& a, const wire::WireIdentity& b);

// A membership made ready for the wire: the identity's digest and label, the key flags, the key.
struct Credentials {
  wire::WireIdentity identity;
  std::uint16_t flags = 0;  // wire::kKeyedBy*
  crypto::Digest key{};     // the bootstrap key
  explicit Credentials(const Membership& membership);
  std::string describe() const { return tcp::describe(identity); }
};

struct BootstrapResult {
  std::uint64_t job_id = 0;
  std::vector<Address> listeners;  // by rank
  SipKey data_key{};               // keys the data connections' hellos (connection.h)
};

// Rank 0's root service. Runs until every rank has its answer, or the deadline passes; errors go to
// the ranks (and reach rank 0's own caller through the reply rank 0 itself receives, as every rank's do).
// `transport` (wire::kTransport*) and `sockets_per_peer` must be every rank's.
void serve_root(HeldRoot listener, int size, int sockets_per_peer, std::uint16_t transport, Deadline deadline,
                const Credentials& credentials);

// Rank 0's root service when rank 0 itself cannot join (`why`: too few file descriptors): every
// rank that proves it belongs is answered with `code` and `why` at once, instead of waiting for a
// root that never answers, until all W-1 have been told or the deadline passes.
void refuse_at_root(HeldRoot listener, int size, Deadline deadline, const Credentials& credentials,
                    onebit_result_t code, const std::string& why);

// Every rank's side. `data_listener` is bound here: to ifname's address, or to the local address of
// the connection that reaches the root. A root of another identity (another job holding the
// address, or a stale one) is left and tried again until the deadline, then named in the error.
// `cannot_join` (wire::kShortOfDescriptors) tells the root that this rank cannot join: the root
// fails the bootstrap for every rank, naming it, and this call throws the root's error.
// `root_served_at_once`: rank 0 serves the root as soon as it listens (TransportOptions), so a
// listener silent for 5 s is another program, left and named as another root is; otherwise it may
// be rank 0 listening ahead and not serving yet, and is waited for.
BootstrapResult exchange_with_root(int rank, int size, int sockets_per_peer, std::uint16_t transport,
                                   const Address& root, const std::string& ifname, Deadline deadline,
                                   const Credentials& credentials, Fd* data_listener, std::uint16_t cannot_join = 0,
                                   bool root_served_at_once = false);

// For a root published by rank 0 once it listens (root_listener.h), before the bootstrap: whether
// this rank reaches it — a connection within `window`, closed at once (the held listener's answerer
// closes it in turn; every rank may check, however many). Throws Error naming `rank`, the address and the reason, with
// a hint for a loopback address (another host's rank dials its own) and for silence (a firewall). A framework asks this
// on every rank and agrees on the answers over its own channel, so that every rank fails at once,
// not the unreachable ones at the timeout and rank 0 waiting for them.
void check_root_reachable(int rank, const Address& root, std::chrono::milliseconds window);
// The window a framework gives it: a root that listens already answers in milliseconds; the rest
// is margin for a loaded host.
constexpr std::chrono::milliseconds kRootCheckWindow{5000};

// The hello a rank sends in answer to `challenge` (split out so tests can replay one).
wire::BootstrapHello signed_bootstrap_hello(wire::BootstrapHello hello, const wire::BootstrapChallenge& challenge,
                                            const Credentials& credentials);

// Reads the root's reply to `hello` from `fd`: the table, or the root's error (thrown with its
// code); checks the reply's MAC. Split out for the fuzzer.
BootstrapResult read_root_reply(int fd, int size, Deadline deadline, const wire::BootstrapHello& hello,
                                const Credentials& credentials);

}  // namespace onebit::transport::tcp
