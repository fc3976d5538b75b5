// The verbs transport's logic that needs no RDMA device (transport/ibverbs): its wire records, the
// choice of device, port and GID, the queue-pair attributes, the registration cache and the
// rendezvous matching. What needs a device is in tests/ibverbs/ and skips without one.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "common/aligned_buffer.h"
#include "common/error.h"
#include "transport/ibverbs/registration_cache.h"
#include "transport/ibverbs/rendezvous.h"
#include "transport/ibverbs/setup.h"

namespace onebit::transport::ibverbs {
namespace {

template <typename F>
std::string error_of(F&& f, onebit_result_t expected) {
  try {
    f();
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), expected) << error.what();
    return error.what();
  }
  ADD_FAILURE() << "expected an error";
  return "";
}

TEST(VerbsWire, EndpointRoundTripsFieldByField) {
  wire::VerbsEndpoint e;
  e.link_layer = IBV_LINK_LAYER_ETHERNET;
  e.mtu = IBV_MTU_4096;
  e.qp_num = 0x123456;
  e.psn = 0xabcdef;
  e.lid = 7;
  for (int i = 0; i < 16; ++i) e.gid[i] = static_cast<std::uint8_t>(i * 17);
  e.job_id = 0x0102030405060708ull;
  e.from_rank = 3;
  const auto bytes = e.encode();
  EXPECT_EQ(bytes[0], 0x31);   // little-endian magic "OBV1"
  EXPECT_EQ(bytes[12], 0xef);  // psn, low byte first
  const wire::VerbsEndpoint d = wire::VerbsEndpoint::decode(bytes.data(), "rank 3");
  EXPECT_EQ(d.link_layer, e.link_layer);
  EXPECT_EQ(d.mtu, e.mtu);
  EXPECT_EQ(d.qp_num, e.qp_num);
  EXPECT_EQ(d.psn, e.psn);
  EXPECT_EQ(d.lid, e.lid);
  EXPECT_EQ(d.gid, e.gid);
  EXPECT_EQ(d.job_id, e.job_id);
  EXPECT_EQ(d.from_rank, e.from_rank);
}

TEST(VerbsWire, BadEndpointsNameTheSenderAndTheField) {
  wire::VerbsEndpoint e;
  e.link_layer = 1;
  e.mtu = 3;
  auto bytes = e.encode();
  bytes[0] ^= 0xff;
  EXPECT_NE(error_of([&] { wire::VerbsEndpoint::decode(bytes.data(), "rank 5"); }, ONEBIT_REMOTE_ERROR).find("rank 5"),
            std::string::npos);
  e.mtu = 9;
  bytes = e.encode();
  EXPECT_NE(error_of([&] { wire::VerbsEndpoint::decode(bytes.data(), "rank 5"); }, ONEBIT_REMOTE_ERROR)
                .find("rank 5 sent a verbs endpoint with MTU code 9"),
            std::string::npos);
  e.mtu = 3;
  e.link_layer = 0;
  bytes = e.encode();
  EXPECT_NE(
      error_of([&] { wire::VerbsEndpoint::decode(bytes.data(), "rank 5"); }, ONEBIT_REMOTE_ERROR).find("link layer 0"),
      std::string::npos);
}

TEST(VerbsWire, ClearToSendRoundTrips) {
  wire::ClearToSend c;
  c.key = wire::MessageKey{9, 41, wire::Kind::kServerResult, 300};
  c.shape = wire::CallShape{1u << 20, 2, 1};
  c.bytes = 131072;
  c.address = 0x7f0012345678ull;
  c.rkey = 0xdeadbeef;
  c.recv_id = 77;
  const auto bytes = c.encode();
  const wire::ClearToSend d = wire::ClearToSend::decode(bytes.data(), "rank 1");
  EXPECT_TRUE(d.key == c.key);
  EXPECT_TRUE(d.shape == c.shape);
  EXPECT_EQ(d.bytes, c.bytes);
  EXPECT_EQ(d.address, c.address);
  EXPECT_EQ(d.rkey, c.rkey);
  EXPECT_EQ(d.recv_id, c.recv_id);
  auto bad = bytes;
  bad[4] = 42;  // kind
  EXPECT_NE(
      error_of([&] { wire::ClearToSend::decode(bad.data(), "rank 1"); }, ONEBIT_REMOTE_ERROR).find("unknown kind 42"),
      std::string::npos);
}

