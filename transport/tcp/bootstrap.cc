#include "transport/tcp/bootstrap.h"

#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <optional>
#include <set>
#include <string>

#include "common/error.h"
#include "common/log.h"
#include "transport/tcp/gate.h"

namespace onebit::transport::tcp {
namespace {

// How much longer than the root a rank waits for the root's answer.
constexpr auto kReplyGrace = std::chrono::seconds(2);
// A connection gets this long to send its hello; the root serves others meanwhile (gate.h).
constexpr auto kHelloGrace = std::chrono::milliseconds(5000);
// How often a rank that found another communicator's root at its address tries again, and for how
// long: its own rank 0 cannot bind an address another root holds, so the wait only helps when that
// root is about to finish — beyond a few tries it is a configuration error, said as one.
constexpr auto kOtherRootRetry = std::chrono::milliseconds(1000);
constexpr auto kOtherRootPatience = std::chrono::seconds(10);
// A root greets each connection at once (gate.h): where rank 0 serves the root as soon as it binds
// it, a listener silent this long after accepting is not a onebit root — another program holds the
// address — and is treated as another root is.
constexpr auto kChallengeWindow = std::chrono::seconds(5);
// A rank that finds nothing answering at its root says so at WARN after this long, or a quarter of
// its timeout if that is shorter, and goes on trying: rank 0 may not have started yet, and nothing
// here can tell that from a rank 0 that failed (only a channel beside the root can: root_check).
constexpr auto kSilentRootWarning = std::chrono::seconds(10);

// What it may mean that `root` does not answer a rank on another host: its loopback is its own.
std::string loopback_hint(const Address& root) {
  if (!root.local_only()) return "";
  return "; " + root.to_string() +
         " is each host's own loopback, so only ranks on rank 0's host find the root there: give rank 0 an "
         "address every host reaches (MASTER_ADDR, or ONEBIT_ROOT=host:port; on Debian a host name may resolve to "
         "127.0.1.1 through /etc/hosts)";
}

std::uint64_t little_endian64(const std::uint8_t* p) {
  std::uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = value << 8 | p[i];
  return value;
}

std::string flags_text(std::uint16_t flags) {
  if (flags == 0) return "no key";
  std::string text;
  if (flags & wire::kKeyedByAuthKey) text = "ONEBIT_AUTH_KEY";
  if (flags & wire::kKeyedBySecret) text += std::string(text.empty() ? "" : " and ") + "the rendezvous's secret";
  return text;
}

// What to check when two sides' key flags differ in `differing`.
std::string flags_hint(std::uint16_t differing) {
  std::string hint;
  if (differing & wire::kKeyedByAuthKey) hint = "every rank must be given the same ONEBIT_AUTH_KEY, or none";
  if (differing & wire::kKeyedBySecret) {
    hint += std::string(hint.empty() ? "" : "; ") +
            "every rank must join through the same rendezvous (store or gloo "
            "context) — or through none";
  }
  return " (" + hint + ")";
}

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

std::vector<std::uint8_t> fresh_challenge(const Credentials& credentials) {
  wire::BootstrapChallenge challenge;
  challenge.flags = credentials.flags;
  challenge.identity = credentials.identity;
  crypto::random_bytes(challenge.nonce.data(), challenge.nonce.size());
  const auto bytes = challenge.encode();
  return {bytes.begin(), bytes.end()};
}

// Why `hello`, answering `challenge`, is not of this communicator; empty when it proves it is.
// The code goes with the reason: another identity or key setting is a mismatch, a bad MAC a refusal.
std::string refusal(const wire::BootstrapHello& hello, const wire::BootstrapChallenge& challenge,
                    const Credentials& credentials, onebit_result_t* code) {
  *code = ONEBIT_MISMATCH;
  if (!same_identity(hello.identity, credentials.identity)) {
    return "it is of communicator " + describe(hello.identity) + ", this root serves " + credentials.describe() +
           " (another job, process group or attempt on the same address)";
  }
  if (hello.flags != credentials.flags) {
    return "it holds " + flags_text(hello.flags) + ", this root holds " + flags_text(credentials.flags) +
           flags_hint(hello.flags ^ credentials.flags);
  }
  *code = ONEBIT_REMOTE_ERROR;
  const auto expected = signed_bootstrap_hello(hello, challenge, credentials).mac;
  if (!crypto::equal(expected.data(), hello.mac.data(), expected.size())) {
    return "its hello fails the bootstrap MAC (it answers another challenge — a replayed hello — or holds a "
           "different key)";
  }
  return "";
}

}  // namespace

Credentials::Credentials(const Membership& membership) {
  const auto digest =
      crypto::hmac_sha256(std::string_view("onebit communicator identity"), {std::string_view(membership.identity)});
  std::copy_n(digest.begin(), identity.digest.size(), identity.digest.begin());
  std::string label = membership.identity;
  if (label.size() >= identity.label.size()) label = label.substr(0, identity.label.size() - 4) + "...";
  std::copy(label.begin(), label.end(), identity.label.begin());
  if (!membership.auth_key.empty()) flags |= wire::kKeyedByAuthKey;
  if (!membership.secret.empty()) flags |= wire::kKeyedBySecret;
  // The key material: each secret with its length, so that no two settings run together.
  std::string material;
  for (const std::string* part : {&membership.auth_key, &membership.secret}) {
    const auto length = static_cast<std::uint32_t>(part->size());
    material.append(reinterpret_cast<const char*>(&length), sizeof(length)).append(*part);
  }
  key = crypto::hmac_sha256(std::string_view(material), {std::string_view("onebit bootstrap key v2"), identity.digest});
}

std::string describe(const wire::WireIdentity& identity) {
  const std::string label = identity.label_text();
  return (label.empty() ? std::string("with no identity") : "'" + label + "'") + " (" +
         crypto::hex(identity.digest.data(), 4) + ")";
}

bool same_identity(const wire::WireIdentity& a, const wire::WireIdentity& b) {
  return crypto::equal(a.digest.data(), b.digest.data(), a.digest.size());
}

wire::BootstrapHello signed_bootstrap_hello(wire::BootstrapHello hello, const wire::BootstrapChallenge& challenge,
                                            const Credentials& credentials) {
  hello.mac = {};
  const auto bytes = hello.encode();
  hello.mac = crypto::hmac_sha256(credentials.key, {std::string_view("hello"), challenge.encode(),
                                                    crypto::Bytes(bytes.data(), bytes.size() - hello.mac.size())});
  return hello;
}

namespace {

// The hello of a connection the gate handed over, if it proves it belongs to this communicator;
// otherwise it is answered with the reason, logged, and nothing (it decides nothing).
// `refused` remembers what was logged at WARN: a rank of another job retries every second until
// its timeout, and says the same each time (later ones go to INFO).
std::optional<wire::BootstrapHello> proven_hello(const Gate::Arrival& arrival, const Credentials& credentials,
                                                 const std::string& root_name, std::set<std::string>* refused) {
  wire::BootstrapHello hello;
  try {
    hello = wire::BootstrapHello::decode(arrival.record.data(), arrival.who);
  } catch (const Error& error) {
    ONEBIT_LOG(WARN, "bootstrap root: ignoring a ", arrival.who, ": ", error.what());
    return std::nullopt;
  }
  const auto challenge = wire::BootstrapChallenge::decode(arrival.greeting.data(), "the root itself");
  onebit_result_t code = ONEBIT_SUCCESS;
  const std::string why = refusal(hello, challenge, credentials, &code);
  if (why.empty()) return hello;
  if (refused->insert(std::to_string(hello.rank) + ": " + why).second) {
    ONEBIT_LOG(WARN, "bootstrap root: refused a ", arrival.who, " that claims rank ", hello.rank, ": ", why);
  } else {
    ONEBIT_LOG(INFO, "bootstrap root: refused a ", arrival.who, " that claims rank ", hello.rank, " again: ", why);
  }
  send_error(arrival.fd.get(), code, "the root at " + root_name + " refused this rank: " + why,
             Clock::now() + std::chrono::seconds(2));
  return std::nullopt;
}

// Why a proven hello cannot join these ranks (world size, rank, sockets per peer, transport), or "".
std::string disagreement(const wire::BootstrapHello& hello, const std::string& who, int size, int sockets_per_peer,
                         std::uint16_t transport, const std::vector<Fd>& taken) {
  const std::string rank = "rank " + std::to_string(hello.rank);
  if (hello.size != static_cast<std::uint32_t>(size)) {
    return "world size mismatch: " + rank + " says " + std::to_string(hello.size) + " ranks, rank 0 says " +
           std::to_string(size);
  }
  if (hello.rank >= static_cast<std::uint32_t>(size))
    return rank + " is out of range for " + std::to_string(size) + " ranks";
  if (taken[hello.rank]) {
    return "two processes claim " + rank + " (" + peer_address(taken[hello.rank].get()).to_string() + " and the " +
           who + ")";
  }
  if (hello.sockets_per_peer != static_cast<std::uint32_t>(sockets_per_peer)) {
    return "ONEBIT_SOCKETS_PER_PEER differs: " + rank + " uses " + std::to_string(hello.sockets_per_peer) +
           ", rank 0 uses " + std::to_string(sockets_per_peer);
  }
  if (hello.transport != transport) {
    return std::string("ONEBIT_TRANSPORT differs: ") + rank + " uses " + wire::transport_name(hello.transport) +
           ", rank 0 uses " + wire::transport_name(transport);
  }
  return "";
}

// Answers each rank that proves it belongs with `code` and `message` as it arrives, until every rank
// of `heard` (`told` of them so far) has been answered or `until` passes (the rest time out, as for
// a root that never came). Strangers get their own refusal and count for nothing.
void tell_arrivals(Gate& gate, const Credentials& credentials, const std::string& root_name,
                   std::set<std::string>* refused, onebit_result_t code, const std::string& message, Deadline until,
                   std::vector<bool>& heard, int told) {
  while (told < static_cast<int>(heard.size())) {
    auto arrival = gate.next(until);
    if (!arrival) return;
    const auto hello = proven_hello(*arrival, credentials, root_name, refused);
    if (!hello) continue;
    send_error(arrival->fd.get(), code, message, Clock::now() + kReplyGrace);
    if (hello->rank < heard.size() && !heard[hello->rank]) {
      heard[hello->rank] = true;
      ++told;
    }
  }
}

}  // namespace

namespace {

// Rank 0's side of one bootstrap (serve_root): every rank's proven hello gathered, then each rank
// answered with the table — or every rank within reach told why the bootstrap failed.
class RootService {
 public:
  RootService(HeldRoot held, int size, int sockets_per_peer, std::uint16_t transport, Deadline deadline,
              const Credentials& credentials)
      : listener_(std::move(held.listener)),
        root_name_(local_address(listener_.get()).to_string()),
        size_(size),
        sockets_per_peer_(sockets_per_peer),
        transport_(transport),
        deadline_(deadline),
        credentials_(credentials),
        rank_fds_(size),
        hellos_(size),
        gate_(listener_.get(), wire::BootstrapHello::kSize, kHelloGrace, "bootstrap root") {
    gate_.greet_with([this] { return fresh_challenge(credentials_); });
    gate_.adopt(std::move(held.early));
  }

