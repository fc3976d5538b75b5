// The verbs transport, each test twice: on a real RDMA device (InfiniBand, RoCE, or soft-RoCE: rxe,
// siw), which skips naming what is missing where there is none — tools/rdma-check.sh runs them
// where there is one — and on the in-process stand-in adapter of fake_verbs.h, which runs
// everywhere and drives the real transport code above it. Also everywhere: a job asking for the
// verbs transport on a host without a device gets ONEBIT_SYSTEM_ERROR naming it, through the
// engine's own transport selection (this binary runs with ONEBIT_TRANSPORT=ibverbs).
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/aligned_buffer.h"
#include "common/error.h"
#include "engine/communicator.h"
#include "engine/tag_registry.h"
#include "tests/ibverbs/fake_verbs.h"
#include "transport/ibverbs/ibverbs_transport.h"
#include "transport/ibverbs/verbs_api.h"
#include "transport/tcp/socket.h"
#include "transport/tcp/tcp_transport.h"

namespace onebit::transport::ibverbs {
namespace {

// Empty when this host can run the device tests; otherwise what it lacks.
std::string missing_device() {
  std::string why;
  if (!verbs_loadable(&why)) return why;
  int count = 0;
  ibv_device** list = verbs().get_device_list(&count);
  if (list != nullptr) verbs().free_device_list(list);
  if (count == 0) {
    return "no RDMA device: libibverbs lists none (this host has no InfiniBand/RoCE adapter and no soft-RoCE "
           "link; tools/rdma-check.sh runs these tests where there is one)";
  }
  return "";
}

// Each test runs on the device ("device") and on the stand-in ("fake").
class VerbsTransport : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (std::string(GetParam()) == "fake") {
      fake_ = std::make_unique<testing::UseFakeVerbs>();
      return;
    }
    const std::string why = missing_device();
    if (!why.empty()) GTEST_SKIP() << why;
  }
  std::unique_ptr<testing::UseFakeVerbs> fake_;
};

std::string loopback_root() {
  transport::tcp::Fd fd = transport::tcp::listen_on(transport::tcp::parse_host_port("127.0.0.1:0", "test"), 1);
  return "127.0.0.1:" + std::to_string(transport::tcp::local_address(fd.get()).port());
}

VerbsOptions options_with_timeout(int ms) {
  VerbsOptions o;
  o.tcp.timeout = std::chrono::milliseconds(ms);
  o.tcp.ifname = "lo";
  return o;
}

// Runs body(rank, transport) on `world` ranks, one thread each. Each body asserts for itself; an
// error that escapes one is a failure of the test, not of the process.
void run_ranks(int world, const std::function<void(int, IbverbsTransport&)>& body, int timeout_ms = 20000) {
  const std::string root = loopback_root();
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        IbverbsTransport transport(r, world, transport::tcp::parse_host_port(root, "root"),
                                   options_with_timeout(timeout_ms));
        body(r, transport);
      } catch (const Error& error) {
        ADD_FAILURE() << "rank " << r << ": " << error.what();
      }
    });
  }
  for (auto& t : threads) t.join();
}

std::string describe(const Request& r) {
  return std::string(wire::kind_name(r.key.kind)) + " " + std::to_string(r.key.part);
}

TEST(VerbsSelection, WithoutADeviceTheJobFailsNamingWhatIsMissing) {
  if (missing_device().empty()) GTEST_SKIP() << "this host has an RDMA device; the tests below use it";
  CommSetup setup;
  setup.rank = 0;
  setup.size = 2;
  setup.root = loopback_root();
  try {
    Communicator comm(setup);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ONEBIT_SYSTEM_ERROR);
    const std::string text = error.what();
    EXPECT_NE(text.find("ONEBIT_TRANSPORT=ibverbs: "), std::string::npos) << text;
    EXPECT_TRUE(text.find("no RDMA device") != std::string::npos || text.find("libibverbs.so.1") != std::string::npos)
        << text;
  }
  // One rank needs no device and no peer.
  setup.size = 1;
  Communicator alone(setup);
  float x = 3;
  alone.allreduce(&x, 1, kernels::Dtype::kFloat32, ReduceOp::kAvg);
  EXPECT_EQ(x, 3.0f);
}