TEST(VerbsSetup, HcaSpecsAsNcclNamesOneDevice) {
  EXPECT_EQ(parse_hca("").device, "");
  EXPECT_EQ(parse_hca("").port, 0);
  EXPECT_EQ(parse_hca("mlx5_0").device, "mlx5_0");
  EXPECT_EQ(parse_hca("mlx5_0").port, 0);
  EXPECT_EQ(parse_hca("rxe0:2").device, "rxe0");
  EXPECT_EQ(parse_hca("rxe0:2").port, 2);
  EXPECT_NE(error_of([] { parse_hca("mlx5_0,mlx5_1"); }, ONEBIT_INVALID_ARGUMENT).find("name one device"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_hca("^mlx5_0"); }, ONEBIT_INVALID_ARGUMENT).find("ONEBIT_IB_HCA='^mlx5_0'"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_hca("mlx5_0:x"); }, ONEBIT_INVALID_ARGUMENT).find("port in 1..255"), std::string::npos);
  EXPECT_NE(error_of([] { parse_hca("mlx5_0:0"); }, ONEBIT_INVALID_ARGUMENT).find("port in 1..255"), std::string::npos);
  EXPECT_NE(error_of([] { parse_hca(":1"); }, ONEBIT_INVALID_ARGUMENT).find("device:port"), std::string::npos);
}

// A port directory as sysfs lays it out: gids/<i> and gid_attrs/types/<i>.
class FakePort {
 public:
  FakePort() {
    char dir[] = "/tmp/onebit-gids-XXXXXX";
    root_ = ::mkdtemp(dir);
    ::mkdir((root_ + "/gids").c_str(), 0700);
    ::mkdir((root_ + "/gid_attrs").c_str(), 0700);
    ::mkdir((root_ + "/gid_attrs/types").c_str(), 0700);
  }
  ~FakePort() { [[maybe_unused]] int rc = std::system(("rm -rf '" + root_ + "'").c_str()); }
  void add(int index, const std::string& gid, const std::string& type) {
    std::ofstream(root_ + "/gids/" + std::to_string(index)) << gid << "\n";
    if (!type.empty()) std::ofstream(root_ + "/gid_attrs/types/" + std::to_string(index)) << type << "\n";
  }
  const std::string& dir() const { return root_; }

 private:
  std::string root_;
};

TEST(VerbsSetup, GidTableSkipsUnusedEntriesAndReadsTypes) {
  FakePort port;
  port.add(0, "fe80:0000:0000:0000:5054:00ff:fe12:3456", "IB/RoCE v1");
  port.add(1, "0000:0000:0000:0000:0000:0000:0000:0000", "");
  port.add(2, "0000:0000:0000:0000:0000:ffff:0a00:0001", "RoCE v2");
  const std::vector<GidEntry> table = read_gid_table(port.dir());
  ASSERT_EQ(table.size(), 2u);
  EXPECT_EQ(table[0].index, 0);
  EXPECT_EQ(table[0].type, "IB/RoCE v1");
  EXPECT_EQ(table[1].index, 2);
  EXPECT_EQ(table[1].type, "RoCE v2");
  EXPECT_EQ(gid_text(table[1].gid), "::ffff:10.0.0.1");
  EXPECT_TRUE(read_gid_table(port.dir() + "/missing").empty());
}

TEST(VerbsSetup, GidChoicePrefersRoceV2WithIpv4ThenRoceV2ThenAny) {
  auto entry = [](int index, const std::string& text, const std::string& type) {
    GidEntry e;
    e.index = index;
    in6_addr a{};
    EXPECT_EQ(::inet_pton(AF_INET6, text.c_str(), &a), 1);
    std::copy(a.s6_addr, a.s6_addr + 16, e.gid.begin());
    e.type = type;
    return e;
  };
  const GidEntry v1_link = entry(0, "fe80::1", "IB/RoCE v1");
  const GidEntry v2_link = entry(1, "fe80::1", "RoCE v2");
  const GidEntry v1_ipv4 = entry(2, "::ffff:10.0.0.1", "IB/RoCE v1");
  const GidEntry v2_ipv4 = entry(3, "::ffff:10.0.0.1", "RoCE v2");
  EXPECT_EQ(choose_gid_index({v1_link, v2_link, v1_ipv4, v2_ipv4}), 3);
  EXPECT_EQ(choose_gid_index({v1_link, v2_link, v1_ipv4}), 1);
  EXPECT_EQ(choose_gid_index({v1_ipv4, v1_link}), 2);
  EXPECT_EQ(choose_gid_index({}), -1);
}