  void run() {
    try {
      if (!gather()) return;
    } catch (const Error& error) {  // the listener itself failed (accept, poll): nothing may escape this thread
      fail_everyone(error.code(), "bootstrap root at " + root_name_ + " failed: " + error.what(), Clock::now(), -1);
      return;
    }
    send_table();
  }

 private:
  // Every rank's proven hello, into rank_fds_ and hellos_; false when the bootstrap failed (and
  // everyone within reach was told).
  bool gather() {
    for (int count = 0; count < size_;) {
      auto arrival = gate_.next(deadline_);
      if (!arrival) {
        fail_everyone(ONEBIT_TIMEOUT,
                      "bootstrap timed out: rank(s) " + missing_ranks() + " of " + std::to_string(size_) +
                          " never reached the root at " + root_name_ +
                          " (check ONEBIT_ROOT / MASTER_ADDR, the world size, and that they started)",
                      Clock::now(), -1);
        return false;
      }
      const auto hello = proven_hello(*arrival, credentials_, root_name_, &refused_);
      if (!hello) continue;
      if (refuse_if_it_cannot_join(*hello, *arrival)) return false;
      rank_fds_[hello->rank] = std::move(arrival->fd);
      hellos_[hello->rank] = *hello;
      ++count;
    }
    return true;
  }

