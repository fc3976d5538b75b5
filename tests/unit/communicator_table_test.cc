// The NCCL door's table of communicators (plugin/preload/communicator_table.h), which keys every
// tag's device state: ids fresh per communicator, how each blocks, and its end in two steps around
// NCCL's destroy/abort — a call racing the end is refused instead of making state for a dying
// communicator that a new one at the same address would inherit. Pure bookkeeping: no NCCL or GPU.
#include "plugin/preload/communicator_table.h"

#include <gtest/gtest.h>

#include <string>

namespace onebit::front::nccl {
namespace {

int storage[3];
const void* const kFirst = &storage[0];
const void* const kSecond = &storage[1];

// The code and message of the refusal of a call on `comm`, or ONEBIT_SUCCESS and "".
std::pair<onebit_result_t, std::string> refusal(CommunicatorTable& table, const void* comm) {
  try {
    table.id_of(comm, true);
    return {ONEBIT_SUCCESS, ""};
  } catch (const Error& error) {
    return {error.code(), error.what()};
  }
}

TEST(CommunicatorTable, EachCommunicatorHasItsOwnIdAndBlocking) {
  CommunicatorTable table;
  table.made(kFirst, false);
  const std::uint64_t first = table.id_of(kFirst, true);
  EXPECT_EQ(table.id_of(kFirst, true), first);
  EXPECT_FALSE(table.blocking(kFirst, true));  // as made, not as the default says
  // Unseen: recorded at its first question, with the default, and kept.
  const std::uint64_t second = table.id_of(kSecond, true);
  EXPECT_NE(second, first);
  EXPECT_TRUE(table.blocking(kSecond, false));
  EXPECT_EQ(table.id_of(kSecond, false), second);
}

TEST(CommunicatorTable, ACallRacingTheEndIsRefusedAndTheNextCommunicatorThereStartsFresh) {
  CommunicatorTable table;
  table.made(kFirst, true);
  const std::uint64_t id = table.id_of(kFirst, true);
  EXPECT_TRUE(table.live(kFirst, id));
  const CommunicatorTable::Ending ending = table.begin_end(kFirst, true);
  EXPECT_EQ(ending.id, id);  // the states to drop are this id's
  EXPECT_TRUE(ending.seen);
  const auto [code, message] = refusal(table, kFirst);
  EXPECT_EQ(code, ONEBIT_INVALID_ARGUMENT);
  EXPECT_NE(message.find("is being destroyed or aborted"), std::string::npos) << message;
  // A call that took its id before the end began asks again once it holds its tag: refused too.
  EXPECT_FALSE(table.live(kFirst, id));
  EXPECT_TRUE(table.blocking(kFirst, false));                         // still answered, as it was made
  EXPECT_EQ(table.id_of(kSecond, true), table.id_of(kSecond, true));  // others untouched
  table.finish_end(kFirst, ending);
  EXPECT_FALSE(table.live(kFirst, id));
  const std::uint64_t next = table.id_of(kFirst, true);  // a later communicator at that address
  EXPECT_NE(next, id);
  EXPECT_EQ(refusal(table, kFirst).first, ONEBIT_SUCCESS);
  EXPECT_TRUE(table.live(kFirst, next));
}

// An unseen communicator has no states (nothing to drop: `seen` is false), but calls racing its
// end are refused all the same, and it blocks during the end as NCCL's default says.
TEST(CommunicatorTable, AnEndOfAnUnseenCommunicatorAlsoRefusesRacingCalls) {
  CommunicatorTable table;
  const CommunicatorTable::Ending ending = table.begin_end(kFirst, false);
  EXPECT_FALSE(ending.seen);
  EXPECT_EQ(refusal(table, kFirst).first, ONEBIT_INVALID_ARGUMENT);
  EXPECT_FALSE(table.blocking(kFirst, true));
  table.finish_end(kFirst, ending);
  EXPECT_NE(table.id_of(kFirst, true), ending.id);
}

// NCCL's destroy failed: the communicator lives on (an abort follows) with its id and blocking; one
// recorded only for the end is forgotten.
TEST(CommunicatorTable, AFailedEndLeavesTheCommunicatorAsItWas) {
  CommunicatorTable table;
  table.made(kFirst, false);
  const std::uint64_t id = table.id_of(kFirst, true);
  const CommunicatorTable::Ending ending = table.begin_end(kFirst, true);
  table.cancel_end(kFirst, ending);
  EXPECT_EQ(table.id_of(kFirst, true), id);
  EXPECT_TRUE(table.live(kFirst, id));
  EXPECT_FALSE(table.blocking(kFirst, true));
  const CommunicatorTable::Ending unseen = table.begin_end(kSecond, true);
  table.cancel_end(kSecond, unseen);
  EXPECT_FALSE(table.live(kSecond, unseen.id));
  EXPECT_FALSE(table.blocking(kSecond, false));  // recorded afresh, with this default
  // The abort after: an end as any other.
  const CommunicatorTable::Ending abort = table.begin_end(kFirst, true);
  EXPECT_TRUE(abort.seen);
  EXPECT_EQ(abort.id, id);
}

// NCCL may hand the address to a communicator an interposed init makes before the end's own
// bookkeeping finishes: that one is recorded fresh, and the end does not forget it.
TEST(CommunicatorTable, ACommunicatorMadeAtTheAddressDuringTheEndIsKept) {
  CommunicatorTable table;
  table.made(kFirst, true);
  const CommunicatorTable::Ending ending = table.begin_end(kFirst, true);
  table.made(kFirst, false);
  const std::uint64_t new_id = table.id_of(kFirst, true);
  EXPECT_NE(new_id, ending.id);
  table.finish_end(kFirst, ending);
  EXPECT_EQ(table.id_of(kFirst, true), new_id);
  EXPECT_FALSE(table.blocking(kFirst, true));
  table.cancel_end(kFirst, ending);  // nor does a cancel of the old end touch it
  EXPECT_TRUE(table.live(kFirst, new_id));
}

}  // namespace
}  // namespace onebit::front::nccl