TEST(VerbsSetup, QueuePairAttributesRouteByGidOnRoceAndByLidOnInfiniband) {
  wire::VerbsEndpoint remote;
  remote.link_layer = IBV_LINK_LAYER_ETHERNET;
  remote.mtu = IBV_MTU_4096;
  remote.qp_num = 99;
  remote.psn = 1234;
  remote.lid = 0;
  remote.gid[15] = 5;
  LocalPort local;
  local.port = 2;
  local.active_mtu = IBV_MTU_1024;
  local.gid_index = 3;
  int mask = 0;
  ibv_qp_attr rtr = ready_to_receive(local, remote, &mask);
  EXPECT_EQ(rtr.qp_state, IBV_QPS_RTR);
  EXPECT_EQ(rtr.path_mtu, IBV_MTU_1024);  // the smaller of the two
  EXPECT_EQ(rtr.dest_qp_num, 99u);
  EXPECT_EQ(rtr.rq_psn, 1234u);
  EXPECT_EQ(rtr.ah_attr.port_num, 2);
  EXPECT_EQ(rtr.ah_attr.is_global, 1);
  EXPECT_EQ(rtr.ah_attr.grh.sgid_index, 3);
  EXPECT_EQ(rtr.ah_attr.grh.dgid.raw[15], 5);
  EXPECT_EQ(mask & (IBV_QP_AV | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_PATH_MTU),
            IBV_QP_AV | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_PATH_MTU);

  remote.link_layer = IBV_LINK_LAYER_INFINIBAND;
  remote.lid = 17;
  remote.mtu = IBV_MTU_2048;
  local.gid_index = -1;
  local.active_mtu = IBV_MTU_4096;
  rtr = ready_to_receive(local, remote, &mask);
  EXPECT_EQ(rtr.ah_attr.is_global, 0);
  EXPECT_EQ(rtr.ah_attr.dlid, 17);
  EXPECT_EQ(rtr.path_mtu, IBV_MTU_2048);

  const ibv_qp_attr rts = ready_to_send(4321, 18, &mask);
  EXPECT_EQ(rts.qp_state, IBV_QPS_RTS);
  EXPECT_EQ(rts.sq_psn, 4321u);
  EXPECT_EQ(rts.timeout, 18);
  EXPECT_EQ(rts.retry_cnt, 7);
  EXPECT_EQ(rts.rnr_retry, 7);
  EXPECT_NE(mask & IBV_QP_TIMEOUT, 0);
}

// Records what the cache asks of a device.
class FakeRegistrar final : public Registrar {
 public:
  Registration register_memory(void* begin, std::size_t bytes) override {
    registered.push_back({begin, bytes});
    ++live;
    return Registration{next_key, next_key + 1000, reinterpret_cast<void*>(static_cast<std::uintptr_t>(next_key++))};
  }
  void deregister(const Registration& r) noexcept override {
    deregistered.push_back(r.lkey);
    --live;
  }
  std::vector<std::pair<void*, std::size_t>> registered;
  std::vector<std::uint32_t> deregistered;
  int live = 0;
  std::uint32_t next_key = 1;
};

TEST(RegistrationCache, EngineBuffersAreRegisteredOnceWholeUntilReleased) {
  FakeRegistrar device;
  RegistrationCache cache(device);
  {
    AlignedBuffer<float> state(1 << 16);
    const auto first = cache.acquire(state.data() + 100, 4096);
    const auto second = cache.acquire(state.data() + 20000, 8192);
    EXPECT_TRUE(first.cached);
    EXPECT_EQ(first.registration.lkey, second.registration.lkey);
    ASSERT_EQ(device.registered.size(), 1u);
    EXPECT_EQ(device.registered[0].first, state.data());  // the whole buffer, from its start
    EXPECT_GE(device.registered[0].second, (1u << 16) * sizeof(float));
    cache.release(first);
    cache.release(second);
    EXPECT_EQ(device.live, 1);  // still cached
    EXPECT_EQ(cache.stats().hits, 1u);
    EXPECT_EQ(cache.cached_buffers(), 1u);
  }
  // The buffer's release deregistered it before its memory went back to the allocator.
  EXPECT_EQ(device.live, 0);
  EXPECT_EQ(cache.cached_buffers(), 0u);
}