TEST_P(VerbsTransport, MessagesLandInPlaceWhicheverSideIsPostedFirst) {
  run_ranks(2, [](int rank, IbverbsTransport& t) {
    const int peer = 1 - rank;
    const std::vector<std::size_t> sizes = {0, 4, 4096, 1 << 20, (1 << 20) + 3};
    AlignedBuffer<std::uint8_t> engine_out(2 << 20), engine_in(2 << 20);  // cached registrations
    std::vector<std::uint8_t> user_out(2 << 20), user_in(2 << 20);        // per-message ones
    for (int round = 0; round < 3; ++round) {
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        const std::size_t n = sizes[k];
        const bool engine = (k + round) % 2 == 0;
        std::uint8_t* out = engine ? engine_out.data() : user_out.data();
        std::uint8_t* in = engine ? engine_in.data() : user_in.data();
        for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<std::uint8_t>(i * 7 + rank + round);
        std::memset(in, 0xee, n);
        const wire::MessageKey key{1, static_cast<std::uint64_t>(round), wire::Kind::kRingReduce,
                                   static_cast<std::uint16_t>(k)};
        const wire::CallShape shape{n, 0, 0};
        Request send, receive;
        // Rank 0 sends before it receives, rank 1 the other way round: both orders meet.
        if (rank == 0) t.isend(send, peer, 0, key, shape, out, n);
        t.irecv(receive, peer, 0, key, shape, in, n);
        if (rank == 1) t.isend(send, peer, 0, key, shape, out, n);
        t.wait_all({&send, &receive}, Clock::now() + std::chrono::seconds(20), describe);
        for (std::size_t i = 0; i < n; ++i) {
          ASSERT_EQ(in[i], static_cast<std::uint8_t>(i * 7 + peer + round)) << "size " << n << " at " << i;
        }
      }
    }
    EXPECT_GT(t.stats().bytes_sent, 0u);
  });
}

TEST_P(VerbsTransport, ADisagreementFailsBothRanksAsAMismatch) {
  std::atomic<int> mismatches{0};
  run_ranks(2, [&](int rank, IbverbsTransport& t) {
    std::vector<std::uint8_t> buffer(256);
    const wire::MessageKey key{1, 0, wire::Kind::kWorkerBits, 0};
    Request r;
    if (rank == 0) t.isend(r, 1, 0, key, wire::CallShape{256, 0, 1}, buffer.data(), 256);
    else t.irecv(r, 0, 0, key, wire::CallShape{128, 0, 1}, buffer.data(), 128);
    try {
      t.wait_all({&r}, Clock::now() + std::chrono::seconds(20), describe);
      ADD_FAILURE() << "rank " << rank << ": expected a failure";
    } catch (const Error& error) {
      const std::string text = error.what();
      EXPECT_NE(text.find("disagree on a worker bits message"), std::string::npos) << text;
      if (error.code() == ONEBIT_MISMATCH || text.find("failed and left the job") != std::string::npos) ++mismatches;
    }
  });
  EXPECT_EQ(mismatches.load(), 2);
}

TEST_P(VerbsTransport, AMissingPeerIsATimeoutNamingIt) {
  run_ranks(2, [](int rank, IbverbsTransport& t) {
    if (rank == 1) return;  // posts nothing and leaves
    std::uint8_t byte = 0;
    Request r;
    t.irecv(r, 1, 0, wire::MessageKey{1, 0, wire::Kind::kWorkerHead, 0}, wire::CallShape{1, 0, 1}, &byte, 1);
    try {
      t.wait_all({&r}, Clock::now() + std::chrono::milliseconds(2000), describe);
      ADD_FAILURE() << "expected a failure";
    } catch (const Error& error) {
      // Rank 1 left with this receive outstanding: its set-up socket's end names it at once;
      // a deadline that comes first names it too.
      const std::string text = error.what();
      EXPECT_TRUE(error.code() == ONEBIT_REMOTE_ERROR || error.code() == ONEBIT_TIMEOUT) << text;
      EXPECT_NE(text.find("rank 1"), std::string::npos) << text;
    }
  });
}

TEST_P(VerbsTransport, APeerThatLeavesAfterItsLastMessageIsNotAnError) {
  run_ranks(2, [](int rank, IbverbsTransport& t) {
    std::uint32_t value = rank == 1 ? 42 : 0;
    const wire::MessageKey key{2, 0, wire::Kind::kWorkerHead, 0};
    Request r;
    if (rank == 1) {
      t.isend(r, 0, 0, key, wire::CallShape{1, 0, 1}, &value, 4);
      t.wait_all({&r}, Clock::now() + std::chrono::seconds(20), describe);
      return;  // and leaves: its transport closes
    }
    t.irecv(r, 1, 0, key, wire::CallShape{1, 0, 1}, &value, 4);
    t.wait_all({&r}, Clock::now() + std::chrono::seconds(20), describe);
    EXPECT_EQ(value, 42u);
    // Whether or not rank 1's end has been seen yet, nothing is lost and nothing failed; a later
    // message to it fails, naming it, instead of hanging.
    Request late;
    t.isend(late, 1, 0, wire::MessageKey{2, 1, wire::Kind::kWorkerHead, 0}, wire::CallShape{1, 0, 1}, &value, 4);
    try {
      t.wait_all({&late}, Clock::now() + std::chrono::seconds(5), describe);
      ADD_FAILURE() << "a send to a rank that left cannot complete";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("rank 1"), std::string::npos) << error.what();
    }
  });
}

