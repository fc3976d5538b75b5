// Who may join a job through the shipped C ABI: strangers and old-protocol peers at the bootstrap
// root are ignored, ONEBIT_AUTH_KEY keeps a different key out.

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <sched.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cpu/half.h"
#include "onebit/onebit.h"
#include "tests/engine/engine_jobs.h"
#include "tests/support/float32_oracle.h"
#include "tests/support/float64_reference.h"
#include "tests/support/multiprocess.h"
#include "tests/support/rank_record.h"

namespace onebit::testing {
namespace {

void expect_job_survives_stranger_at_root(const std::vector<std::uint8_t>& bytes) {
  const int world = 2;
  const int port = free_port();
  auto outcomes = run_ranks(world, [&](int rank) {
    if (rank == 1) {
      sockaddr_in address{};
      address.sin_family = AF_INET;
      address.sin_port = htons(static_cast<std::uint16_t>(port));
      address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      for (int tries = 0; ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0; ++tries) {
        ::close(fd);
        RANK_FAILS_IF(tries > 1000000, 7);
        ::sched_yield();
        fd = ::socket(AF_INET, SOCK_STREAM, 0);
      }
      [[maybe_unused]] ssize_t w = ::write(fd, bytes.data(), bytes.size());
      ::close(fd);
    }
    onebit_comm_t comm = join_loopback(rank, world, port);
    std::vector<float> buffer(10, static_cast<float>(rank));
    const bool ok =
        onebit_allreduce(comm, buffer.data(), 10, ONEBIT_FLOAT32, ONEBIT_SUM) == ONEBIT_SUCCESS && buffer[0] == 1.0f;
    onebit_comm_destroy(comm);
    return ok ? 0 : 2;
  });
  EXPECT_EQ(outcomes[0].exit_code, 0);
  EXPECT_EQ(outcomes[1].exit_code, 0);
}

TEST(Errors, StrangerAtTheBootstrapRootIsIgnored) {
  // As a port scanner or an HTTP client would.
  const std::string garbage = "GET / HTTP/1.0\r\n\r\n0123456789abcdefghijklmnopqrstuvwxyz";
  expect_job_survives_stranger_at_root(std::vector<std::uint8_t>(garbage.begin(), garbage.end()));
}

TEST(Access, RanksWithTheSameAuthKeyJoinAndADifferentKeyIsKeptOut) {
  // Same key: the job runs.
  {
    const int port = free_port();
    auto outcomes = run_ranks(2, [&](int rank) {
      onebit_config_t config{5000, 0, nullptr, "launcher-secret", nullptr, nullptr};
      onebit_comm_t comm = nullptr;
      RANK_FAILS_IF(onebit_comm_init_config(&comm, rank, 2, root_at(port).c_str(), &config) != ONEBIT_SUCCESS, 2);
      std::vector<float> buffer(8, 1.0f);
      const bool ok =
          onebit_allreduce(comm, buffer.data(), 8, ONEBIT_FLOAT32, ONEBIT_SUM) == ONEBIT_SUCCESS && buffer[0] == 2.0f;
      onebit_comm_destroy(comm);
      return ok ? 0 : 3;
    });
    EXPECT_EQ(outcomes[0].exit_code, 0);
    EXPECT_EQ(outcomes[1].exit_code, 0);
  }
  // Rank 1 has another key: the root ignores it; rank 0 fails at the timeout naming rank 1, and rank
  // 1's message says what to check.
  const int port = free_port();
  RankRecords records(2);
  auto outcomes = run_ranks(2, [&](int rank) {
    onebit_config_t config{1500, 0, nullptr, rank == 0 ? "launcher-secret" : "another-secret", nullptr, nullptr};
    onebit_comm_t comm = nullptr;
    records[rank].set(onebit_comm_init_config(&comm, rank, 2, root_at(port).c_str(), &config));
    return comm == nullptr ? 0 : 4;
  });
  ASSERT_EQ(outcomes[0].exit_code, 0);
  ASSERT_EQ(outcomes[1].exit_code, 0);
  EXPECT_EQ(records[0].code, ONEBIT_TIMEOUT) << records[0].message;
  EXPECT_NE(std::string(records[0].message).find("rank(s) 1 of 2 never reached the root"), std::string::npos)
      << records[0].message;
  // The root answers an unproven hello at once, so rank 1 learns without waiting.
  EXPECT_EQ(records[1].code, ONEBIT_REMOTE_ERROR) << records[1].message;
  EXPECT_NE(std::string(records[1].message).find("refused this rank: its hello fails the bootstrap MAC"),
            std::string::npos)
      << records[1].message;
  EXPECT_NE(std::string(records[1].message).find("holds a different key"), std::string::npos) << records[1].message;
}

TEST(Access, OldProtocolPeerAtTheRootIsIgnored) {
  // A well-formed bootstrap hello of protocol version 0 that claims rank 1, before the real rank 1.
  std::vector<std::uint8_t> hello(48, 0);
  hello[0] = 0x31, hello[1] = 0x42, hello[2] = 0x42, hello[3] = 0x4F;  // "OBB1"; version 0
  hello[8] = 1;                                                        // rank 1
  hello[12] = 2;                                                       // of 2
  expect_job_survives_stranger_at_root(hello);
}

// Two ranks forked from this process make a communicator at `root` (rank 0 serving the bootstrap
// on the listener this process holds there), and their 2-rank sum is exact.
void expect_two_ranks_sum_exactly_at(const std::string& root, const char* identity) {
  auto outcomes = run_ranks(2, [&](int rank) {
    onebit_config_t config{10000, 0, nullptr, nullptr, identity, nullptr};
    onebit_comm_t comm = nullptr;
    RANK_FAILS_IF(onebit_comm_init_config(&comm, rank, 2, root.c_str(), &config) != ONEBIT_SUCCESS, 2);
    std::vector<float> buffer(16, static_cast<float>(rank + 1));
    const bool ok =
        onebit_allreduce(comm, buffer.data(), 16, ONEBIT_FLOAT32, ONEBIT_SUM) == ONEBIT_SUCCESS && buffer[15] == 3.0f;
    onebit_comm_destroy(comm);
    return ok ? 0 : 3;
  });
  EXPECT_EQ(outcomes[0].exit_code, 0) << outcomes[0].reason;
  EXPECT_EQ(outcomes[1].exit_code, 0) << outcomes[1].reason;
}

// onebit_root_listen: rank 0's root listener opened ahead, for a launcher that publishes the address
// itself. While it waits for the communicator the port is held (another bind fails, as it would
// not after a probe that binds and closes), and the communicator made with that root serves on it:
// a 2-rank job's sum is exact. Bad input is refused, naming it, and opens nothing.
TEST(Access, ARootListenedForAheadIsHeldAndServedByTheCommunicator) {
  char root[64] = {0};
  ASSERT_EQ(onebit_root_listen("127.0.0.1:0", root, sizeof(root)), ONEBIT_SUCCESS) << onebit_last_error();
  const std::string address = root;
  ASSERT_EQ(address.rfind("127.0.0.1:", 0), 0u) << address;
  const int port = std::stoi(address.substr(address.find(':') + 1));
  ASSERT_GT(port, 0);

  // Held: neither another socket nor a second onebit_root_listen can bind it.
  sockaddr_in taken{};
  taken.sin_family = AF_INET;
  taken.sin_port = htons(static_cast<std::uint16_t>(port));
  taken.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int other = ::socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_NE(::bind(other, reinterpret_cast<sockaddr*>(&taken), sizeof(taken)), 0);
  EXPECT_EQ(errno, EADDRINUSE);
  ::close(other);
  char again[64];
  EXPECT_EQ(onebit_root_listen(address.c_str(), again, sizeof(again)), ONEBIT_SYSTEM_ERROR);

  // Refusals: a buffer that cannot hold the address, an address that does not parse, NULLs.
  char small[8];
  EXPECT_EQ(onebit_root_listen("127.0.0.1:0", small, sizeof(small)), ONEBIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(onebit_last_error()).find("root_size 8"), std::string::npos) << onebit_last_error();
  EXPECT_EQ(onebit_root_listen("no port here", again, sizeof(again)), ONEBIT_INVALID_ARGUMENT);
  EXPECT_EQ(onebit_root_listen(nullptr, again, sizeof(again)), ONEBIT_INVALID_ARGUMENT);

  // Forked ranks inherit the listener; rank 0's communicator serves the bootstrap on it.
  expect_two_ranks_sum_exactly_at(address, "root listened ahead");
}

// onebit_root_check: whether a rank reaches the root rank 0 published. A held listener answers; a
// closed one (onebit_root_close) is ONEBIT_TIMEOUT within the window asked, naming the rank, the
// address and — for a loopback address — why another host's rank cannot reach it; a root whose
// host answers nothing (here a listener whose backlog is full, so the kernel drops the SYNs, as a
// firewall does) says so with the firewall hint. Bad input is refused naming it.
std::string first_outward_ipv4() {
  ifaddrs* all = nullptr;
  if (::getifaddrs(&all) != 0) return "";
  std::string found;
  for (ifaddrs* i = all; i != nullptr && found.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET || (i->ifa_flags & IFF_LOOPBACK) ||
        !(i->ifa_flags & IFF_UP)) {
      continue;
    }
    char text[INET_ADDRSTRLEN];
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof(text));
    found = text;
  }
  ::freeifaddrs(all);
  return found;
}