TEST(RegistrationCache, OtherMemoryIsRegisteredPerMessage) {
  FakeRegistrar device;
  RegistrationCache cache(device);
  std::vector<float> tensor(4096);
  const auto lease = cache.acquire(tensor.data(), tensor.size() * sizeof(float));
  EXPECT_FALSE(lease.cached);
  EXPECT_EQ(device.live, 1);
  cache.release(lease);
  EXPECT_EQ(device.live, 0);
  EXPECT_EQ(cache.stats().per_message, 1u);
  // A range that runs past an engine buffer's end is not inside it: per message too.
  AlignedBuffer<std::uint8_t> small(64);
  const auto past = cache.acquire(small.data(), 1 << 20);
  EXPECT_FALSE(past.cached);
  cache.release(past);
  // Zero bytes register nothing.
  const auto empty = cache.acquire(tensor.data(), 0);
  EXPECT_EQ(empty.registration.handle, nullptr);
  cache.release(empty);
  EXPECT_EQ(device.registered.size(), 2u);
  EXPECT_EQ(device.live, 0);
}

TEST(RegistrationCache, DestroyingTheCacheDeregistersWhatItHolds) {
  FakeRegistrar device;
  AlignedBuffer<float> state(1024);
  {
    RegistrationCache cache(device);
    cache.release(cache.acquire(state.data(), 16));
    EXPECT_EQ(device.live, 1);
  }
  EXPECT_EQ(device.live, 0);
}

Request request(bool is_send, wire::MessageKey key, std::size_t bytes, std::uint64_t count = 10) {
  return Request::of(is_send, 1, key, wire::CallShape{count, 0, 1}, nullptr, bytes);
}

TEST(Rendezvous, OfferBeforeSendAndSendBeforeOfferBothWrite) {
  Rendezvous receiver(1, 0), sender(0, 1);
  const wire::MessageKey a{3, 0, wire::Kind::kWorkerBits, 0}, b{3, 0, wire::Kind::kWorkerBits, 1};
  Request ra = request(false, a, 128), rb = request(false, b, 64);
  Request sa = request(true, a, 128), sb = request(true, b, 64);
  // a: the receive is posted first; its offer waits at the sender for the send.
  const wire::ClearToSend offer_a = receiver.post_receive(ra, 0x1000, 7);
  EXPECT_FALSE(sender.offer_arrived(offer_a).has_value());
  auto write_a = sender.post_send(sa);
  ASSERT_TRUE(write_a.has_value());
  EXPECT_EQ(write_a->send, &sa);
  EXPECT_EQ(write_a->offer.address, 0x1000u);
  EXPECT_EQ(write_a->offer.rkey, 7u);
  // b: the send is posted first and waits for the offer.
  EXPECT_FALSE(sender.post_send(sb).has_value());
  EXPECT_TRUE(sender.owing());
  auto write_b = sender.offer_arrived(receiver.post_receive(rb, 0x2000, 8));
  ASSERT_TRUE(write_b.has_value());
  EXPECT_EQ(write_b->send, &sb);
  EXPECT_FALSE(sender.owing());
  // The writes arrive: each completes its own receive.
  EXPECT_TRUE(receiver.expecting());
  EXPECT_EQ(&receiver.write_arrived(write_b->offer.recv_id, 64), &rb);
  EXPECT_EQ(&receiver.write_arrived(write_a->offer.recv_id, 128), &ra);
  EXPECT_FALSE(receiver.expecting());
}