  // A disagreement fails the job for those within reach; a rank that cannot join (too few
  // descriptors) is waited for by every other, so all are told, until the deadline. True when the
  // hello failed the bootstrap so.
  bool refuse_if_it_cannot_join(const wire::BootstrapHello& hello, Gate::Arrival& arrival) {
    std::string why = disagreement(hello, arrival.who, size_, sockets_per_peer_, transport_, rank_fds_);
    onebit_result_t code = ONEBIT_MISMATCH;
    Deadline linger_until = Clock::now() + kReplyGrace;
    if (why.empty() && hello.cannot_join == wire::kShortOfDescriptors) {
      why = "rank " + std::to_string(hello.rank) +
            " cannot join: its open-files limit leaves too few descriptors for this communicator's sockets "
            "(its own error names the numbers)";
      code = ONEBIT_SYSTEM_ERROR;
      linger_until = deadline_;
    }
    if (why.empty()) return false;
    send_error(arrival.fd.get(), code, why, Clock::now() + std::chrono::seconds(2));
    fail_everyone(code, why, linger_until, code == ONEBIT_SYSTEM_ERROR ? static_cast<int>(hello.rank) : -1);
    return true;
  }

  std::string missing_ranks() const {
    std::string missing;
    for (int r = 0; r < size_; ++r) {
      if (!rank_fds_[r]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    return missing;
  }

  // A failure every rank must hear: those that arrived (and `told_rank`, answered already), and —
  // served until `linger_until` — those still on their way, whose hellos would otherwise meet a
  // closed connection.
  void fail_everyone(onebit_result_t code, const std::string& message, Deadline linger_until, int told_rank) {
    ONEBIT_LOG(WARN, "bootstrap root: ", message);
    const Deadline reply_deadline = Clock::now() + std::chrono::seconds(2);
    std::vector<bool> heard(size_);
    int told = 0;
    for (int r = 0; r < size_; ++r) {
      if (rank_fds_[r]) send_error(rank_fds_[r].get(), code, message, reply_deadline);
      heard[r] = rank_fds_[r] || r == told_rank;
      told += heard[r];
    }
    tell_arrivals(gate_, credentials_, root_name_, &refused_, code, message, std::min(deadline_, linger_until), heard,
                  told);
  }

  // The table of every rank's listener, with a fresh job id and secret, to each rank — each copy
  // bound to its own hello (its nonce), so that it cannot be replayed to another.
  void send_table() {
    wire::BootstrapReplyHead head;
    crypto::random_bytes(&head.job_id, sizeof(head.job_id));
    crypto::random_bytes(head.secret, sizeof(head.secret));
    head.size = static_cast<std::uint32_t>(size_);
    const std::size_t table_end = wire::BootstrapReplyHead::kSize + size_ * wire::WireAddress::kSize;
    std::vector<std::uint8_t> reply(table_end + 32);
    const auto head_bytes = head.encode();
    std::copy(head_bytes.begin(), head_bytes.end(), reply.begin());
    wire::Writer w(reply.data() + wire::BootstrapReplyHead::kSize);
    for (const wire::BootstrapHello& hello : hellos_) {
      w.put(hello.listener.family).put(hello.listener.port).bytes(hello.listener.ip.data(), 16);
    }
    for (int r = 0; r < size_; ++r) {
      const auto mac = crypto::hmac_sha256(
          credentials_.key, {std::string_view("reply"), hellos_[r].encode(), crypto::Bytes(reply.data(), table_end)});
      std::copy(mac.begin(), mac.end(), reply.begin() + static_cast<std::ptrdiff_t>(table_end));
      try {
        write_all(rank_fds_[r].get(), reply.data(), reply.size(), deadline_, "rank " + std::to_string(r));
      } catch (const Error& error) {
        ONEBIT_LOG(WARN, "bootstrap root: ", error.what());
      }
    }
  }

  Fd listener_;
  std::string root_name_;
  int size_;
  int sockets_per_peer_;
  std::uint16_t transport_;
  Deadline deadline_;
  const Credentials& credentials_;
  std::vector<Fd> rank_fds_;
  std::vector<wire::BootstrapHello> hellos_;
  std::set<std::string> refused_;  // refusals logged at WARN once
  Gate gate_;
};

}  // namespace

void serve_root(HeldRoot listener, int size, int sockets_per_peer, std::uint16_t transport, Deadline deadline,
                const Credentials& credentials) {
  RootService(std::move(listener), size, sockets_per_peer, transport, deadline, credentials).run();
}

void refuse_at_root(HeldRoot listener, int size, Deadline deadline, const Credentials& credentials,
                    onebit_result_t code, const std::string& why) {
  const std::string root_name = local_address(listener.listener.get()).to_string();
  Gate gate(listener.listener.get(), wire::BootstrapHello::kSize, kHelloGrace, "bootstrap root");
  gate.greet_with([&] { return fresh_challenge(credentials); });
  gate.adopt(std::move(listener.early));
  std::set<std::string> refused;
  std::vector<bool> heard(size);
  heard[0] = true;  // rank 0 is this one: it does not call
  tell_arrivals(gate, credentials, root_name, &refused, code,
                "rank 0 (the bootstrap root at " + root_name + ") cannot join: " + why, deadline, heard, 1);
}

namespace {

// A rank's way to its root (exchange_with_root). What it finds at the address may be another
// communicator's root, or a program that accepts and stays silent: it is left and tried again for
// kOtherRootPatience from the first sighting (its own rank 0 cannot bind an address another holds,
// so waiting only helps when that one is about to finish), then named as a configuration error.
class RootApproach {
 public:
  RootApproach(int rank, int size, const Address& root, Deadline deadline, bool root_served_at_once)
      : rank_(rank),
        size_(size),
        root_(root),
        root_name_("the bootstrap root at " + root.to_string()),
        deadline_(deadline),
        root_served_at_once_(root_served_at_once) {}

