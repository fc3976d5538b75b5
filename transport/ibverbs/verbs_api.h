// The libibverbs entry points the verbs transport calls, looked up in libibverbs.so.1 on first use
// (dlopen, as NCCL's ibvwrap does). So onebit's libraries load, and every other transport works, on
// a host without rdma-core; only ONEBIT_TRANSPORT=ibverbs needs it, and it then fails with a
// message naming what is missing. The data-path calls (ibv_post_send, ibv_post_recv, ibv_poll_cq,
// ibv_req_notify_cq) are inline in verbs.h, through the device's ops table: they need no symbol.
#pragma once

#include <infiniband/verbs.h>

#include <string>

namespace onebit::transport::ibverbs {

struct VerbsApi {
  ibv_device** (*get_device_list)(int* count);
  void (*free_device_list)(ibv_device** list);
  const char* (*get_device_name)(ibv_device* device);
  ibv_context* (*open_device)(ibv_device* device);
  int (*close_device)(ibv_context* context);
  int (*query_device)(ibv_context* context, ibv_device_attr* attr);
  int (*query_port)(ibv_context* context, std::uint8_t port, ibv_port_attr* attr);
  int (*query_gid)(ibv_context* context, std::uint8_t port, int index, ibv_gid* gid);
  ibv_pd* (*alloc_pd)(ibv_context* context);
  int (*dealloc_pd)(ibv_pd* pd);
  ibv_mr* (*reg_mr)(ibv_pd* pd, void* address, std::size_t length, int access);
  int (*dereg_mr)(ibv_mr* mr);
  ibv_comp_channel* (*create_comp_channel)(ibv_context* context);
  int (*destroy_comp_channel)(ibv_comp_channel* channel);
  ibv_cq* (*create_cq)(ibv_context* context, int entries, void* user, ibv_comp_channel* channel, int vector);
  int (*destroy_cq)(ibv_cq* cq);
  int (*get_cq_event)(ibv_comp_channel* channel, ibv_cq** cq, void** user);
  void (*ack_cq_events)(ibv_cq* cq, unsigned int count);
  ibv_qp* (*create_qp)(ibv_pd* pd, ibv_qp_init_attr* attr);
  int (*modify_qp)(ibv_qp* qp, ibv_qp_attr* attr, int mask);
  int (*destroy_qp)(ibv_qp* qp);
  const char* (*wc_status_str)(ibv_wc_status status);
};

// The loaded table. Throws onebit::Error(ONEBIT_SYSTEM_ERROR) naming the library or the symbol and
// the loader's reason when libibverbs.so.1 (rdma-core) cannot be used.
const VerbsApi& verbs();

// Whether verbs() would succeed; otherwise why not. For skips and onebit-info.
bool verbs_loadable(std::string* why_not);

// Tests on hosts without an adapter install a stand-in (tests/ibverbs/fake_verbs.h) that verbs()
// then returns; null goes back to libibverbs. Not for production use: nothing else calls it.
void use_verbs_for_testing(const VerbsApi* api);

}  // namespace onebit::transport::ibverbs
