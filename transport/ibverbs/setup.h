// Setting up the verbs transport, the parts that need no device, so they are tested everywhere
// (tests/unit/ibverbs_test.cc): which device, port and GID to use, and the attributes that take a
// reliable-connected queue pair from INIT to RTR (connected to the peer's) and to RTS.
#pragma once

#include <infiniband/verbs.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "transport/wire.h"

namespace onebit::transport::ibverbs {

// ONEBIT_IB_HCA, in NCCL_IB_HCA's single-device form: "" (the first device with an active port),
// "mlx5_0" (that device, its first active port) or "mlx5_0:1". Throws Error(ONEBIT_INVALID_ARGUMENT)
// naming the text.
struct HcaSpec {
  std::string device;  // empty: any
  int port = 0;        // 0: the first active one
};
HcaSpec parse_hca(const std::string& text);

// One entry of a port's GID table, as sysfs shows it.
struct GidEntry {
  int index = 0;
  std::array<std::uint8_t, 16> gid{};
  std::string type;  // gid_attrs/types/<index>: "RoCE v2", "IB/RoCE v1"; empty when unreadable
};

// A port's GID table from sysfs: `port_dir` is /sys/class/infiniband/<device>/ports/<port>. Entries
// whose GID is all zeros (unused) are left out.
std::vector<GidEntry> read_gid_table(const std::string& port_dir);

// The GID index for a RoCE port when ONEBIT_IB_GID_INDEX is -1, as NCCL chooses since 2.21: the
// first RoCE v2 GID that holds an IPv4 address (::ffff:a.b.c.d), else the first RoCE v2 GID, else
// the first GID. -1 when the table is empty.
int choose_gid_index(const std::vector<GidEntry>& table);

// "fe80::1", "::ffff:10.0.0.1" style text of a GID, for logs and errors.
std::string gid_text(const std::array<std::uint8_t, 16>& gid);

// What this side knows about its own port when it connects a queue pair.
struct LocalPort {
  std::uint8_t port = 1;
  ibv_mtu active_mtu = IBV_MTU_1024;
  int gid_index = -1;  // -1: route by LID (InfiniBand only)
};

// INIT -> RTR towards `remote`: path MTU the smaller of the two ports', the peer's QP number and
// PSN, routed by GID (a global route: RoCE always, InfiniBand when a GID index is set) or by LID.
// `mask` receives the ibv_modify_qp mask to pass.
ibv_qp_attr ready_to_receive(const LocalPort& local, const wire::VerbsEndpoint& remote, int* mask);
// RTR -> RTS: our PSN, `ack_timeout` (ONEBIT_IB_TIMEOUT: 4.096 us * 2^value per try), 7 retries
// of a lost packet, and retrying forever while the peer has no receive posted (the protocol keeps
// receives posted; a peer behind is a slow peer, not a failure).
ibv_qp_attr ready_to_send(std::uint32_t psn, int ack_timeout, int* mask);

}  // namespace onebit::transport::ibverbs