  const std::string& root_name() const { return root_name_; }

  // A connection to the root with the challenge it sent; nothing when the listener accepted and
  // stayed silent (try again). Throws when the root cannot be reached, or once patience ran out.
  std::optional<std::pair<Fd, wire::BootstrapChallenge>> reach() {
    if (!other_root_.empty() && Clock::now() >= other_root_until_) fail_other_root();
    Fd fd;
    bool window_passed = false;  // accepted, then silent for a whole kChallengeWindow before the deadline
    const Deadline attempt_start = Clock::now();
    try {
      fd = connect_to_root();
      std::uint8_t bytes[wire::BootstrapChallenge::kSize];
      const Deadline window_end = Clock::now() + kChallengeWindow;
      window_passed = root_served_at_once_ && window_end < deadline_;
      read_all(fd.get(), bytes, sizeof(bytes), window_passed ? window_end : deadline_, root_name_);
      return std::make_pair(std::move(fd), wire::BootstrapChallenge::decode(bytes, root_name_));
    } catch (const Error& error) {
      if (error.code() != ONEBIT_TIMEOUT) throw;
      if (window_passed) {  // not a onebit root (yet?)
        seen_other_root(attempt_start, "accepted the connection and sent no bootstrap challenge for " +
                                           std::to_string(kChallengeWindow.count()) + " s: it is not a onebit root");
        return std::nullopt;
      }
      if (other_root_.empty()) throw;
      fail_other_root();
    }
  }

