#include <gtest/gtest.h>

#include <set>
#include <string>

#include "common/params.h"

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

TEST(SipHash, KeysFromTextDifferAndMacsCompare) {
  EXPECT_NE(sip_key_from_text("a"), sip_key_from_text("b"));
  EXPECT_EQ(sip_key_from_text("secret"), sip_key_from_text("secret"));
  EXPECT_TRUE(mac_equal(42, 42));
  EXPECT_FALSE(mac_equal(42, 43));
}

}  // namespace
}  // namespace onebit