// transport.h: keys are unique among one peer's messages in flight, so a second receive for a
// pending key is onebit's own bug, refused naming the key (as TCP and Gloo refuse it); the first
// receive still matches its send.
TEST(Rendezvous, ASecondPendingReceiveOfOneKeyIsRefusedNamingIt) {
  Rendezvous receiver(1, 0), sender(0, 1);
  const wire::MessageKey key{0, 5, wire::Kind::kRingReduce, 2};
  Request r1 = request(false, key, 8), r2 = request(false, key, 8), s1 = request(true, key, 8);
  const wire::ClearToSend o1 = receiver.post_receive(r1, 0x10, 1);
  const std::string text = error_of([&] { receiver.post_receive(r2, 0x20, 1); }, ONEBIT_INTERNAL_ERROR);
  EXPECT_NE(text.find("rank 1 posted a second receive from rank 0 for one ring reduce-scatter message (stream 0, call "
                      "5, part 2) while the first is pending"),
            std::string::npos)
      << text;
  EXPECT_FALSE(sender.offer_arrived(o1).has_value());
  EXPECT_EQ(sender.post_send(s1)->offer.address, 0x10u);
}

TEST(Rendezvous, DisagreementsAreMismatchesNamingBothRanks) {
  Rendezvous receiver(1, 0), sender(0, 1);
  const wire::MessageKey key{0, 1, wire::Kind::kWorkerBits, 0};
  Request r = Request::of(false, 0, key, wire::CallShape{1000, 0, 1}, nullptr, 125);
  Request s = Request::of(true, 1, key, wire::CallShape{2000, 0, 1}, nullptr, 250);
  EXPECT_FALSE(sender.post_send(s).has_value());
  const std::string text = error_of([&] { sender.offer_arrived(receiver.post_receive(r, 0x10, 1)); }, ONEBIT_MISMATCH);
  EXPECT_NE(text.find("rank 0 and rank 1 disagree on a worker bits message: rank 0 sends 2000 elements"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("rank 1 expects 1000 elements"), std::string::npos) << text;
}

TEST(Rendezvous, APeerOfferingFarMoreThanAnySendAskedForIsNamed) {
  // Offers wait for their sends (the receiver is ahead); past the bound the peer is an error.
  Rendezvous sender(0, 1);
  wire::ClearToSend offer;
  offer.shape = wire::CallShape{10, 0, 1};
  offer.bytes = 8;
  for (std::size_t i = 0; i < Rendezvous::kMaxWaitingOffers; ++i) {
    offer.key = wire::MessageKey{7, i, wire::Kind::kRingReduce, 0};
    offer.recv_id = static_cast<std::uint32_t>(i + 1);
    ASSERT_FALSE(sender.offer_arrived(offer).has_value());
  }
  // A send takes one: room for one more offer, and no more.
  Request s = request(true, wire::MessageKey{7, 0, wire::Kind::kRingReduce, 0}, 8);
  ASSERT_TRUE(sender.post_send(s).has_value());
  offer.key.seq = Rendezvous::kMaxWaitingOffers;
  EXPECT_FALSE(sender.offer_arrived(offer).has_value());
  offer.key.seq += 1;
  const std::string text = error_of([&] { sender.offer_arrived(offer); }, ONEBIT_REMOTE_ERROR);
  EXPECT_NE(text.find("rank 1 has offered 65537 receives that no send of rank 0 has matched yet"), std::string::npos)
      << text;
}

TEST(Rendezvous, WritesThatWereNeverOfferedOrOfTheWrongSizeAreErrors) {
  Rendezvous receiver(1, 0);
  Request r = request(false, wire::MessageKey{0, 1, wire::Kind::kWorkerHead, 0}, 4);
  const wire::ClearToSend offer = receiver.post_receive(r, 0x10, 1);
  EXPECT_NE(error_of([&] { receiver.write_arrived(offer.recv_id + 1, 4); }, ONEBIT_REMOTE_ERROR).find("never offered"),
            std::string::npos);
  EXPECT_NE(
      error_of([&] { receiver.write_arrived(offer.recv_id, 8); }, ONEBIT_REMOTE_ERROR).find("wrote 8 bytes into a"),
      std::string::npos);
  int drained = 0;
  receiver.drain([&](Request& each) {
    EXPECT_EQ(&each, &r);
    ++drained;
  });
  EXPECT_EQ(drained, 1);
  EXPECT_FALSE(receiver.expecting());
}

}  // namespace
}  // namespace onebit::transport::ibverbs
