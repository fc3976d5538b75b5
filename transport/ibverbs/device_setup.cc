// The verbs transport's set-up on a device (ibverbs_transport.h): open the device and port that
// ONEBIT_IB_HCA names (or the first active one), choose the GID, allocate the protection domain and
// completion queue; then over the TCP mesh swap queue-pair endpoints with every peer and take each
// queue pair INIT -> RTR -> RTS, receives posted. The device-free choices are setup.cc's.
#include "transport/ibverbs/ibverbs_transport.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <memory>
#include <random>
#include <string>
#include <utility>

#include "common/error.h"
#include "common/log.h"
#include "transport/ibverbs/ibverbs_internal.h"
#include "transport/ibverbs/setup.h"
#include "transport/ibverbs/verbs_api.h"
#include "transport/tcp/mesh.h"
#include "transport/tcp/socket.h"
#include "transport/wire.h"

namespace onebit::transport::ibverbs {

void IbverbsTransport::open_device() {
  const VerbsApi& api = verbs();
  const HcaSpec spec = parse_hca(options_.hca);
  int count = 0;
  ibv_device** list = api.get_device_list(&count);
  ONEBIT_CHECK(list != nullptr && count > 0, ONEBIT_SYSTEM_ERROR,
               "ONEBIT_TRANSPORT=ibverbs: no RDMA device: libibverbs lists none (no InfiniBand or RoCE adapter, "
               "or its kernel driver or rdma-core provider is missing; for soft-RoCE: rdma link add rxe0 type rxe "
               "netdev eth0)");
  struct FreeList {
    ibv_device** list;
    ~FreeList() { verbs().free_device_list(list); }
  } free_list{list};
  std::string seen;
  auto device = std::make_unique<Device>();
  for (int d = 0; d < count && !device->context; ++d) {
    const std::string name = api.get_device_name(list[d]);
    if (!spec.device.empty() && name != spec.device) {
      seen += (seen.empty() ? "" : ", ") + name;
      continue;
    }
    ibv_context* context = api.open_device(list[d]);
    if (context == nullptr) {
      seen += (seen.empty() ? "" : ", ") + name + " (cannot open: " + errno_text(errno) + ")";
      continue;
    }
    ibv_device_attr attr{};
    const int ports = api.query_device(context, &attr) == 0 ? attr.phys_port_cnt : 0;
    for (int port = spec.port ? spec.port : 1; port <= (spec.port ? spec.port : ports); ++port) {
      ibv_port_attr port_attr{};
      if (api.query_port(context, static_cast<std::uint8_t>(port), &port_attr) != 0) continue;
      if (port_attr.state != IBV_PORT_ACTIVE) {
        seen += (seen.empty() ? "" : ", ") + name + ":" + std::to_string(port) + " (not active)";
        continue;
      }
      device->name = name + ":" + std::to_string(port);
      device->context = context;
      device->port_attr = port_attr;
      device->local.port = static_cast<std::uint8_t>(port);
      device->local.active_mtu = port_attr.active_mtu;
      break;
    }
    if (!device->context) api.close_device(context);
  }
  ONEBIT_CHECK(device->context != nullptr, ONEBIT_SYSTEM_ERROR, "ONEBIT_TRANSPORT=ibverbs: no active port",
               spec.device.empty() ? std::string() : " on ONEBIT_IB_HCA=" + options_.hca,
               "; devices seen: ", seen.empty() ? "none" : seen);

  const bool roce = device->port_attr.link_layer == IBV_LINK_LAYER_ETHERNET;
  int gid_index = options_.gid_index;
  if (roce && gid_index < 0) {
    const std::string dir = "/sys/class/infiniband/" + device->name.substr(0, device->name.find(':')) + "/ports/" +
                            std::to_string(device->local.port);
    gid_index = choose_gid_index(read_gid_table(dir));
    ONEBIT_CHECK(gid_index >= 0, ONEBIT_SYSTEM_ERROR, "ONEBIT_TRANSPORT=ibverbs: ", device->name,
                 " is RoCE but has no GID (no IP address on its network interface?); set ONEBIT_IB_GID_INDEX");
  }
  device->local.gid_index = gid_index;
  if (gid_index >= 0) {
    ONEBIT_CHECK(api.query_gid(device->context, device->local.port, gid_index, &device->gid) == 0, ONEBIT_SYSTEM_ERROR,
                 "ONEBIT_TRANSPORT=ibverbs: ", device->name, " has no GID at index ", gid_index,
                 " (ONEBIT_IB_GID_INDEX)");
  }
  device->pd = api.alloc_pd(device->context);
  device->channel = device->pd ? api.create_comp_channel(device->context) : nullptr;
  const int entries = (size_ - 1) * (kSendDepth + kReceiveSlots);
  device->cq = device->channel ? api.create_cq(device->context, entries, nullptr, device->channel, 0) : nullptr;
  ONEBIT_CHECK(device->cq != nullptr, ONEBIT_SYSTEM_ERROR,
               "ONEBIT_TRANSPORT=ibverbs: cannot allocate a protection "
               "domain, completion channel or a completion queue of ",
               entries, " entries on ", device->name, ": ", errno_text(errno));
  std::array<std::uint8_t, 16> gid{};
  std::copy(device->gid.raw, device->gid.raw + 16, gid.begin());
  description_ = device->name + (roce ? " (RoCE, GID index " + std::to_string(gid_index) + " " + gid_text(gid) + ")"
                                      : " (InfiniBand, LID " + std::to_string(device->port_attr.lid) + ")");
  device_ = std::move(device);
}

void IbverbsTransport::connect_queue_pairs(const tcp::Address& root) {
  const VerbsApi& api = verbs();
  const Deadline deadline = Clock::now() + options_.tcp.timeout;
  tcp::Mesh mesh = tcp::connect_mesh(rank_, size_, root, options_.tcp, 1);
  std::mt19937 random(std::random_device{}());
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    auto peer = std::make_unique<Peer>(rank_, r);
    peer->side = std::move(mesh.sockets[r][0]);
    const std::string who = "rank " + std::to_string(r);

    ibv_qp_init_attr init{};
    init.send_cq = device_->cq;
    init.recv_cq = device_->cq;
    init.qp_type = IBV_QPT_RC;
    init.sq_sig_all = 1;
    init.cap.max_send_wr = kSendDepth;
    init.cap.max_recv_wr = kReceiveSlots;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    peer->qp = api.create_qp(device_->pd, &init);
    ONEBIT_CHECK(peer->qp != nullptr, ONEBIT_SYSTEM_ERROR, "rank ", rank_, ": ibv_create_qp for ", who, " on ",
                 device_->name, ": ", errno_text(errno));
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_INIT;
    attr.pkey_index = 0;
    attr.port_num = device_->local.port;
    attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    ONEBIT_CHECK(
        api.modify_qp(peer->qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0,
        ONEBIT_SYSTEM_ERROR, "rank ", rank_, ": queue pair for ", who, " to INIT: ", errno_text(errno));

    // Swap endpoints over the authenticated set-up socket: both write, then both read (48 bytes
    // fit any socket buffer, so neither waits for the other).
    wire::VerbsEndpoint mine;
    mine.link_layer = device_->port_attr.link_layer;
    mine.mtu = static_cast<std::uint8_t>(device_->local.active_mtu);
    mine.qp_num = peer->qp->qp_num;
    mine.psn = random() & 0xffffff;
    mine.lid = device_->port_attr.lid;
    std::copy(device_->gid.raw, device_->gid.raw + 16, mine.gid.begin());
    mine.job_id = mesh.job_id;
    mine.from_rank = static_cast<std::uint32_t>(rank_);
    const auto bytes = mine.encode();
    tcp::write_all(peer->side.get(), bytes.data(), bytes.size(), deadline, who);
    std::array<std::uint8_t, wire::VerbsEndpoint::kSize> in{};
    tcp::read_all(peer->side.get(), in.data(), in.size(), deadline, who);
    const wire::VerbsEndpoint theirs = wire::VerbsEndpoint::decode(in.data(), who);
    ONEBIT_CHECK(theirs.job_id == mesh.job_id && theirs.from_rank == static_cast<std::uint32_t>(r), ONEBIT_REMOTE_ERROR,
                 who, " sent the verbs endpoint of rank ", theirs.from_rank, " of job ", std::hex, theirs.job_id);
    ONEBIT_CHECK(theirs.link_layer == mine.link_layer, ONEBIT_REMOTE_ERROR, who, "'s port is ",
                 theirs.link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand", " and rank ", rank_,
                 "'s is not: ", "they cannot connect (ONEBIT_IB_HCA)");

    int mask = 0;
    ibv_qp_attr rtr = ready_to_receive(device_->local, theirs, &mask);
    ONEBIT_CHECK(api.modify_qp(peer->qp, &rtr, mask) == 0, ONEBIT_SYSTEM_ERROR, "rank ", rank_, ": queue pair for ",
                 who, " to RTR (", device_->name, " -> qp ", theirs.qp_num, "): ", errno_text(errno));
    ibv_qp_attr rts = ready_to_send(mine.psn, options_.ack_timeout, &mask);
    ONEBIT_CHECK(api.modify_qp(peer->qp, &rts, mask) == 0, ONEBIT_SYSTEM_ERROR, "rank ", rank_, ": queue pair for ",
                 who, " to RTS: ", errno_text(errno));

    peer->control.resize((kReceiveSlots + kOfferSlots) * kSlotBytes);
    peer->control_lease = cache_->acquire(peer->control.data(), (kReceiveSlots + kOfferSlots) * kSlotBytes);
    for (std::uint32_t s = 0; s < kReceiveSlots; ++s) post_receive_slot(*peer, s);
    for (std::uint32_t s = 0; s < kOfferSlots; ++s) peer->free_offer_slots.push_back(kReceiveSlots + s);
    // Both queue pairs are ready, with receives posted, before either side may send: a packet
    // for a queue pair still short of RTR is dropped and only saved by the adapter's retries.
    const std::uint8_t ready = 1;
    std::uint8_t peer_ready = 0;
    tcp::write_all(peer->side.get(), &ready, 1, deadline, who);
    tcp::read_all(peer->side.get(), &peer_ready, 1, deadline, who);
    ONEBIT_CHECK(peer_ready == 1, ONEBIT_REMOTE_ERROR, who, " sent ", int(peer_ready), " where its ready byte belongs");
    peers_[r] = std::move(peer);
  }
  ONEBIT_LOG(INFO, "rank ", rank_, "/", size_, ": verbs transport on ", description_, ", ", size_ - 1, " queue pairs");
}

}  // namespace onebit::transport::ibverbs