// A listener on `host` that accepts nothing and whose accept queue is full: later SYNs are dropped.
int silent_listener(const std::string& host, std::string* root) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  ::inet_pton(AF_INET, host.c_str(), &address.sin_addr);
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 || ::listen(listener, 0) != 0) {
    return -1;
  }
  socklen_t length = sizeof(address);
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length);
  *root = host + ":" + std::to_string(ntohs(address.sin_port));
  // Connect until one does not complete: the queue is full from then on.
  const timeval wait{0, 200000};
  for (int i = 0; i < 16; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &wait, sizeof(wait));
    if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
      ::close(fd);
      return listener;
    }
  }
  return -1;
}

TEST(Access, ARanksCheckOfAPublishedRootNamesTheAddressAndWhyItCannotReachIt) {
  char root[64] = {0};
  ASSERT_EQ(onebit_root_listen("127.0.0.1:0", root, sizeof(root)), ONEBIT_SUCCESS) << onebit_last_error();
  EXPECT_EQ(onebit_root_check(1, 2, root, 2000), ONEBIT_SUCCESS) << onebit_last_error();

  ASSERT_EQ(onebit_root_close(root), ONEBIT_SUCCESS) << onebit_last_error();
  EXPECT_EQ(onebit_root_check(3, 4, root, 300), ONEBIT_TIMEOUT);
  const std::string closed = onebit_last_error();
  for (const std::string& part :
       {std::string("rank 3 cannot reach rank 0's bootstrap root at ") + root, std::string("Connection refused"),
        std::string("only ranks on rank 0's host find the root there")}) {
    EXPECT_NE(closed.find(part), std::string::npos) << "missing '" << part << "' in: " << closed;
  }
  // Every rank checks, whatever the world size (none answers ONEBIT_SUCCESS without connecting).
  EXPECT_EQ(onebit_root_check(33, 1000, root, 300), ONEBIT_TIMEOUT);
  EXPECT_EQ(onebit_root_check(2, 1000, root, 300), ONEBIT_TIMEOUT);
  EXPECT_EQ(onebit_root_check(0, 2, root, 300), ONEBIT_INVALID_ARGUMENT);
  EXPECT_EQ(onebit_root_close(root), ONEBIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(onebit_last_error()).find(std::string("no listener is held at ") + root), std::string::npos)
      << onebit_last_error();

  const std::string host = first_outward_ipv4();
  if (!host.empty()) {
    std::string silent;
    const int listener = silent_listener(host, &silent);
    ASSERT_GE(listener, 0) << "could not fill a listener's queue on " << host;
    EXPECT_EQ(onebit_root_check(2, 3, silent.c_str(), 500), ONEBIT_TIMEOUT);
    const std::string text = onebit_last_error();
    EXPECT_NE(text.find("rank 2 cannot reach rank 0's bootstrap root at " + silent), std::string::npos) << text;
    EXPECT_NE(text.find("a firewall between the hosts"), std::string::npos) << text;
    ::close(listener);
  }

  EXPECT_EQ(onebit_root_check(1, 2, nullptr, 0), ONEBIT_INVALID_ARGUMENT);
  EXPECT_EQ(onebit_root_check(1, 2, "127.0.0.1:1", -1), ONEBIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(onebit_last_error()).find("timeout_ms -1"), std::string::npos) << onebit_last_error();
  EXPECT_EQ(onebit_root_check(1, 2, "no port here", 0), ONEBIT_INVALID_ARGUMENT);
  EXPECT_EQ(onebit_root_close(nullptr), ONEBIT_INVALID_ARGUMENT);
}

