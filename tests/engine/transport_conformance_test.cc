// The transport contract (transport/transport.h), checked clause by clause on every backend the
// build has: TCP (transport/tcp), the verbs transport over the in-process stand-in adapter
// (tests/ibverbs/fake_verbs.h; the transport code above it is the real one) and Gloo
// (transport/gloo over a real gloo::Context from libgloo, connected through an in-process store).
// Ranks are threads of this process on real loopback sockets; each rank joins its own transport.
// A test never sleeps to order ranks: they meet at a barrier. Every wait has a deadline, so a
// backend that breaks a clause fails the test instead of hanging it.
#include <gtest/gtest.h>

#include <barrier>
#include <cstring>
#include <functional>
#include <latch>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "transport/tcp/socket.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/transport.h"

#ifdef ONEBIT_HAVE_IBVERBS
#include "tests/ibverbs/fake_verbs.h"
#include "transport/ibverbs/ibverbs_transport.h"
#endif
#ifdef ONEBIT_HAVE_GLOO
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/transport/tcp/device.h>

#include "transport/gloo/gloo_transport.h"
#endif

namespace onebit::testing {
namespace {

// Long enough never to be reached by a working backend on loopback; the deadline that ends a
// wait for a message that cannot come, so that a broken clause fails rather than hangs.
constexpr std::chrono::milliseconds kTransportTimeout{30000};

// Joins rank `rank` of one job: its transport, which owns whatever it runs over.
using JoinRank = std::function<std::shared_ptr<Transport>(int rank)>;

// One backend under test, and where it differs from the others as transport.h allows.
struct Backend {
  std::string name;
  // Whether Transport::abort fails a pending wait. transport.h lets a backend that cannot
  // interrupt its waits (gloo) leave abort a no-op.
  bool abort_interrupts_waits = true;
  // Whether the backend carries each message's shape and compares it with the receive's. Gloo's
  // unbound buffers carry bytes only: GlooTransport cannot see a disagreement on the shape.
  bool compares_shapes = true;
  // Sets up a job of `world` ranks (a root address, a store) and says how each rank joins it.
  std::function<JoinRank(int world)> start_job;
};

// Test names and messages show the backend's name, not its bytes.
void PrintTo(const Backend& backend, std::ostream* out) { *out << backend.name; }

std::string loopback_root() {
  transport::tcp::Fd fd = transport::tcp::listen_on(transport::tcp::parse_host_port("127.0.0.1:0", "test"), 1);
  return "127.0.0.1:" + std::to_string(transport::tcp::local_address(fd.get()).port());
}

transport::tcp::TransportOptions loopback_options() {
  transport::tcp::TransportOptions options;
  options.timeout = kTransportTimeout;
  options.ifname = "lo";
  return options;
}

Backend tcp_backend() {
  return Backend{"tcp", true, true, [](int world) -> JoinRank {
                   const transport::tcp::Address root = transport::tcp::parse_host_port(loopback_root(), "root");
                   return [=](int rank) {
                     return std::make_shared<transport::tcp::TcpTransport>(rank, world, root, loopback_options());
                   };
                 }};
}

#ifdef ONEBIT_HAVE_IBVERBS
Backend verbs_stand_in_backend() {
  return Backend{"ibverbs_stand_in", true, true, [](int world) -> JoinRank {
                   const transport::tcp::Address root = transport::tcp::parse_host_port(loopback_root(), "root");
                   // verbs() is the stand-in for as long as some rank's join function lives.
                   auto stand_in = std::make_shared<transport::ibverbs::testing::UseFakeVerbs>();
                   return [=](int rank) {
                     transport::ibverbs::VerbsOptions options;
                     options.tcp = loopback_options();
                     options.tcp.transport = wire::kTransportIbverbs;
                     (void)stand_in;
                     return std::make_shared<transport::ibverbs::IbverbsTransport>(rank, world, root, options);
                   };
                 }};
}
#endif

#ifdef ONEBIT_HAVE_GLOO
// A rank's gloo context and the transport over its pairs; the transport goes first.
struct GlooRank {
  std::shared_ptr<gloo::rendezvous::Context> context;
  std::unique_ptr<transport::gloo::GlooTransport> transport;
};

Backend gloo_backend() {
  return Backend{"gloo", false, false, [](int world) -> JoinRank {
                   auto store = std::make_shared<gloo::rendezvous::HashStore>();
                   return [=](int rank) {
                     auto joined = std::make_shared<GlooRank>();
                     gloo::transport::tcp::attr attr;
                     attr.hostname = "127.0.0.1";
                     joined->context = std::make_shared<gloo::rendezvous::Context>(rank, world);
                     joined->context->setTimeout(kTransportTimeout);
                     std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
                     joined->context->connectFullMesh(*store, device);
                     joined->transport = std::make_unique<transport::gloo::GlooTransport>(joined->context.get());
                     return std::shared_ptr<Transport>(joined, joined->transport.get());
                   };
                 }};
}
#endif

std::vector<Backend> every_backend() {
  std::vector<Backend> backends = {tcp_backend()};
#ifdef ONEBIT_HAVE_IBVERBS
  backends.push_back(verbs_stand_in_backend());
#endif
#ifdef ONEBIT_HAVE_GLOO
  backends.push_back(gloo_backend());
#endif
  return backends;
}

// What one rank does, given its transport (which it may drop, to leave the job) and the barrier
// every rank of the job meets at.
using RankBody = std::function<void(int rank, std::shared_ptr<Transport>& transport, std::barrier<>& ranks)>;

class TransportContract : public ::testing::TestWithParam<Backend> {
 protected:
  // Runs `body` on `world` ranks, one thread each, after all have joined; they leave together. A
  // rank whose join or body throws is a failure of the test. A rank leaves the barrier when its
  // body ends, however it ends (an ASSERT returns early), so that no other rank waits at it for
  // a rank that will not come; the transports go only once every body has ended.
  void run_ranks(int world, const RankBody& body) {
    const JoinRank join = GetParam().start_job(world);
    std::barrier<> ranks(world);
    std::latch bodies_ended(world);
    std::vector<std::thread> threads;
    for (int rank = 0; rank < world; ++rank) {
      threads.emplace_back([&, rank] {
        std::shared_ptr<Transport> transport;
        try {
          transport = join(rank);
          ranks.arrive_and_wait();  // every rank has joined
          body(rank, transport, ranks);
        } catch (const std::exception& error) {
          ADD_FAILURE() << GetParam().name << " rank " << rank << ": " << error.what();
        }
        ranks.arrive_and_drop();
        bodies_ended.arrive_and_wait();
      });
    }
    for (auto& thread : threads) thread.join();
  }
};

std::string describe(const Request& request) {
  return std::string("test ") + wire::kind_name(request.key.kind) + " message, call " + std::to_string(request.key.seq);
}

Deadline far_deadline() { return Clock::now() + kTransportTimeout; }

// The error a step ended with, if any. A backend may fail a request where it is posted (gloo
// throws from isend/irecv) or at its wait (tcp, verbs): to the contract both are the failure.
std::optional<Error> failure_of(const std::function<void()>& step) {
  try {
    step();
  } catch (const Error& error) {
    return error;
  }
  return std::nullopt;
}

// Bytes that say which rank sent them, in which round: a misplaced or torn message shows.
std::vector<std::uint8_t> pattern(std::size_t bytes, int sender, int round) {
  std::vector<std::uint8_t> out(bytes);
  for (std::size_t i = 0; i < bytes; ++i) out[i] = static_cast<std::uint8_t>(i * 7 + sender * 31 + round);
  return out;
}

// A receive from `peer` of one message that never comes, waited for until `deadline`.
std::optional<Error> failure_of_receive(Transport& transport, int peer, const wire::MessageKey& key,
                                        Deadline deadline) {
  std::uint32_t word = 0;
  Request receive;
  return failure_of([&] {
    transport.irecv(receive, peer, 0, key, wire::CallShape{1, 0, 1}, &word, sizeof(word));
    transport.wait_all({&receive}, deadline, describe);
  });
}

void expect_error(const std::optional<Error>& error, onebit_result_t code, std::initializer_list<std::string> says) {
  ASSERT_TRUE(error.has_value()) << "expected an error";
  EXPECT_EQ(error->code(), code) << error->what();
  for (const std::string& text : says)
    EXPECT_NE(std::string(error->what()).find(text), std::string::npos) << error->what();
}

// "Receives may be posted before or after the matching send": each message lands whole, in the
// receive's buffer, at every size from empty to one striped over TCP's sockets. The ranks meet
// between posting the first side and the second, so both orders really happen. Each round reuses
// the keys of the last: a key is free again once its message has been received.
TEST_P(TransportContract, MessagesLandInPlaceWhicheverSideIsPostedFirst) {
  run_ranks(2, [](int rank, std::shared_ptr<Transport>& t, std::barrier<>& ranks) {
    const int peer = 1 - rank;
    const std::vector<std::size_t> sizes = {0, 1, 4096, (1 << 20) + 3};
    std::uint64_t payload_sent = 0;
    for (int round = 0; round < 2; ++round) {
      const bool receive_first = (rank == round);
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        const std::vector<std::uint8_t> out = pattern(sizes[k], rank, round);
        std::vector<std::uint8_t> in(sizes[k], 0xee);
        const wire::MessageKey key{1, 0, wire::Kind::kRingReduce, static_cast<std::uint16_t>(k)};
        const wire::CallShape shape{sizes[k], 0, 0};
        Request send, receive;
        const std::function<void()> post_receive = [&] {
          t->irecv(receive, peer, 0, key, shape, in.data(), in.size());
        };
        const std::function<void()> post_send = [&] { t->isend(send, peer, 0, key, shape, out.data(), out.size()); };
        (receive_first ? post_receive : post_send)();
        ranks.arrive_and_wait();  // one rank's receive, the other's send, is posted before its peer's
        (receive_first ? post_send : post_receive)();
        t->wait_all({&send, &receive}, far_deadline(), describe);
        ASSERT_TRUE(in == pattern(sizes[k], peer, round)) << sizes[k] << " bytes, round " << round;
        payload_sent += sizes[k];
        ranks.arrive_and_wait();  // both have their message: the keys may be used again
      }
    }
    // transport.h: what was sent counts, "payload and the backend's own headers, as far as it knows".
    EXPECT_GE(t->stats().bytes_sent, payload_sent);
  });
}

// "Messages with the same match are delivered in the order they were posted", and a message is
// matched by its peer too: ranks 1 and 2 each send rank 0 a run of messages on one (channel, kind,
// part), one per call as successive engine calls do, all before rank 0 posts a receive. Rank 0
// receives them in posting order and each receive gets its own message, of its own size.
TEST_P(TransportContract, MessagesOfOneMatchArriveInPostingOrderAndSizesAsPromised) {
  constexpr int kCalls = 6;
  auto bytes_of = [](int call) { return static_cast<std::size_t>(4 * call + 1); };
  run_ranks(3, [&](int rank, std::shared_ptr<Transport>& t, std::barrier<>& ranks) {
    std::vector<std::vector<std::uint8_t>> messages(2 * kCalls);
    std::vector<Request> requests(2 * kCalls);
    std::vector<Request*> all;
    for (int i = 0; i < (rank == 0 ? 2 * kCalls : kCalls); ++i) {
      const int call = i % kCalls;
      const int sender = rank == 0 ? 1 + i / kCalls : rank;
      const wire::MessageKey key{5, static_cast<std::uint64_t>(call), wire::Kind::kServerResult, 0};
      const wire::CallShape shape{bytes_of(call), 0, 0};
      if (rank == 0) {
        if (i == 0) ranks.arrive_and_wait();  // every send is posted before the first receive
        messages[i].assign(bytes_of(call), 0xee);
        t->irecv(requests[i], sender, 0, key, shape, messages[i].data(), messages[i].size());
      } else {
        messages[i] = pattern(bytes_of(call), sender, call);
        t->isend(requests[i], 0, 0, key, shape, messages[i].data(), messages[i].size());
        if (i == kCalls - 1) ranks.arrive_and_wait();
      }
      all.push_back(&requests[i]);
    }
    t->wait_all(all, far_deadline(), describe);
    if (rank != 0) return;
    for (int i = 0; i < 2 * kCalls; ++i) {
      EXPECT_EQ(messages[i], pattern(bytes_of(i % kCalls), 1 + i / kCalls, i % kCalls))
          << "call " << i % kCalls << " from rank " << 1 + i / kCalls;
    }
  });
}

// "A second receive posted for a key whose first is still pending breaks the transport with
// ONEBIT_INTERNAL_ERROR naming the key — never a silent replacement that leaves the first
// waiting." Rank 1 sends nothing and stays until rank 0 has seen the refusal, so that nothing
// but the second receive can break rank 0's transport.
TEST_P(TransportContract, ASecondReceiveForOnePendingKeyBreaksTheTransportNamingIt) {
  run_ranks(2, [](int rank, std::shared_ptr<Transport>& t, std::barrier<>& ranks) {
    if (rank == 0) {
      std::vector<float> first(4), second(4);
      const wire::MessageKey key{7, 3, wire::Kind::kServerResult, 1};
      const wire::CallShape shape{4, 0, 0};
      Request a, b;
      const std::optional<Error> error = failure_of([&] {
        t->irecv(a, 1, 0, key, shape, first.data(), sizeof(float) * 4);
        t->irecv(b, 1, 0, key, shape, second.data(), sizeof(float) * 4);
        t->wait_all({&a, &b}, far_deadline(), describe);
      });
      expect_error(error, ONEBIT_INTERNAL_ERROR,
                   {"rank 0 posted a second receive from rank 1 for one server result message",
                    "(stream 7, call 3, part 1)", "while the first is pending"});
    }
    ranks.arrive_and_wait();
  });
}

// "Any failure (a peer gone ...) breaks the transport: wait_all throws an onebit::Error naming the
// peer." Rank 1 leaves (destroys its transport) while rank 0 waits for a message from it: rank 0's
// wait ends with ONEBIT_REMOTE_ERROR naming rank 1 — from the peer's leaving, not the deadline.
TEST_P(TransportContract, APeerThatLeavesFailsAPendingReceiveNamingIt) {
  run_ranks(2, [](int rank, std::shared_ptr<Transport>& t, std::barrier<>& ranks) {
    if (rank == 1) {
      ranks.arrive_and_wait();  // rank 0 has posted its receive
      t.reset();
      return;
    }
    std::uint32_t word = 0;
    Request receive;
    const std::optional<Error> error = failure_of([&] {
      t->irecv(receive, 1, 0, wire::MessageKey{2, 0, wire::Kind::kWorkerHead, 0}, wire::CallShape{1, 0, 1}, &word,
               sizeof(word));
      ranks.arrive_and_wait();
      t->wait_all({&receive}, far_deadline(), describe);
    });
    expect_error(error, ONEBIT_REMOTE_ERROR, {"rank 1"});
  });
}

// "... or ONEBIT_TIMEOUT (naming the peer ...) at the deadline; either breaks the transport", and
// "the backend tells its peers": rank 1 is alive but sends nothing; rank 0's wait ends at its
// deadline naming rank 1, and rank 1, told, fails its own next wait long before its deadline
// could (not ONEBIT_TIMEOUT).
TEST_P(TransportContract, AStalledPeerIsATimeoutNamingItAndThePeerIsTold) {
  run_ranks(2, [](int rank, std::shared_ptr<Transport>& t, std::barrier<>& ranks) {
    const wire::MessageKey key{3, 0, wire::Kind::kWorkerBits, 0};
    if (rank == 0) {
      const auto soon = Clock::now() + std::chrono::milliseconds(300);
      expect_error(failure_of_receive(*t, 1, key, soon), ONEBIT_TIMEOUT, {"rank 1"});
    }
    ranks.arrive_and_wait();  // rank 0's transport is broken
    if (rank == 1) {
      const std::optional<Error> error = failure_of_receive(*t, 0, key, far_deadline());
      ASSERT_TRUE(error.has_value()) << "rank 1's receive from a broken rank 0 completed";
      EXPECT_NE(error->code(), ONEBIT_TIMEOUT) << error->what();
      EXPECT_NE(std::string(error->what()).find("rank 0"), std::string::npos) << error->what();
    }
  });
}

// "Every later request fails with the first error": once broken (here by a deadline), every send
// and receive, posted later and of any kind, fails with the first failure's code and text, and a
// later misuse does not replace it.
TEST_P(TransportContract, ABrokenTransportFailsEveryLaterRequestWithTheFirstError) {
  run_ranks(2, [](int rank, std::shared_ptr<Transport>& t, std::barrier<>& ranks) {
    if (rank == 0) {
      const wire::MessageKey key{4, 0, wire::Kind::kWorkerBits, 0};
      const std::optional<Error> first = failure_of_receive(*t, 1, key, Clock::now() + std::chrono::milliseconds(300));
      ASSERT_TRUE(first.has_value());
      std::uint32_t word = 1;
      Request send, again_a, again_b;
      const std::vector<std::optional<Error>> later = {
          failure_of([&] {
            t->isend(send, 1, 0, wire::MessageKey{4, 1, wire::Kind::kServerResult, 0}, wire::CallShape{1, 0, 1}, &word,
                     sizeof(word));
            t->wait_all({&send}, far_deadline(), describe);
          }),
          failure_of_receive(*t, 1, wire::MessageKey{4, 2, wire::Kind::kRingGather, 3}, far_deadline()),
          failure_of([&] {  // would be a second receive for one key, were the transport not broken already
            t->irecv(again_a, 1, 0, key, wire::CallShape{1, 0, 1}, &word, sizeof(word));
            t->irecv(again_b, 1, 0, key, wire::CallShape{1, 0, 1}, &word, sizeof(word));
            t->wait_all({&again_a, &again_b}, far_deadline(), describe);
          })};
      for (const std::optional<Error>& error : later) {
        expect_error(error, first->code(), {first->what()});
      }
    }
    ranks.arrive_and_wait();
  });
}

// Transport::abort: "every pending and later request fails with `code` and `why`, and peers are
// told", from another thread while a wait runs (onebit_comm_destroy during a call). Whether the
// abort lands before or during the wait, the wait fails with the abort's code and reason.
TEST_P(TransportContract, AbortFromAnotherThreadFailsThePendingWaitWithItsCodeAndReason) {
  if (!GetParam().abort_interrupts_waits) {
    GTEST_SKIP() << GetParam().name
                 << " cannot interrupt its waits: abort is a no-op there (transport.h), and a "
                    "call ends at its own deadline";
  }
  const std::string why = "the communicator was destroyed while this call ran";
  run_ranks(2, [&](int rank, std::shared_ptr<Transport>& t, std::barrier<>& ranks) {
    const wire::MessageKey key{6, 0, wire::Kind::kHostReduce, 0};
    if (rank == 0) {
      std::thread destroyer([&] { t->abort(ONEBIT_INVALID_ARGUMENT, why); });
      const std::optional<Error> error = failure_of_receive(*t, 1, key, far_deadline());
      destroyer.join();
      expect_error(error, ONEBIT_INVALID_ARGUMENT, {why});
      expect_error(failure_of_receive(*t, 1, key, far_deadline()), ONEBIT_INVALID_ARGUMENT, {why});
    }
    ranks.arrive_and_wait();  // rank 0 has aborted
    if (rank == 1) {
      const std::optional<Error> error = failure_of_receive(*t, 0, key, far_deadline());
      ASSERT_TRUE(error.has_value()) << "rank 1's receive from an aborted rank 0 completed";
      EXPECT_NE(error->code(), ONEBIT_TIMEOUT) << error->what();
    }
  });
}

// "Any failure (... a mismatch ...)": ranks that disagree on a message's shape fail as
// ONEBIT_MISMATCH naming the message's kind, on the rank that sees it; neither hangs.
TEST_P(TransportContract, ADisagreementOnAMessageIsAMismatchNamingIt) {
  if (!GetParam().compares_shapes) {
    GTEST_SKIP() << GetParam().name
                 << " carries bytes only, not the call's shape: it cannot see a disagreement "
                    "(the Gloo door's calls agree through gloo's own tag)";
  }
  std::vector<std::optional<Error>> errors(2);
  run_ranks(2, [&](int rank, std::shared_ptr<Transport>& t, std::barrier<>&) {
    std::vector<std::uint8_t> buffer(256);
    const wire::MessageKey key{8, 0, wire::Kind::kWorkerBits, 0};
    Request request;
    errors[rank] = failure_of([&] {
      if (rank == 0) t->isend(request, 1, 0, key, wire::CallShape{256, 0, 1}, buffer.data(), 256);
      if (rank == 1) t->irecv(request, 0, 0, key, wire::CallShape{128, 0, 1}, buffer.data(), 128);
      t->wait_all({&request}, far_deadline(), describe);
    });
  });
  int mismatches = 0;
  for (const std::optional<Error>& error : errors) {
    if (!error) continue;  // a TCP send may complete before its receiver looks at it
    EXPECT_NE(std::string(error->what()).find("disagree on a worker bits message"), std::string::npos) << error->what();
    mismatches += error->code() == ONEBIT_MISMATCH;
  }
  EXPECT_GE(mismatches, 1);
}

INSTANTIATE_TEST_SUITE_P(EveryTransport, TransportContract, ::testing::ValuesIn(every_backend()),
                         [](const ::testing::TestParamInfo<Backend>& info) { return info.param.name; });

}  // namespace
}  // namespace onebit::testing
