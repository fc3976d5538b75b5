// Who is in a communicator (docs/reliability.md): real processes and sockets on loopback. Each
// test puts something that does not belong — a rank of another job, group or attempt, a stranger
// speaking the wire format, a replayed hello, a process posing as the root, idle connections — next
// to a real job, and checks that it is refused and named while the job's own ranks get their own
// sums. Ranks join through the C API; strangers are written with the library's own wire records.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "onebit/onebit.h"
#include "tests/support/multiprocess.h"
#include "tests/support/rank_record.h"
#include "transport/tcp/bootstrap.h"
#include "transport/tcp/mesh.h"
#include "transport/tcp/socket.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/wire.h"

namespace onebit::testing {
namespace {

std::string root_at(int port) { return "127.0.0.1:" + std::to_string(port); }

// This process's stderr (where onebit logs) into the file at `path`.
bool redirect_stderr(const std::string& path) {
  std::fflush(stderr);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  const bool done = fd >= 0 && ::dup2(fd, STDERR_FILENO) >= 0;
  if (fd >= 0) ::close(fd);
  return done;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A one-shot signal between processes: a pipe the waiting side reads a byte from.
struct Signal {
  int fds[2];
  Signal() {
    if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
  }
  ~Signal() {
    ::close(fds[0]);
    ::close(fds[1]);
  }
  void raise() { [[maybe_unused]] ssize_t w = ::write(fds[1], "x", 1); }
  bool wait() {
    char byte;
    return ::read(fds[0], &byte, 1) == 1;
  }
};

// A process's record says `code`, and its message each of `says`.
void expect_record(const Record& record, onebit_result_t code, std::initializer_list<std::string> says) {
  const std::string message = record.message;
  EXPECT_EQ(record.code, code) << message;
  for (const std::string& text : says) EXPECT_NE(message.find(text), std::string::npos) << message;
}

// The environment of a launcher-started rank (torchrun's variables), for onebit_comm_init_env.
struct LaunchEnv {
  std::string master_port = "29500";
  std::string run_id;         // TORCHELASTIC_RUN_ID; empty: unset
  std::string restart = "0";  // TORCHELASTIC_RESTART_COUNT
  std::string auth_key;       // ONEBIT_AUTH_KEY; empty: unset
  void apply(int rank, int size, int root_port, int timeout_ms) const {
    ::setenv("ONEBIT_RANK", std::to_string(rank).c_str(), 1);
    ::setenv("ONEBIT_WORLD_SIZE", std::to_string(size).c_str(), 1);
    ::setenv("ONEBIT_ROOT", root_at(root_port).c_str(), 1);
    ::setenv("ONEBIT_TIMEOUT_MS", std::to_string(timeout_ms).c_str(), 1);
    ::setenv("MASTER_ADDR", "127.0.0.1", 1);
    ::setenv("MASTER_PORT", master_port.c_str(), 1);
    if (!run_id.empty()) {
      ::setenv("TORCHELASTIC_RUN_ID", run_id.c_str(), 1);
      ::setenv("TORCHELASTIC_RESTART_COUNT", restart.c_str(), 1);
    }
    if (!auth_key.empty()) ::setenv("ONEBIT_AUTH_KEY", auth_key.c_str(), 1);
  }
};

// A 2-rank job (`job`) and, on the same root address, rank 1 of another communicator (`other`).
// The other rank comes while the job's root waits for its own rank 1, is refused with an error
// naming both identities (`mine`, `theirs`), and the job then completes with its own sum. With
// `root_log`, rank 0's stderr (its log) goes to that file.
void expect_other_communicator_refused(const LaunchEnv& job, const LaunchEnv& other, const std::string& mine,
                                       const std::string& theirs, const std::string& root_log = "") {
  const int port = free_port();
  SharedMemory shared(3 * (sizeof(Record) + sizeof(float)));
  auto* records = shared.as<Record>();
  auto* sums = reinterpret_cast<float*>(records + 3);
  Signal other_done;
  auto outcomes = run_ranks(
      3,
      [&](int process) {
        const bool stranger = process == 2;
        const int rank = stranger ? 1 : process;
        RANK_FAILS_IF(process == 1 && !other_done.wait(), 6);  // the job's own rank 1 comes after the other has left
        RANK_FAILS_IF(process == 0 && !root_log.empty() && !redirect_stderr(root_log), 7);
        (stranger ? other : job).apply(rank, 2, port, stranger ? 2500 : 20000);
        onebit_comm_t comm = nullptr;
        records[process].set(onebit_comm_init_env(&comm));
        if (stranger) other_done.raise();
        if (comm == nullptr) return 0;
        float value = stranger ? 100.0f : static_cast<float>(rank + 1);
        records[process].set(onebit_allreduce(comm, &value, 1, ONEBIT_FLOAT32, ONEBIT_SUM));
        sums[process] = value;
        onebit_comm_destroy(comm);
        return 0;
      },
      std::chrono::seconds(60));
  for (int p = 0; p < 3; ++p) ASSERT_EQ(outcomes[p].exit_code, 0) << "process " << p;
  for (int p = 0; p < 2; ++p) {
    EXPECT_EQ(records[p].code, ONEBIT_SUCCESS) << "rank " << p << ": " << records[p].message;
    EXPECT_EQ(sums[p], 3.0f) << "rank " << p;
  }
  expect_record(records[2], ONEBIT_MISMATCH, {mine, theirs});
}

TEST(Membership, AStrangersIdentityReachesNoLogLineOrErrorRaw) {
  // A stranger's identity label (here torchrun's run id) with a newline that would forge a log
  // line and an escape sequence that would reach the terminal. The root logs its refusal at WARN
  // and sends it back; both show the label with those bytes as \xNN.
  LaunchEnv job, stranger;
  job.run_id = "run-7";
  stranger.run_id = "x\nhost:1:1 onebit WARN forged\x1b[2J";
  const std::string log = ::testing::TempDir() + "/onebit-root-log-" + std::to_string(::getpid());
  expect_other_communicator_refused(job, stranger, "torchrun run run-7",
                                    "torchrun run x\\x0ahost:1:1 onebit WARN forged\\x1b[2J", log);
  const std::string text = read_file(log);
  std::remove(log.c_str());
  EXPECT_NE(text.find("refused a"), std::string::npos) << text;
  EXPECT_NE(text.find("x\\x0ahost:1:1 onebit WARN forged\\x1b[2J"), std::string::npos) << text;
  EXPECT_EQ(text.find('\x1b'), std::string::npos) << text;
  EXPECT_EQ(text.find("\nhost:1:1 onebit WARN forged"), std::string::npos) << text;
}

TEST(Membership, TwoJobsOnOneRootAddressNeverCrossJoin) {
  // Two torchrun jobs on one host (MASTER_PORT 29500 and 29600) and the same default root port.
  LaunchEnv a, b;
  b.master_port = "29600";
  expect_other_communicator_refused(a, b, "master 127.0.0.1:29500", "master 127.0.0.1:29600");
}

// ONEBIT_ROOT held by another communicator's root (another job's, whose rank 1 is late), so that
// this job's rank 0 cannot bind it: this job's rank 1, with a timeout of 5 minutes, is told within
// a few tries (10 s) that the address is another communicator's, both named — not at its timeout.
// The harness gives it 40 s.
TEST(Membership, ARootAddressHeldByAnotherCommunicatorIsNamedWithinSeconds) {
  LaunchEnv job, other;
  other.master_port = "29600";
  const int port = free_port();
  SharedMemory shared(2 * sizeof(Record));
  auto* records = shared.as<Record>();
  Signal other_root_up;
  auto outcomes = run_ranks(
      2,
      [&](int process) {
        if (process == 0) {  // the other job's rank 0, serving its root until its own 15 s timeout
          other.apply(0, 2, port, 15000);
          onebit_comm_t comm = nullptr;
          char root[64];
          RANK_FAILS_IF(onebit_root_listen(root_at(port).c_str(), root, sizeof(root)) != ONEBIT_SUCCESS, 6);
          other_root_up.raise();
          records[0].set(onebit_comm_init_env(&comm));
          return 0;
        }
        RANK_FAILS_IF(!other_root_up.wait(), 7);
        job.apply(1, 2, port, 300000);
        onebit_comm_t comm = nullptr;
        records[1].set(onebit_comm_init_env(&comm));
        return 0;
      },
      std::chrono::seconds(40));
  for (int p = 0; p < 2; ++p) ASSERT_EQ(outcomes[p].exit_code, 0) << "process " << p << " " << outcomes[p].reason;
  expect_record(records[1], ONEBIT_MISMATCH,
                {"serves communicator 'master 127.0.0.1:29600", "not this rank's 'master 127.0.0.1:29500",
                 "give each job its own ONEBIT_ROOT"});
  EXPECT_EQ(records[0].code, ONEBIT_TIMEOUT) << records[0].message;
}

// ONEBIT_ROOT held by a program that accepts and says nothing (no onebit root: it never sends the
// challenge): a rank with a timeout of 5 minutes names it within a few tries (10 s).
TEST(Membership, ARootAddressHeldBySomethingSilentIsNamedWithinSeconds) {
  const int port = free_port();
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<std::uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int silent = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_EQ(::bind(silent, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0) << std::strerror(errno);
  ASSERT_EQ(::listen(silent, 16), 0);
  RankRecords records(1);
  auto outcomes = run_ranks(
      1,
      [&](int) {
        LaunchEnv().apply(1, 2, port, 300000);
        onebit_comm_t comm = nullptr;
        records[0].set(onebit_comm_init_env(&comm));
        return 0;
      },
      std::chrono::seconds(40));
  ::close(silent);
  ASSERT_EQ(outcomes[0].exit_code, 0) << outcomes[0].reason;
  expect_record(records[0], ONEBIT_MISMATCH,
                {"the bootstrap root at " + root_at(port) + " accepted the connection and sent no bootstrap challenge",
                 "it is not a onebit root", "program holds the address"});
}

TEST(Membership, AClusterWideAuthKeyDoesNotMakeTwoJobsOne) {
  LaunchEnv a, b;
  a.auth_key = b.auth_key = "one-key-for-the-whole-cluster";
  b.master_port = "29600";
  expect_other_communicator_refused(a, b, "master 127.0.0.1:29500", "master 127.0.0.1:29600");
}

TEST(Membership, ARankLeftOverFromAnEarlierAttemptIsRefused) {
  // torchrun restarted the job on the same address; a rank of attempt 0 is still around.
  LaunchEnv now, before;
  now.run_id = before.run_id = "run-7";
  now.restart = "1";
  before.restart = "0";
  expect_other_communicator_refused(now, before, "torchrun run run-7 restart 1", "torchrun run run-7 restart 0");
}

// ---- strangers that speak the wire format, against a communicator keyed by a rendezvous secret
// (as the torch backend and the Gloo door make theirs) ----

constexpr const char* kIdentity = "store id 5f0c";
constexpr const char* kSecret = "0123456789abcdef0123456789abcdef";

// A transport's options as these tests' jobs share them: 20 s, the test identity and secret.
transport::tcp::TransportOptions job_options() {
  transport::tcp::TransportOptions options;
  options.timeout = std::chrono::milliseconds(20000);
  options.membership = transport::tcp::Membership{kIdentity, "", kSecret};
  return options;
}

onebit_result_t join_keyed(int rank, int port, int timeout_ms, onebit_comm_t* comm) {
  onebit_config_t config{timeout_ms, 0, nullptr, nullptr, kIdentity, kSecret};
  return onebit_comm_init_config(comm, rank, 2, root_at(port).c_str(), &config);
}

// Rank 0 and rank 1 of a keyed job; rank 1 joins once `before_rank_1` (run in a third process) has
// done its worst. The job must get its own sum.
void expect_keyed_job_survives(const std::function<int(int port)>& before_rank_1) {
  const int port = free_port();
  SharedMemory shared(2 * (sizeof(Record) + sizeof(float)));
  auto* records = shared.as<Record>();
  auto* sums = reinterpret_cast<float*>(records + 2);
  Signal stranger_done;
  auto outcomes = run_ranks(
      3,
      [&](int process) {
        if (process == 2) {
          const int code = before_rank_1(port);
          stranger_done.raise();
          return code;
        }
        RANK_FAILS_IF(process == 1 && !stranger_done.wait(), 6);
        onebit_comm_t comm = nullptr;
        records[process].set(join_keyed(process, port, 20000, &comm));
        if (comm == nullptr) return 0;
        float value = static_cast<float>(process + 1);
        records[process].set(onebit_allreduce(comm, &value, 1, ONEBIT_FLOAT32, ONEBIT_SUM));
        sums[process] = value;
        onebit_comm_destroy(comm);
        return 0;
      },
      std::chrono::seconds(60));
  EXPECT_EQ(outcomes[2].exit_code, 0) << "the stranger's own checks";
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(outcomes[r].exit_code, 0) << "rank " << r;
    EXPECT_EQ(records[r].code, ONEBIT_SUCCESS) << "rank " << r << ": " << records[r].message;
    EXPECT_EQ(sums[r], 3.0f) << "rank " << r;
  }
}

// The stranger's connection to the root, with the challenge the root sent it.
struct StrangerConnection {
  transport::tcp::Fd fd;
  wire::BootstrapChallenge challenge;
  explicit StrangerConnection(int port) {
    const auto deadline = transport::tcp::Clock::now() + std::chrono::seconds(20);
    fd = transport::tcp::connect_to(transport::tcp::parse_host_port(root_at(port), "root"), deadline, "the root");
    std::uint8_t bytes[wire::BootstrapChallenge::kSize];
    transport::tcp::read_all(fd.get(), bytes, sizeof(bytes), deadline, "the root");
    challenge = wire::BootstrapChallenge::decode(bytes, "the root");
  }
  // Sends `hello` and returns the root's answer: its status and error text (status 0: let in).
  std::pair<int, std::string> send(const wire::BootstrapHello& hello) {
    const auto deadline = transport::tcp::Clock::now() + std::chrono::seconds(20);
    const auto bytes = hello.encode();
    transport::tcp::write_all(fd.get(), bytes.data(), bytes.size(), deadline, "the root");
    std::uint8_t head[wire::BootstrapReplyHead::kSize];
    transport::tcp::read_all(fd.get(), head, sizeof(head), deadline, "the root");
    const auto reply = wire::BootstrapReplyHead::decode(head, "the root");
    if (reply.status == 0) return {0, ""};
    std::uint8_t length[2];
    transport::tcp::read_all(fd.get(), length, 2, deadline, "the root");
    std::string text(length[0] | length[1] << 8, '\0');
    transport::tcp::read_all(fd.get(), text.data(), text.size(), deadline, "the root");
    return {reply.status, text};
  }
};

// A hello that claims rank 1 of the keyed job, with the key flags `as` holds.
wire::BootstrapHello claim_rank_1(const transport::tcp::Credentials& as) {
  wire::BootstrapHello hello;
  hello.flags = as.flags;
  hello.identity = as.identity;
  hello.rank = 1;
  hello.size = 2;
  hello.sockets_per_peer = 2;
  hello.listener.family = 4;
  hello.listener.port = 1;
  hello.listener.ip = {127, 0, 0, 1};
  return hello;
}

TEST(Membership, AStrangerWithoutTheSecretCannotTakeARank) {
  // It knows the identity (it overheard it) and says it holds the secret; it cannot prove it.
  expect_keyed_job_survives([](int port) {
    StrangerConnection root(port);
    const transport::tcp::Credentials guess(transport::tcp::Membership{kIdentity, "", "a guessed secret"});
    const auto [status, text] =
        root.send(transport::tcp::signed_bootstrap_hello(claim_rank_1(guess), root.challenge, guess));
    RANK_FAILS_IF(status != ONEBIT_REMOTE_ERROR, 2);
    return text.find("fails the bootstrap MAC") != std::string::npos ? 0 : 3;
  });
}

TEST(Membership, AReplayedHelloIsRefused) {
  // Even with the key, a hello made for one challenge (as a recording of a real rank's would be)
  // does not open a second connection.
  expect_keyed_job_survives([](int port) {
    StrangerConnection first(port), second(port);
    const transport::tcp::Credentials member(transport::tcp::Membership{kIdentity, "", kSecret});
    const auto recorded = transport::tcp::signed_bootstrap_hello(claim_rank_1(member), first.challenge, member);
    const auto [status, text] = second.send(recorded);
    RANK_FAILS_IF(status != ONEBIT_REMOTE_ERROR, 2);
    return text.find("a replayed hello") != std::string::npos ? 0 : 3;
  });
}

TEST(Membership, IdleConnectionsAtTheRootDoNotStallTheBootstrap) {
  // Sixteen connections that never say anything, held open while the job bootstraps with a 4 s
  // timeout: a root that gave each its 5 s in turn would time out.
  const int port = free_port();
  SharedMemory shared(2 * (sizeof(Record) + sizeof(float)));
  auto* records = shared.as<Record>();
  auto* sums = reinterpret_cast<float*>(records + 2);
  Signal idle_open, job_done;
  auto outcomes = run_ranks(
      3,
      [&](int process) {
        if (process == 2) {
          std::vector<transport::tcp::Fd> idle;
          const auto deadline = transport::tcp::Clock::now() + std::chrono::seconds(20);
          for (int i = 0; i < 16; ++i) {
            idle.push_back(transport::tcp::connect_to(transport::tcp::parse_host_port(root_at(port), "root"), deadline,
                                                      "the root"));
          }
          idle_open.raise();
          return job_done.wait() ? 0 : 6;  // the connections stay open until the job is through
        }
        RANK_FAILS_IF(process == 1 && !idle_open.wait(), 6);
        onebit_comm_t comm = nullptr;
        records[process].set(join_keyed(process, port, 4000, &comm));
        if (comm != nullptr) {
          float value = static_cast<float>(process + 1);
          records[process].set(onebit_allreduce(comm, &value, 1, ONEBIT_FLOAT32, ONEBIT_SUM));
          sums[process] = value;
          onebit_comm_destroy(comm);
        }
        if (process == 1) job_done.raise();
        return 0;
      },
      std::chrono::seconds(60));
  for (int p = 0; p < 3; ++p) ASSERT_EQ(outcomes[p].exit_code, 0) << "process " << p;
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(records[r].code, ONEBIT_SUCCESS) << "rank " << r << ": " << records[r].message;
    EXPECT_EQ(sums[r], 3.0f) << "rank " << r;
  }
}

TEST(Membership, AProcessPosingAsTheRootIsNotTaken) {
  // A local process holds the root address before rank 0 and answers rank 1 as its root: it knows
  // the identity and sends a well-formed table pointing at itself, but it has not the secret.
  const int port = free_port();
  SharedMemory shared(sizeof(Record));
  auto* record = shared.as<Record>();
  transport::tcp::Fd squatter = transport::tcp::listen_on(transport::tcp::parse_host_port(root_at(port), "root"), 16);
  auto outcomes = run_ranks(
      2,
      [&](int process) {
        if (process == 0) {  // the squatter
          const auto deadline = transport::tcp::Clock::now() + std::chrono::seconds(20);
          transport::tcp::Fd fd = transport::tcp::accept_until(squatter.get(), deadline);
          RANK_FAILS_IF(!fd, 2);
          const transport::tcp::Credentials guess(transport::tcp::Membership{kIdentity, "", "a guessed secret"});
          wire::BootstrapChallenge challenge;
          challenge.identity = guess.identity;
          challenge.flags = guess.flags;
          const auto c = challenge.encode();
          transport::tcp::write_all(fd.get(), c.data(), c.size(), deadline, "rank 1");
          std::uint8_t hello_bytes[wire::BootstrapHello::kSize];
          transport::tcp::read_all(fd.get(), hello_bytes, sizeof(hello_bytes), deadline, "rank 1");
          const auto hello = wire::BootstrapHello::decode(hello_bytes, "rank 1");
          wire::BootstrapReplyHead head;
          head.size = 2;
          std::vector<std::uint8_t> reply(wire::BootstrapReplyHead::kSize + 2 * wire::WireAddress::kSize);
          const auto h = head.encode();
          std::copy(h.begin(), h.end(), reply.begin());
          for (int r = 0; r < 2; ++r) {
            wire::Writer w(reply.data() + wire::BootstrapReplyHead::kSize + r * wire::WireAddress::kSize);
            w.put(std::uint16_t{4}).put(static_cast<std::uint16_t>(port)).bytes(hello.listener.ip.data(), 16);
          }
          const auto mac = crypto::hmac_sha256(
              guess.key, {std::string_view("reply"), hello.encode(), crypto::Bytes(reply.data(), reply.size())});
          reply.insert(reply.end(), mac.begin(), mac.end());
          transport::tcp::write_all(fd.get(), reply.data(), reply.size(), deadline, "rank 1");
          char byte;
          return ::read(fd.get(), &byte, 1) >= 0 ? 0 : 3;  // until rank 1 leaves
        }
        onebit_comm_t comm = nullptr;
        record->set(join_keyed(1, port, 5000, &comm));
        if (comm != nullptr) onebit_comm_destroy(comm);
        return 0;
      },
      std::chrono::seconds(60));
  ASSERT_EQ(outcomes[0].exit_code, 0) << "the squatter";
  ASSERT_EQ(outcomes[1].exit_code, 0) << "rank 1";
  expect_record(*record, ONEBIT_REMOTE_ERROR, {"the root's reply fails its MAC"});
}

TEST(Membership, RanksThatDisagreeOnHavingAKeyAreNamed) {
  // Rank 0 has ONEBIT_AUTH_KEY, rank 1 none: rank 1 learns at once, naming both settings.
  const int port = free_port();
  SharedMemory shared(sizeof(Record));
  auto* record = shared.as<Record>();
  auto outcomes = run_ranks(
      2,
      [&](int rank) {
        onebit_config_t config{rank == 0 ? 1500 : 20000, 0, nullptr, rank == 0 ? "k" : nullptr, kIdentity, nullptr};
        onebit_comm_t comm = nullptr;
        const onebit_result_t result = onebit_comm_init_config(&comm, rank, 2, root_at(port).c_str(), &config);
        if (rank == 1) record->set(result);
        return comm == nullptr ? 0 : 4;
      },
      std::chrono::seconds(60));
  ASSERT_EQ(outcomes[0].exit_code, 0);
  ASSERT_EQ(outcomes[1].exit_code, 0);
  expect_record(*record, ONEBIT_MISMATCH, {"rank 1 holds no key", "holds ONEBIT_AUTH_KEY"});
}

TEST(Membership, RanksOnDifferentTransportsAreNamed) {
  // Rank 1 was given ONEBIT_TRANSPORT=ibverbs, rank 0 tcp: both bootstraps of the mesh fail at once
  // naming both, rather than later on messages of another protocol.
  const int port = free_port();
  RankRecords records(2);
  auto outcomes = run_ranks(
      2,
      [&](int rank) {
        transport::tcp::TransportOptions options = job_options();
        options.transport = rank == 0 ? wire::kTransportTcp : wire::kTransportIbverbs;
        records[rank].code = ONEBIT_SUCCESS;
        try {
          transport::tcp::connect_mesh(rank, 2, transport::tcp::parse_host_port(root_at(port), "root"), options, 1);
        } catch (const Error& error) {
          records[rank].code = error.code();
          std::snprintf(records[rank].message, sizeof(records[rank].message), "%s", error.what());
        }
        return 0;
      },
      std::chrono::seconds(60));
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(outcomes[r].exit_code, 0);
    expect_record(records[r], ONEBIT_MISMATCH, {"ONEBIT_TRANSPORT differs: rank 1 uses ibverbs, rank 0 uses tcp"});
  }
}

TEST(Membership, APeerSendingMoreThanAnyCallAskedForIsNamed) {
  // Rank 1 sends eight 1 MiB messages for a call rank 0 never makes; rank 0 holds early messages up
  // to ONEBIT_UNEXPECTED_MB (4 here), then fails naming rank 1 — it does not grow without end.
  const int port = free_port();
  SharedMemory shared(sizeof(Record));
  auto* record = shared.as<Record>();
  auto outcomes = run_ranks(
      2,
      [&](int rank) {
        transport::tcp::TransportOptions options = job_options();
        options.max_unexpected_bytes = std::uint64_t{4} << 20;
        transport::tcp::TcpTransport transport(rank, 2, transport::tcp::parse_host_port(root_at(port), "root"),
                                               options);
        const wire::CallShape shape{1 << 18, 0, 0};
        std::vector<float> payload(1 << 18, 1.0f);
        const auto deadline = transport::tcp::Clock::now() + std::chrono::seconds(20);
        const auto describe = [](const Request&) { return std::string("a message"); };
        try {
          if (rank == 1) {
            std::vector<Request> sends(8);
            std::vector<Request*> all;
            for (int i = 0; i < 8; ++i) {
              transport.isend(sends[i], 0, 0, wire::MessageKey{7, static_cast<std::uint64_t>(i)}, shape, payload.data(),
                              payload.size() * sizeof(float));
              all.push_back(&sends[i]);
            }
            transport.wait_all(all, deadline, describe);  // fails once rank 0 gives up on it: not checked
          } else {
            Request never;
            transport.irecv(never, 1, 0, wire::MessageKey{7, 100}, shape, payload.data(),
                            payload.size() * sizeof(float));
            transport.wait_all({&never}, deadline, describe);
            std::snprintf(record->message, sizeof(record->message), "the receive completed");
          }
        } catch (const Error& error) {
          if (rank == 0) {
            record->code = error.code();
            std::snprintf(record->message, sizeof(record->message), "%s", error.what());
          }
        }
        return 0;
      },
      std::chrono::seconds(60));
  ASSERT_EQ(outcomes[0].exit_code, 0);
  expect_record(*record, ONEBIT_REMOTE_ERROR,
                {"rank 1 sent 5 MiB of messages that no call of rank 0 has asked for", "ONEBIT_UNEXPECTED_MB=4"});
}

}  // namespace
}  // namespace onebit::testing