// A rank given only the root's address (onebit_comm_init, onebit_comm_init_env) where nothing
// listens cannot tell a rank 0 not started yet from one that failed, so it tries until its timeout;
// but it says so at WARN early (a quarter of the timeout here), naming the address, the reason and
// the loopback trap, and its error at the timeout names them too. (Before: silence, then "cannot
// connect to the bootstrap root (rank 0) at ...: Connection refused" alone.)
TEST(Access, ARankWhoseRootNeverAnswersSaysSoEarlyAndNamesTheAddressAtItsTimeout) {
  const std::string root = "127.0.0.1:" + std::to_string(free_port());
  const onebit_config_t config{1200, 0, nullptr, nullptr, nullptr, nullptr};
  onebit_comm_t comm = nullptr;
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(onebit_comm_init_config(&comm, 1, 2, root.c_str(), &config), ONEBIT_TIMEOUT);
  const std::string log = ::testing::internal::GetCapturedStderr();
  const std::string error = onebit_last_error();
  for (const std::string& part : {"cannot connect to the bootstrap root (rank 0) at " + root + ": Connection refused",
                                  std::string("only ranks on rank 0's host find the root there")}) {
    EXPECT_NE(error.find(part), std::string::npos) << "missing '" << part << "' in: " << error;
  }
  EXPECT_NE(log.find("rank 1/2: nothing answers at the bootstrap root at " + root + ": Connection refused"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find(". Rank 0 has not started yet, has failed, or listens elsewhere; " + root +
                     " is each host's own loopback"),
            std::string::npos)
      << log;
  EXPECT_EQ(comm, nullptr);
}

// More checks than the listener's accept queue holds (1024 here; as few as 128 on kernels before
// 5.4) all succeed: the held listener answers them as they come instead of leaving them queued for
// the bootstrap. (Before, the 1026th check found the queue full and timed out, and so only 32
// ranks were let check.) The communicator made afterwards on that root still serves, in ranks
// forked after the checks (a fork stops the answering, root_listener.h).
TEST(Access, AHeldRootAnswersMoreChecksThanItsAcceptQueueHolds) {
  char root[64] = {0};
  ASSERT_EQ(onebit_root_listen("127.0.0.1:0", root, sizeof(root)), ONEBIT_SUCCESS) << onebit_last_error();
  constexpr int kChecks = 1500;
  for (int i = 0; i < kChecks; ++i) {
    ASSERT_EQ(onebit_root_check(1 + i, kChecks + 1, root, 2000), ONEBIT_SUCCESS)
        << "check " << i << ": " << onebit_last_error();
  }
  const std::string address = root;
  expect_two_ranks_sum_exactly_at(address, "root after checks");
}

}  // namespace
}  // namespace onebit::testing