TEST_P(VerbsTransport, MoreMessagesInFlightThanQueueSlotsAllArrive) {
  // 300 receives posted at once: more offers than control slots (128) and more writes than the
  // send queue (256) holds; the overflow waits in software and goes as completions free room.
  run_ranks(2, [](int rank, IbverbsTransport& t) {
    constexpr int kMessages = 300;
    std::vector<std::uint32_t> out(kMessages), in(kMessages, 0);
    std::vector<Request> requests(2 * kMessages);
    std::vector<Request*> all;
    for (int i = 0; i < kMessages; ++i) {
      out[i] = static_cast<std::uint32_t>(i * 3 + rank);
      const wire::MessageKey key{3, 0, wire::Kind::kServerResult, static_cast<std::uint16_t>(i)};
      t.irecv(requests[i], 1 - rank, 0, key, wire::CallShape{1, 0, 1}, &in[i], 4);
      all.push_back(&requests[i]);
    }
    for (int i = 0; i < kMessages; ++i) {
      const wire::MessageKey key{3, 0, wire::Kind::kServerResult, static_cast<std::uint16_t>(i)};
      t.isend(requests[kMessages + i], 1 - rank, 0, key, wire::CallShape{1, 0, 1}, &out[i], 4);
      all.push_back(&requests[kMessages + i]);
    }
    t.wait_all(all, Clock::now() + std::chrono::seconds(30), describe);
    for (int i = 0; i < kMessages; ++i) ASSERT_EQ(in[i], static_cast<std::uint32_t>(i * 3 + (1 - rank))) << i;
  });
}

// The engine does not see its transport: the compressed allreduce (with its error feedback over
// several calls) and the ring give bit for bit the same results over verbs as over TCP.
TEST_P(VerbsTransport, TheEngineGivesTheSameBitsOverVerbsAsOverTcp) {
  constexpr int kWorld = 3;
  constexpr std::size_t kCount = (1 << 20) + 37;  // several bit blocks per chunk, a ragged tail
  constexpr int kCalls = 3;
  std::vector<std::vector<float>> over_tcp(kWorld), over_verbs(kWorld);
  auto run = [&](bool verbs, std::vector<std::vector<float>>& results) {
    const std::string root = loopback_root();
    std::vector<std::thread> threads;
    for (int r = 0; r < kWorld; ++r) {
      threads.emplace_back([&, r] {
        std::unique_ptr<Transport> transport;
        const transport::tcp::Address address = transport::tcp::parse_host_port(root, "root");
        if (verbs) {
          transport = std::make_unique<IbverbsTransport>(r, kWorld, address, options_with_timeout(60000));
        } else {
          transport =
              std::make_unique<transport::tcp::TcpTransport>(r, kWorld, address, options_with_timeout(60000).tcp);
        }
        Communicator comm(std::move(transport));
        std::vector<float> x(kCount), ring(4096);
        Tag tag;  // each rank's own, not the process-wide registry's: ranks are threads here
        tag.name = "verbs/momentum";
        tag.id = TagRegistry::id_of(tag.name);
        tag.count = kCount;
        tag.ptr = x.data();
        for (int call = 0; call < kCalls; ++call) {
          for (std::size_t i = 0; i < kCount; ++i) {
            x[i] = std::sin(0.001f * static_cast<float>(i * (r + 1) + call)) + 0.01f * static_cast<float>(r);
          }
          comm.compressed_allreduce(tag, x.data(), kCount, kernels::Dtype::kFloat32, ReduceOp::kAvg);
        }
        for (std::size_t i = 0; i < ring.size(); ++i) ring[i] = static_cast<float>((i * 7 + r * 13) % 1000);
        comm.ring_allreduce(ring.data(), ring.size(), kernels::Dtype::kFloat32, ReduceOp::kSum);
        for (std::size_t i = 0; i < ring.size(); ++i) {
          float exact = 0;
          for (int q = 0; q < kWorld; ++q) exact += static_cast<float>((i * 7 + q * 13) % 1000);
          ASSERT_EQ(ring[i], exact) << "ring, rank " << r << " at " << i;
        }
        results[r] = std::move(x);
      });
    }
    for (auto& t : threads) t.join();
  };
  run(false, over_tcp);
  run(true, over_verbs);
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_EQ(over_verbs[r].size(), kCount);
    EXPECT_EQ(std::memcmp(over_verbs[r].data(), over_tcp[r].data(), kCount * sizeof(float)), 0) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(OnDeviceAndStandIn, VerbsTransport, ::testing::Values("device", "fake"),
                         [](const ::testing::TestParamInfo<const char*>& info) { return std::string(info.param); });

}  // namespace
}  // namespace onebit::transport::ibverbs
