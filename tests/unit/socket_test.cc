// NCCL_SOCKET_IFNAME's syntax, as onebit's bootstrap and its NCCL_NET plugin both read it; what
// socket errors and the open-files check say (transport/tcp/file_limit.h).
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cerrno>
#include <string>

#include "common/error.h"
#include "transport/tcp/file_limit.h"
#include "transport/tcp/socket.h"

namespace onebit::transport::tcp {
namespace {

TEST(InterfaceMatches, PrefixesExactNamesListsAndExclusion) {
  EXPECT_TRUE(interface_matches("eth", "eth0", false));
  EXPECT_FALSE(interface_matches("eth", "ens3", false));
  EXPECT_TRUE(interface_matches("eth,ens", "ens3", false));
  EXPECT_TRUE(interface_matches("=eth0", "eth0", false));
  EXPECT_FALSE(interface_matches("=eth0", "eth01", false));
  EXPECT_TRUE(interface_matches("=eth1,eth0", "eth0", false)) << "every name of an exact list is exact";
  EXPECT_FALSE(interface_matches("^docker", "docker0", false));
  EXPECT_TRUE(interface_matches("^docker", "eth0", false));
  EXPECT_FALSE(interface_matches("^docker", "lo", true)) << "exclusion never selects loopback";
  EXPECT_FALSE(interface_matches("^=docker0,virbr0", "virbr0", false));
  EXPECT_TRUE(interface_matches("^=docker0,virbr0", "docker01", false)) << "exact exclusion spares longer names";
  EXPECT_TRUE(interface_matches("lo", "lo", true)) << "asking for loopback by name gets it";
  EXPECT_TRUE(interface_matches("", "eth0", false));
  EXPECT_FALSE(interface_matches("", "lo", true)) << "no spec: everything but loopback";
}

TEST(ErrnoText, OutOfDescriptorsSaysHowManyAreOpenAndTheLimit) {
  EXPECT_EQ(errno_text(ECONNREFUSED), "Connection refused (errno 111)");
  rlimit limit{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &limit), 0);
  const std::string emfile = errno_text(EMFILE);
  EXPECT_EQ(emfile.rfind("Too many open files (errno 24) (", 0), 0u) << emfile;
  EXPECT_NE(emfile.find(" files open; the open-files limit, ulimit -n, is " + std::to_string(limit.rlim_cur) + ")"),
            std::string::npos)
      << emfile;
  EXPECT_NE(errno_text(ENFILE).find("fs.file-max"), std::string::npos) << errno_text(ENFILE);
}

// Only the soft limit is moved (and put back), so the test leaves this process as it found it.
TEST(MakeRoomForDescriptors, RaisesTheSoftLimitOrNamesBothLimits) {
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  if (saved.rlim_max < 300 || saved.rlim_max > (rlim_t{1} << 30)) GTEST_SKIP() << "hard limit " << saved.rlim_max;
  const rlimit low{64, saved.rlim_max};
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  make_room_for_descriptors(10, "a few");  // fits: nothing changes
  rlimit now{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &now), 0);
  EXPECT_EQ(now.rlim_cur, 64u);
  make_room_for_descriptors(200, "two hundred");  // fits under the hard limit: raised to it
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &now), 0);
  EXPECT_EQ(now.rlim_cur, saved.rlim_max);
  const std::size_t too_many = static_cast<std::size_t>(saved.rlim_max) + 1;
  try {
    make_room_for_descriptors(too_many, "rank 7 of 160");
    ADD_FAILURE() << too_many << " more descriptors under a hard limit of " << saved.rlim_max;
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ONEBIT_SYSTEM_ERROR);
    const std::string message = error.what();
    const std::string limit = std::to_string(saved.rlim_max);
    EXPECT_EQ(message.rfind("rank 7 of 160 needs " + std::to_string(too_many) + " more file descriptors; ", 0), 0u)
        << message;
    EXPECT_NE(message.find("the open-files limit is " + limit + " (ulimit -n; hard limit " + limit + ")"),
              std::string::npos)
        << message;
  }
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &saved), 0);
}

}  // namespace
}  // namespace onebit::transport::tcp
