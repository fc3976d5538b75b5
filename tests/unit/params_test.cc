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
