// The tag registry's ownership of error-feedback state, and checkpoints through the C ABI, in one
// process with the engine (onebit_core + the C ABI's objects, no shared library in between). The
// NCCL front door keeps its device buffers as a Tag's DeviceState; a GPU is not needed to check
// the lifetime and checkpoint rules it relies on, so a host-memory DeviceState stands in for it.
#include <gtest/gtest.h>

#include <future>
#include <string>
#include <thread>
#include <vector>

#include "engine/tag_registry.h"
#include "onebit/onebit.h"

namespace onebit {
namespace {

// A DeviceState that says what a device state would, and records its own destruction.
struct FakeDeviceState : DeviceState {
  FakeDeviceState(std::size_t n, std::size_t server, bool* destroyed) : n(n), server(server), destroyed(destroyed) {}
  ~FakeDeviceState() override { *destroyed = true; }
  std::size_t server_count() const override { return server; }
  void save(float* worker, float* server_out) const override {
    for (std::size_t i = 0; i < n; ++i) worker[i] = 0.5f + static_cast<float>(i);
    for (std::size_t i = 0; i < server; ++i) server_out[i] = -0.25f - static_cast<float>(i);
  }
  std::uint64_t completed_calls() const override { return completed; }
  std::size_t n, server;
  bool* destroyed;
  std::uint64_t completed = 0;
};

TEST(TagState, ADetachedAddressIsUntaggedButItsNameKeepsTheTag) {
  // What the Python shim does when a tagged tensor's memory is freed: the address no longer counts
  // as tagged, and the name, with its state, moves to the next buffer tagged under it.
  std::vector<float> first(64), second(64);
  ASSERT_EQ(onebit_tag("detached", first.data(), first.size(), ONEBIT_FLOAT32), ONEBIT_SUCCESS);
  const auto tag = TagRegistry::instance().find_name("detached");
  ASSERT_EQ(onebit_tag_detach(first.data()), ONEBIT_SUCCESS);
  EXPECT_EQ(TagRegistry::instance().find(first.data()), nullptr);
  EXPECT_EQ(TagRegistry::instance().find_name("detached"), tag);
  EXPECT_EQ(onebit_tag_detach(first.data()), ONEBIT_INVALID_ARGUMENT) << "detached twice";
  ASSERT_EQ(onebit_tag("detached", second.data(), second.size(), ONEBIT_FLOAT32), ONEBIT_SUCCESS);
  EXPECT_EQ(TagRegistry::instance().find(second.data()), tag) << "moved, not made anew";
  EXPECT_EQ(onebit_untag(second.data()), ONEBIT_SUCCESS);
}

TEST(TagState, FindSaysWhetherACallWouldBeCompressedAndNamesTheTag) {
  // What the torch backend asks per all_reduce: compressed only with the tag's own count and dtype;
  // the name whatever they are (for its errors), cut to the buffer and always terminated.
  std::vector<float> buffer(32), other(32);
  ASSERT_EQ(onebit_tag("found/momentum", buffer.data(), buffer.size(), ONEBIT_FLOAT32), ONEBIT_SUCCESS);
  int tagged = -1;
  char name[64];
  ASSERT_EQ(onebit_tag_find(buffer.data(), 32, ONEBIT_FLOAT32, &tagged, name, sizeof name), ONEBIT_SUCCESS);
  EXPECT_EQ(tagged, 1);
  EXPECT_STREQ(name, "found/momentum");
  ASSERT_EQ(onebit_tag_find(buffer.data(), 31, ONEBIT_FLOAT32, &tagged, name, sizeof name), ONEBIT_SUCCESS);
  EXPECT_EQ(tagged, 0) << "another count";
  EXPECT_STREQ(name, "found/momentum");
  ASSERT_EQ(onebit_tag_find(buffer.data(), 32, ONEBIT_BFLOAT16, &tagged, name, sizeof name), ONEBIT_SUCCESS);
  EXPECT_EQ(tagged, 0) << "another dtype";
  ASSERT_EQ(onebit_tag_find(other.data(), 32, ONEBIT_FLOAT32, &tagged, name, sizeof name), ONEBIT_SUCCESS);
  EXPECT_EQ(tagged, 0);
  EXPECT_STREQ(name, "");
  char short_name[6];
  ASSERT_EQ(onebit_tag_find(buffer.data(), 32, ONEBIT_FLOAT32, &tagged, short_name, sizeof short_name), ONEBIT_SUCCESS);
  EXPECT_STREQ(short_name, "found");
  ASSERT_EQ(onebit_tag_find(buffer.data(), 32, ONEBIT_FLOAT32, &tagged, nullptr, 0), ONEBIT_SUCCESS);
  EXPECT_EQ(tagged, 1);
  // Bad input is refused alike whether or not anything is tagged there.
  for (void* at : {static_cast<void*>(buffer.data()), static_cast<void*>(other.data())}) {
    EXPECT_EQ(onebit_tag_find(at, 32, static_cast<onebit_dtype_t>(9), &tagged, name, sizeof name),
              ONEBIT_INVALID_ARGUMENT);
  }
  EXPECT_EQ(onebit_tag_find(buffer.data(), 32, ONEBIT_FLOAT32, nullptr, name, sizeof name), ONEBIT_INVALID_ARGUMENT);
  EXPECT_EQ(onebit_tag_find(buffer.data(), 32, ONEBIT_FLOAT32, &tagged, nullptr, 8), ONEBIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(onebit_last_error()).find("name is NULL with name_size 8"), std::string::npos)
      << onebit_last_error();
  ASSERT_EQ(onebit_untag(buffer.data()), ONEBIT_SUCCESS);
}

TEST(TagState, ReTaggingANameWithFewerElementsStartsFromFreshDeviceState) {
  // D1: the NCCL door kept device state by (communicator, FNV of the name), so a name untagged
  // and tagged again with fewer elements reused buffers sized for the old count. Owned by the Tag,
  // the old state goes with the old tag.
  std::vector<float> big(100), small(50);
  ASSERT_EQ(onebit_tag("retag/m", big.data(), big.size(), ONEBIT_FLOAT32), ONEBIT_SUCCESS);
  bool destroyed = false;
  {
    auto tag = TagRegistry::instance().find(big.data());
    ASSERT_NE(tag, nullptr);
    tag->device_states[1] = std::make_unique<FakeDeviceState>(100, 56, &destroyed);
  }
  ASSERT_EQ(onebit_untag(big.data()), ONEBIT_SUCCESS);
  EXPECT_TRUE(destroyed) << "untag frees the device state with the tag";
  ASSERT_EQ(onebit_tag("retag/m", small.data(), small.size(), ONEBIT_FLOAT32), ONEBIT_SUCCESS);
  auto tag = TagRegistry::instance().find(small.data());
  ASSERT_NE(tag, nullptr);
  EXPECT_EQ(tag->count, 50u);
  EXPECT_TRUE(tag->device_states.empty()) << "a re-tagged name must not see the old tag's device state";
  EXPECT_FALSE(tag->has_run());
  ASSERT_EQ(onebit_untag(small.data()), ONEBIT_SUCCESS);
}

TEST(TagState, ForgettingACommunicatorDropsItsDeviceState) {
  std::vector<float> x(8);
  ASSERT_EQ(onebit_tag("forget/m", x.data(), x.size(), ONEBIT_FLOAT32), ONEBIT_SUCCESS);
  bool first = false, second = false;
  auto tag = TagRegistry::instance().find(x.data());
  tag->device_states[7] = std::make_unique<FakeDeviceState>(8, 8, &first);
  tag->device_states[8] = std::make_unique<FakeDeviceState>(8, 8, &second);
  TagRegistry::instance().forget_communicator(7);  // the NCCL door calls this from ncclCommDestroy
  EXPECT_TRUE(first);
  EXPECT_FALSE(second);
  EXPECT_EQ(tag->device_states.count(7), 0u);
  ASSERT_EQ(onebit_untag(x.data()), ONEBIT_SUCCESS);
}

// ncclCommAbort is how PyTorch's watchdog ends a stuck communicator: ending its states must not
// wait on a tag whose call holds the busy lock (it may be the stuck one), nor free device memory
// (which waits for the whole device). An idle tag's state is set aside at once; a tag in a call
// keeps its state until its next use; the next destroy frees what was set aside.
TEST(TagState, AnAbortNeitherWaitsForATagInACallNorFrees) {
  constexpr std::uint64_t kAborted = 0xab0127, kDestroyed = 0xde0127;
  std::vector<float> busy_buffer(8), idle_buffer(8);
  ASSERT_EQ(onebit_tag("abort/busy", busy_buffer.data(), 8, ONEBIT_FLOAT32), ONEBIT_SUCCESS);
  ASSERT_EQ(onebit_tag("abort/idle", idle_buffer.data(), 8, ONEBIT_FLOAT32), ONEBIT_SUCCESS);
  auto busy_tag = TagRegistry::instance().find(busy_buffer.data());
  auto idle_tag = TagRegistry::instance().find(idle_buffer.data());
  bool busy_freed = false, idle_freed = false;
  busy_tag->device_states[kAborted] = std::make_unique<FakeDeviceState>(8, 8, &busy_freed);
  idle_tag->device_states[kAborted] = std::make_unique<FakeDeviceState>(8, 8, &idle_freed);

  std::promise<void> holding, release;
  std::thread call([&] {  // a call in flight on the busy tag
    const std::unique_lock<std::mutex> busy = claim_tag_for_call(*busy_tag, "");
    holding.set_value();
    release.get_future().wait();
  });
  holding.get_future().wait();
  EXPECT_EQ(TagRegistry::instance().forget_communicator(kAborted, TagRegistry::InFlight::kKeep), 1u);
  EXPECT_EQ(idle_tag->device_states.count(kAborted), 0u) << "the idle tag's state is set aside at once";
  EXPECT_FALSE(idle_freed) << "an abort frees nothing";
  release.set_value();
  call.join();
  EXPECT_EQ(busy_tag->device_states.count(kAborted), 1u) << "kept while its call ran";
  { const auto next_use = claim_tag_for_call(*busy_tag, ""); }
  EXPECT_EQ(busy_tag->device_states.count(kAborted), 0u) << "set aside at the tag's next use";
  EXPECT_FALSE(busy_freed);
  TagRegistry::instance().forget_communicator(kDestroyed, TagRegistry::InFlight::kWait);
  EXPECT_TRUE(idle_freed) << "a destroy frees what aborts set aside";
  EXPECT_TRUE(busy_freed);
  EXPECT_EQ(onebit_untag(busy_buffer.data()), ONEBIT_SUCCESS);
  EXPECT_EQ(onebit_untag(idle_buffer.data()), ONEBIT_SUCCESS);
}

// Replays of a captured CUDA graph run on the device without the host: the calls a tag reports
// are the larger of those the host enqueued and those that finished on the device.
TEST(TagState, ReplaysThatFinishedOnTheDeviceCountAsCalls) {
  std::vector<float> x(8);
  ASSERT_EQ(onebit_tag("replays/m", x.data(), x.size(), ONEBIT_FLOAT32), ONEBIT_SUCCESS);
  bool destroyed = false;
  auto tag = TagRegistry::instance().find(x.data());
  auto state = std::make_unique<FakeDeviceState>(8, 8, &destroyed);
  FakeDeviceState* device = state.get();
  tag->device_states[11] = std::move(state);
  tag->calls = 2;         // enqueued by the host: the first call and the one captured
  device->completed = 1;  // the device lags
  std::uint64_t calls = 0, bytes = 0;
  ASSERT_EQ(onebit_tag_stats("replays/m", &calls, &bytes), ONEBIT_SUCCESS);
  EXPECT_EQ(calls, 2u);
  device->completed = 5;  // the captured call replayed three times
  ASSERT_EQ(onebit_tag_stats("replays/m", &calls, &bytes), ONEBIT_SUCCESS);
  EXPECT_EQ(calls, 5u);
  ASSERT_EQ(onebit_untag(x.data()), ONEBIT_SUCCESS);
}

TEST(TagState, ACheckpointOfADeviceTagSavesItsStateNotZeros) {
  // D7: a tag that ran on the GPU path had no host TagState, and onebit_tag_state_save returned
  // success with zeros. It now saves what the device state holds.
  std::vector<float> x(10);
  ASSERT_EQ(onebit_tag("checkpoint/gpu", x.data(), x.size(), ONEBIT_FLOAT32), ONEBIT_SUCCESS);
  // Before it runs, onebit_tag_state_check answers what a load would: its count fits, another not.
  EXPECT_EQ(onebit_tag_state_check("checkpoint/gpu", 10), ONEBIT_SUCCESS);
  EXPECT_EQ(onebit_tag_state_check("checkpoint/gpu", 9), ONEBIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(onebit_last_error()).find("has 10 elements; the saved worker error has 9"), std::string::npos)
      << onebit_last_error();
  bool destroyed = false;
  auto tag = TagRegistry::instance().find(x.data());
  tag->device_states[3] = std::make_unique<FakeDeviceState>(10, 8, &destroyed);
  size_t workers = 0, servers = 0;
  ASSERT_EQ(onebit_tag_state_size("checkpoint/gpu", &workers, &servers), ONEBIT_SUCCESS);
  EXPECT_EQ(workers, 10u);
  EXPECT_EQ(servers, 8u);
  std::vector<float> worker(workers, 9.0f), server(servers, 9.0f);
  ASSERT_EQ(onebit_tag_state_save("checkpoint/gpu", worker.data(), server.data()), ONEBIT_SUCCESS);
  for (std::size_t i = 0; i < workers; ++i) EXPECT_EQ(worker[i], 0.5f + static_cast<float>(i)) << i;
  for (std::size_t i = 0; i < servers; ++i) EXPECT_EQ(server[i], -0.25f - static_cast<float>(i)) << i;
  // A server array is required when the state has a server part.
  EXPECT_EQ(onebit_tag_state_save("checkpoint/gpu", worker.data(), nullptr), ONEBIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(onebit_last_error()).find("server is NULL"), std::string::npos) << onebit_last_error();
  // A state that ran cannot be overwritten by a load, and the check says so first.
  EXPECT_EQ(onebit_tag_state_check("checkpoint/gpu", workers), ONEBIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(onebit_last_error()).find("has already run"), std::string::npos) << onebit_last_error();
  EXPECT_EQ(onebit_tag_state_load("checkpoint/gpu", worker.data(), workers, server.data(), servers),
            ONEBIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(onebit_last_error()).find("has already run"), std::string::npos) << onebit_last_error();
  // Two communicators' states do not fit one checkpoint: a clear error, not one of them.
  tag->device_states[4] = std::make_unique<FakeDeviceState>(10, 8, &destroyed);
  EXPECT_EQ(onebit_tag_state_save("checkpoint/gpu", worker.data(), server.data()), ONEBIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(onebit_last_error()).find("used on 2 communicators"), std::string::npos) << onebit_last_error();
  ASSERT_EQ(onebit_untag(x.data()), ONEBIT_SUCCESS);
}

}  // namespace
}  // namespace onebit
