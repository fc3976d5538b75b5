#include "transport/ibverbs/setup.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "common/error.h"

namespace onebit::transport::ibverbs {

HcaSpec parse_hca(const std::string& text) {
  HcaSpec spec;
  const std::size_t colon = text.find(':');
  spec.device = text.substr(0, colon);
  ONEBIT_CHECK(text.find_first_of(",^=") == std::string::npos, ONEBIT_INVALID_ARGUMENT, "ONEBIT_IB_HCA='", text,
               "': name one device, as mlx5_0 or mlx5_0:1 (lists, '^' and '=' are not supported)");
  if (colon != std::string::npos) {
    const std::string port = text.substr(colon + 1);
    char* end = nullptr;
    const long value = std::strtol(port.c_str(), &end, 10);
    ONEBIT_CHECK(!spec.device.empty() && !port.empty() && *end == '\0' && value >= 1 && value <= 255,
                 ONEBIT_INVALID_ARGUMENT, "ONEBIT_IB_HCA='", text, "': expected device:port with a port in 1..255");
    spec.port = static_cast<int>(value);
  }
  return spec;
}

std::vector<GidEntry> read_gid_table(const std::string& port_dir) {
  std::vector<GidEntry> table;
  for (int index = 0; index < 256; ++index) {
    std::ifstream gid_file(port_dir + "/gids/" + std::to_string(index));
    if (!gid_file) break;
    std::string text;
    gid_file >> text;
    GidEntry entry;
    entry.index = index;
    in6_addr address{};
    if (::inet_pton(AF_INET6, text.c_str(), &address) != 1) continue;
    std::copy(address.s6_addr, address.s6_addr + 16, entry.gid.begin());
    bool zero = true;
    for (std::uint8_t b : entry.gid) zero = zero && b == 0;
    if (zero) continue;
    std::ifstream type_file(port_dir + "/gid_attrs/types/" + std::to_string(index));
    std::getline(type_file, entry.type);
    table.push_back(entry);
  }
  return table;
}

namespace {
bool is_ipv4_mapped(const std::array<std::uint8_t, 16>& g) {
  for (int i = 0; i < 10; ++i) {
    if (g[i] != 0) return false;
  }
  return g[10] == 0xff && g[11] == 0xff;
}
bool is_roce_v2(const GidEntry& e) { return e.type == "RoCE v2"; }
}  // namespace

int choose_gid_index(const std::vector<GidEntry>& table) {
  for (const GidEntry& e : table) {
    if (is_roce_v2(e) && is_ipv4_mapped(e.gid)) return e.index;
  }
  for (const GidEntry& e : table) {
    if (is_roce_v2(e)) return e.index;
  }
  return table.empty() ? -1 : table.front().index;
}

std::string gid_text(const std::array<std::uint8_t, 16>& gid) {
  char text[INET6_ADDRSTRLEN] = {};
  in6_addr address{};
  std::copy(gid.begin(), gid.end(), address.s6_addr);
  ::inet_ntop(AF_INET6, &address, text, sizeof(text));
  return text;
}

ibv_qp_attr ready_to_receive(const LocalPort& local, const wire::VerbsEndpoint& remote, int* mask) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTR;
  attr.path_mtu = std::min(local.active_mtu, static_cast<ibv_mtu>(remote.mtu));
  attr.dest_qp_num = remote.qp_num;
  attr.rq_psn = remote.psn;
  attr.max_dest_rd_atomic = 1;
  attr.min_rnr_timer = 12;  // 0.64 ms before the peer retries a send we had no receive for
  attr.ah_attr.port_num = local.port;
  attr.ah_attr.sl = 0;
  const bool global = remote.link_layer == IBV_LINK_LAYER_ETHERNET || local.gid_index >= 0;
  if (global) {
    attr.ah_attr.is_global = 1;
    std::copy(remote.gid.begin(), remote.gid.end(), attr.ah_attr.grh.dgid.raw);
    attr.ah_attr.grh.sgid_index = static_cast<std::uint8_t>(std::max(local.gid_index, 0));
    attr.ah_attr.grh.hop_limit = 64;
  } else {
    attr.ah_attr.dlid = remote.lid;
  }
  *mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
          IBV_QP_MIN_RNR_TIMER;
  return attr;
}

ibv_qp_attr ready_to_send(std::uint32_t psn, int ack_timeout, int* mask) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTS;
  attr.sq_psn = psn;
  attr.timeout = static_cast<std::uint8_t>(ack_timeout);
  attr.retry_cnt = 7;
  attr.rnr_retry = 7;  // 7 means forever
  attr.max_rd_atomic = 1;
  *mask = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
  return attr;
}

}  // namespace onebit::transport::ibverbs