  // Leaves the root of another communicator (it has been told who this rank is, and logs it), and
  // pauses before the next try.
  void leave(const wire::BootstrapChallenge& challenge, const Credentials& credentials) {
    seen_other_root(Clock::now(), "serves communicator " + describe(challenge.identity) + ", not this rank's " +
                                      credentials.describe());
    // Rounded up, so that a pause ending at other_root_until_ wakes after it, not a millisecond short.
    const auto pause = std::chrono::ceil<std::chrono::milliseconds>(
        std::min<Deadline>(other_root_until_, Clock::now() + kOtherRootRetry) - Clock::now());
    if (pause.count() > 0) ::poll(nullptr, 0, static_cast<int>(pause.count()));
  }

 private:
  // A connection to the root by the deadline. Nothing answering for kSilentRootWarning (or a
  // quarter of what is left) is said once at WARN, with the address, the OS's reason and what it
  // may mean, while the rank goes on trying; at the deadline the error says the same.
  Fd connect_to_root() {
    Fd fd;
    const auto left = std::max<Clock::duration>(Clock::duration::zero(), deadline_ - Clock::now());
    const Deadline warn_at = Clock::now() + std::min<Clock::duration>(kSilentRootWarning, left / 4);
    int err = connect_until(root_, warned_silent_ ? deadline_ : warn_at, &fd);
    // Tried the while (not an error at once), with time left to go on trying.
    if (err != 0 && !warned_silent_ && Clock::now() >= warn_at && Clock::now() < deadline_) {
      warned_silent_ = true;
      char seconds[32];
      std::snprintf(seconds, sizeof(seconds), "%.1f", std::chrono::duration<double>(deadline_ - Clock::now()).count());
      ONEBIT_LOG(WARN, "rank ", rank_, "/", size_, ": nothing answers at ", root_name_, ": ", errno_text(err),
                 ". Rank 0 has not started yet, has failed, or listens elsewhere", loopback_hint(root_),
                 "; trying until the timeout, ", seconds, " s more");
      err = connect_until(root_, deadline_, &fd);
    }
    if (err != 0) {
      fail(connect_failure_code(err), "cannot connect to the bootstrap root (rank 0) at ", root_.to_string(), ": ",
           errno_text(err), loopback_hint(root_));
    }
    return fd;
  }

