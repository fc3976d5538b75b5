#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <set>
#include <string>

#include "common/error.h"
#include "common/params.h"
#include "tests/support/child_output.h"

namespace onebit::param {
namespace {

TEST(Params, EveryVariableIsDocumentedOnceWithThePrefix) {
  std::set<std::string> seen;
  for (const Description& d : descriptions()) {
    EXPECT_EQ(std::string(d.env).rfind("ONEBIT_", 0), 0u) << d.env;
    EXPECT_TRUE(seen.insert(d.env).second) << d.env << " is declared twice";
    EXPECT_GT(std::string(d.doc).size(), 20u) << d.env << " needs a real description";
  }
}

TEST(Params, MarkdownTableHasARowPerVariable) {
  const std::string table = markdown_table();
  for (const Description& d : descriptions()) {
    EXPECT_NE(table.find(std::string("| `") + d.env + "` |"), std::string::npos) << d.env;
  }
}

TEST(Params, EveryIntVariableHasARangeAndEveryRangeAVariable) {
  std::set<std::string> ints, ranged;
  for (const Description& d : descriptions()) {
    if (std::string(d.type) == "int") ints.insert(d.env);
  }
  for (const Range& r : kRanges) {
    EXPECT_TRUE(ints.count(r.env)) << r.env << " has a range but is no int variable";
    EXPECT_TRUE(ranged.insert(r.env).second) << r.env << " has two ranges";
    EXPECT_LE(r.min, r.max) << r.env;
  }
  EXPECT_EQ(ints, ranged);
}

// What reading `read` says with `env`=`value`, in a child process (variables are read once per
// process): "" when it is accepted, else the error message.
std::string read_in_child(const char* env, const char* value, const std::function<void()>& read) {
  return testing::child_output([&] {
    ::setenv(env, value, 1);
    try {
      read();
    } catch (const Error& error) {
      return std::string(error.what());
    }
    return std::string();
  });
}

TEST(Params, OutOfRangeValuesAreRefusedByName) {
  // A timeout the clock cannot add to now, zero, negative: each refused naming the variable.
  EXPECT_EQ(read_in_child("ONEBIT_TIMEOUT_MS", "60000", [] { TimeoutMs(); }), "");
  for (const char* bad : {"0", "-5", "9223372036854775807"}) {
    const std::string message = read_in_child("ONEBIT_TIMEOUT_MS", bad, [] { TimeoutMs(); });
    EXPECT_NE(message.find(std::string("ONEBIT_TIMEOUT_MS='") + bad + "' is out of range: 1..31622400000"),
              std::string::npos)
        << message;
  }
  EXPECT_NE(read_in_child("ONEBIT_SOCKETS_PER_PEER", "0", [] { SocketsPerPeer(); }).find("out of range: 1..64"),
            std::string::npos);
  EXPECT_NE(read_in_child("ONEBIT_ROOT_PORT", "70000", [] { RootPort(); }).find("out of range: 1..65535"),
            std::string::npos);
  EXPECT_NE(read_in_child("ONEBIT_UNEXPECTED_MB", "-1", [] { UnexpectedMb(); }).find("ONEBIT_UNEXPECTED_MB='-1'"),
            std::string::npos);
}

}  // namespace
}  // namespace onebit::param

#include "common/siphash.h"

namespace onebit {
namespace {

TEST(SipHash, MatchesTheReferenceVectors) {
  // From the SipHash paper, appendix A: key 00 01 .. 0f, message 00 01 .. 0e.
  const SipKey key = {0x0706050403020100ull, 0x0f0e0d0c0b0a0908ull};
  std::uint8_t message[64];
  for (int i = 0; i < 64; ++i) message[i] = static_cast<std::uint8_t>(i);
  EXPECT_EQ(siphash24(key, message, 15), 0xa129ca6149be45e5ull);
  // The reference implementation's vectors.h, first entries (empty input, one byte, eight bytes).
  EXPECT_EQ(siphash24(key, message, 0), 0x726fdb47dd0e0e31ull);
  EXPECT_EQ(siphash24(key, message, 1), 0x74f839c593dc67fdull);
  EXPECT_EQ(siphash24(key, message, 8), 0x93f5f5799a932462ull);
}

TEST(SipHash, MacsCompare) {
  EXPECT_TRUE(mac_equal(42, 42));
  EXPECT_FALSE(mac_equal(42, 43));
}

}  // namespace
}  // namespace onebit
