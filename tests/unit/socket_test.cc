// NCCL_SOCKET_IFNAME's syntax, as onebit's bootstrap and its NCCL_NET plugin both read it.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace onebit::transport::tcp