  void seen_other_root(Deadline first_seen, std::string what) {
    if (other_root_.empty()) {
      other_root_until_ = std::min<Deadline>(deadline_, first_seen + kOtherRootPatience);
      ONEBIT_LOG(WARN, "rank ", rank_, "/", size_, ": ", root_name_, " ", what, "; trying again for ",
                 std::chrono::duration_cast<std::chrono::seconds>(other_root_until_ - Clock::now()).count(), " s");
    }
    other_root_ = std::move(what);
  }

  [[noreturn]] void fail_other_root() const {
    fail(ONEBIT_MISMATCH, "bootstrap: ", root_name_, " ", other_root_,
         ": another job, process group, attempt or program holds the address (give each job its "
         "own ONEBIT_ROOT or ONEBIT_ROOT_PORT, or an ONEBIT_JOB_ID)");
  }

  int rank_;
  int size_;
  Address root_;
  std::string root_name_;
  Deadline deadline_;
  bool root_served_at_once_;
  std::string other_root_;  // the last root of another communicator found at this address
  Deadline other_root_until_{};
  bool warned_silent_ = false;  // nothing answering was said at WARN
};

}  // namespace

BootstrapResult exchange_with_root(int rank, int size, int sockets_per_peer, std::uint16_t transport,
                                   const Address& root, const std::string& ifname, Deadline deadline,
                                   const Credentials& credentials, Fd* data_listener, std::uint16_t cannot_join,
                                   bool root_served_at_once) {
  RootApproach approach(rank, size, root, deadline, root_served_at_once);
  const std::string& root_name = approach.root_name();
  for (;;) {
    auto reached = approach.reach();
    if (!reached) continue;
    auto& [fd, challenge] = *reached;
    if (!*data_listener) {
      Address local = ifname.empty() ? local_address(fd.get()) : interface_address(ifname);
      local.set_port(0);
      *data_listener = listen_on(local, 1024);
    }
    wire::BootstrapHello hello;
    hello.flags = credentials.flags;
    hello.rank = static_cast<std::uint32_t>(rank);
    hello.size = static_cast<std::uint32_t>(size);
    hello.sockets_per_peer = static_cast<std::uint32_t>(sockets_per_peer);
    hello.transport = transport;
    hello.cannot_join = cannot_join;
    hello.listener = wire::to_wire(local_address(data_listener->get()).storage);
    hello.identity = credentials.identity;
    crypto::random_bytes(hello.nonce.data(), hello.nonce.size());
    hello = signed_bootstrap_hello(hello, challenge, credentials);
    const auto hello_bytes = hello.encode();
    write_all(fd.get(), hello_bytes.data(), hello_bytes.size(), deadline, root_name);
    if (!same_identity(challenge.identity, credentials.identity)) {
      fd.reset();
      approach.leave(challenge, credentials);
      continue;
    }
    ONEBIT_CHECK(challenge.flags == credentials.flags, ONEBIT_MISMATCH, "bootstrap: rank ", rank, " holds ",
                 flags_text(credentials.flags), ", ", root_name, " holds ", flags_text(challenge.flags),
                 flags_hint(challenge.flags ^ credentials.flags));
    try {
      // The root answers at its own deadline at the latest (with the error naming the missing
      // ranks); a little grace lets that answer arrive rather than this rank's own timeout.
      return read_root_reply(fd.get(), size, deadline + kReplyGrace, hello, credentials);
    } catch (const Error& error) {
      if (error.code() != ONEBIT_TIMEOUT) throw;  // the root's own error, or its connection lost: said as it is
      fail(error.code(), "bootstrap: no answer from ", root_name, ": ", error.what());
    }
  }
}

void check_root_reachable(int rank, const Address& root, std::chrono::milliseconds window) {
  Fd connection;
  const int err = connect_until(root, Clock::now() + window, &connection);
  if (err == 0) return;
  std::string hint = loopback_hint(root);
  if (hint.empty() && err == ETIMEDOUT) {
    hint =
        "; rank 0 listens there already, so nothing answering is a firewall between the hosts or a route that "
        "does not reach rank 0 (ONEBIT_ROOT=host:port picks a port you can open)";
  }
  char seconds[32];
  std::snprintf(seconds, sizeof(seconds), "%.1f", std::chrono::duration<double>(window).count());
  fail(connect_failure_code(err), "rank ", rank, " cannot reach rank 0's bootstrap root at ", root.to_string(), ": ",
       errno_text(err), " for ", seconds, " s", hint);
}

BootstrapResult read_root_reply(int fd, int size, Deadline deadline, const wire::BootstrapHello& hello,
                                const Credentials& credentials) {
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
    fail(known ? static_cast<onebit_result_t>(head.status) : ONEBIT_REMOTE_ERROR,
         "bootstrap failed: ", printable(text));
  }
  ONEBIT_CHECK(head.size == static_cast<std::uint32_t>(size), ONEBIT_MISMATCH, "bootstrap: the root has ", head.size,
               " ranks, this rank was told ", size);
  const std::size_t table_end = reply.size() + size * wire::WireAddress::kSize;
  reply.resize(table_end + 32);
  read_all(fd, reply.data() + wire::BootstrapReplyHead::kSize, reply.size() - wire::BootstrapReplyHead::kSize, deadline,
           root);
  const auto expected = crypto::hmac_sha256(
      credentials.key, {std::string_view("reply"), hello.encode(), crypto::Bytes(reply.data(), table_end)});
  ONEBIT_CHECK(crypto::equal(expected.data(), reply.data() + table_end, expected.size()), ONEBIT_REMOTE_ERROR,
               "bootstrap: the root's reply fails its MAC: it is not this communicator's root (another key, or a "
               "process posing as the root)");
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
  // The data key: from the bootstrap key and the job secret. With a key or a rendezvous secret,
  // overhearing the reply is not enough to derive it.
  const auto data = crypto::hmac_sha256(credentials.key, {std::string_view("data"), head.encode()});
  result.data_key = {little_endian64(data.data()), little_endian64(data.data() + 8)};
  return result;
}

}  // namespace onebit::transport::tcp
