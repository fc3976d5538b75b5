#include "tests/ibverbs/fake_verbs.h"

#include <arpa/inet.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <vector>

namespace onebit::transport::ibverbs::testing {
namespace {

struct FakeChannel {
  ibv_comp_channel channel{};
  std::deque<ibv_cq*> events;
};
struct FakeCq {
  ibv_cq cq{};
  std::deque<ibv_wc> entries;
  bool armed = false;
  FakeChannel* channel = nullptr;
};
struct FakeMr {
  ibv_mr mr{};
};
// Work that reached a queue pair with no receive posted: a SEND's bytes, or the completion of an
// RDMA write with immediate (its data has landed; only the receive completion is owed).
struct PendingSend {
  std::vector<std::uint8_t> data;
  std::uint64_t sender_wr_id;
  ibv_qp* sender;
  bool write_with_imm = false;
  ibv_wc arrived{};
};
struct FakeQp {
  ibv_qp qp{};
  ibv_qp_state state = IBV_QPS_RESET;
  std::uint32_t remote = 0;
  std::deque<ibv_recv_wr> receives;  // posted (sg_list copied below)
  std::deque<ibv_sge> receive_sges;
  std::deque<PendingSend> waiting_sends;  // arrived before a receive was posted
};

// Everything under one lock: the stand-in is about behaviour, not speed.
std::mutex big_lock;
std::map<std::uint32_t, FakeQp*> queue_pairs;                    // by QP number
std::map<std::uint32_t, std::pair<char*, std::size_t>> regions;  // by rkey
std::uint32_t next_qp_num = 100;
std::uint32_t next_key = 1;
ibv_device fake_device{};

FakeCq* fake(ibv_cq* cq) { return reinterpret_cast<FakeCq*>(cq); }
FakeQp* fake(ibv_qp* qp) { return reinterpret_cast<FakeQp*>(qp); }

void push(ibv_cq* target, const ibv_wc& wc) {
  FakeCq* cq = fake(target);
  cq->entries.push_back(wc);
  if (cq->armed && cq->channel != nullptr) {
    cq->armed = false;
    cq->channel->events.push_back(target);
    std::uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(cq->channel->channel.fd, &one, sizeof(one));
  }
}

ibv_wc completion(std::uint64_t wr_id, ibv_wc_opcode opcode, ibv_wc_status status, std::uint32_t bytes, ibv_qp* qp) {
  ibv_wc wc{};
  wc.wr_id = wr_id;
  wc.opcode = opcode;
  wc.status = status;
  wc.byte_len = bytes;
  wc.qp_num = qp->qp_num;
  return wc;
}

// Delivers a SEND's bytes into the target's first posted receive; false if none is posted.
bool deliver_send(FakeQp* target, const std::uint8_t* data, std::size_t bytes, std::uint64_t sender_wr_id,
                  ibv_qp* sender) {
  if (target->receives.empty()) return false;
  const ibv_recv_wr wr = target->receives.front();
  const ibv_sge sge = target->receive_sges.front();
  target->receives.pop_front();
  target->receive_sges.pop_front();
  if (bytes > sge.length) {
    push(target->qp.recv_cq, completion(wr.wr_id, IBV_WC_RECV, IBV_WC_LOC_LEN_ERR, 0, &target->qp));
    push(sender->send_cq, completion(sender_wr_id, IBV_WC_SEND, IBV_WC_REM_INV_REQ_ERR, 0, sender));
    return true;
  }
  std::memcpy(reinterpret_cast<void*>(sge.addr), data, bytes);
  push(target->qp.recv_cq,
       completion(wr.wr_id, IBV_WC_RECV, IBV_WC_SUCCESS, static_cast<std::uint32_t>(bytes), &target->qp));
  push(sender->send_cq, completion(sender_wr_id, IBV_WC_SEND, IBV_WC_SUCCESS, 0, sender));
  return true;
}

void flush_receives(FakeQp* qp) {
  while (!qp->receives.empty()) {
    push(qp->qp.recv_cq, completion(qp->receives.front().wr_id, IBV_WC_RECV, IBV_WC_WR_FLUSH_ERR, 0, &qp->qp));
    qp->receives.pop_front();
    qp->receive_sges.pop_front();
  }
}

int post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  std::lock_guard<std::mutex> lock(big_lock);
  for (; wr != nullptr; wr = wr->next) {
    FakeQp* me = fake(qp);
    if (me->state != IBV_QPS_RTS) {
      *bad = wr;
      return EINVAL;
    }
    const ibv_wc_opcode done = wr->opcode == IBV_WR_SEND ? IBV_WC_SEND : IBV_WC_RDMA_WRITE;
    auto found = queue_pairs.find(me->remote);
    if (found == queue_pairs.end() || (found->second->state != IBV_QPS_RTR && found->second->state != IBV_QPS_RTS)) {
      push(qp->send_cq, completion(wr->wr_id, done, IBV_WC_RETRY_EXC_ERR, 0, qp));  // nobody answers
      continue;
    }
    FakeQp* target = found->second;
    const std::uint8_t* data = wr->num_sge ? reinterpret_cast<const std::uint8_t*>(wr->sg_list[0].addr) : nullptr;
    const std::size_t bytes = wr->num_sge ? wr->sg_list[0].length : 0;
    if (wr->opcode == IBV_WR_SEND) {
      if (!deliver_send(target, data, bytes, wr->wr_id, qp)) {
        target->waiting_sends.push_back(PendingSend{std::vector<std::uint8_t>(data, data + bytes), wr->wr_id, qp});
      }
      continue;
    }
    if (wr->opcode != IBV_WR_RDMA_WRITE_WITH_IMM) {
      *bad = wr;
      return EINVAL;  // the transport uses nothing else
    }
    char* at = reinterpret_cast<char*>(wr->wr.rdma.remote_addr);
    if (bytes > 0) {
      auto region = regions.find(wr->wr.rdma.rkey);
      if (region == regions.end() || at < region->second.first ||
          at + bytes > region->second.first + region->second.second) {
        push(qp->send_cq, completion(wr->wr_id, done, IBV_WC_REM_ACCESS_ERR, 0, qp));
        continue;
      }
      std::memcpy(at, data, bytes);
    }
    // A write with immediate consumes a posted receive; with none posted, hardware retries (RNR)
    // until one is: the stand-in holds the completion as a send without payload.
    if (target->receives.empty()) {
      PendingSend pending{
          {},
          wr->wr_id,
          qp,
          true,
          completion(0, IBV_WC_RECV_RDMA_WITH_IMM, IBV_WC_SUCCESS, static_cast<std::uint32_t>(bytes), &target->qp)};
      pending.arrived.imm_data = wr->imm_data;
      pending.arrived.wc_flags = IBV_WC_WITH_IMM;
      target->waiting_sends.push_back(std::move(pending));
      continue;
    }
    ibv_wc arrived = completion(target->receives.front().wr_id, IBV_WC_RECV_RDMA_WITH_IMM, IBV_WC_SUCCESS,
                                static_cast<std::uint32_t>(bytes), &target->qp);
    arrived.imm_data = wr->imm_data;
    arrived.wc_flags = IBV_WC_WITH_IMM;
    target->receives.pop_front();
    target->receive_sges.pop_front();
    push(target->qp.recv_cq, arrived);
    push(qp->send_cq, completion(wr->wr_id, done, IBV_WC_SUCCESS, 0, qp));
  }
  return 0;
}

int post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  std::lock_guard<std::mutex> lock(big_lock);
  FakeQp* me = fake(qp);
  for (; wr != nullptr; wr = wr->next) {
    me->receives.push_back(*wr);
    me->receive_sges.push_back(wr->sg_list[0]);
    if (me->state == IBV_QPS_ERR) {
      flush_receives(me);
      continue;
    }
    // Something was waiting for this receive.
    if (!me->waiting_sends.empty()) {
      PendingSend pending = std::move(me->waiting_sends.front());
      me->waiting_sends.pop_front();
      if (pending.write_with_imm) {
        ibv_wc wc = pending.arrived;
        wc.wr_id = me->receives.front().wr_id;
        me->receives.pop_front();
        me->receive_sges.pop_front();
        push(qp->recv_cq, wc);
        push(pending.sender->send_cq,
             completion(pending.sender_wr_id, IBV_WC_RDMA_WRITE, IBV_WC_SUCCESS, 0, pending.sender));
      } else {
        deliver_send(me, pending.data.data(), pending.data.size(), pending.sender_wr_id, pending.sender);
      }
    }
  }
  (void)bad;
  return 0;
}

int poll_cq(ibv_cq* cq, int n, ibv_wc* out) {
  std::lock_guard<std::mutex> lock(big_lock);
  int taken = 0;
  for (FakeCq* f = fake(cq); taken < n && !f->entries.empty(); ++taken) {
    out[taken] = f->entries.front();
    f->entries.pop_front();
  }
  return taken;
}

int req_notify_cq(ibv_cq* cq, int) {
  std::lock_guard<std::mutex> lock(big_lock);
  fake(cq)->armed = true;
  return 0;
}

ibv_device** get_device_list(int* count) {
  *count = 1;
  auto** list = new ibv_device*[2];
  list[0] = &fake_device;
  list[1] = nullptr;
  return list;
}
void free_device_list(ibv_device** list) { delete[] list; }
const char* get_device_name(ibv_device*) { return "fake0"; }
ibv_context* open_device(ibv_device* device) {
  auto* context = new ibv_context{};
  context->device = device;
  context->num_comp_vectors = 1;
  context->ops.post_send = post_send;
  context->ops.post_recv = post_recv;
  context->ops.poll_cq = poll_cq;
  context->ops.req_notify_cq = req_notify_cq;
  return context;
}
int close_device(ibv_context* context) {
  delete context;
  return 0;
}
int query_device(ibv_context*, ibv_device_attr* attr) {
  *attr = ibv_device_attr{};
  attr->phys_port_cnt = 1;
  return 0;
}
int query_port(ibv_context*, std::uint8_t port, ibv_port_attr* attr) {
  if (port != 1) return EINVAL;
  *attr = ibv_port_attr{};
  attr->state = IBV_PORT_ACTIVE;
  attr->active_mtu = IBV_MTU_4096;
  attr->max_mtu = IBV_MTU_4096;
  attr->lid = 1;
  attr->link_layer = IBV_LINK_LAYER_INFINIBAND;
  return 0;
}
int query_gid(ibv_context*, std::uint8_t, int, ibv_gid* gid) {
  *gid = ibv_gid{};
  return 0;
}
ibv_pd* alloc_pd(ibv_context* context) {
  auto* pd = new ibv_pd{};
  pd->context = context;
  return pd;
}
int dealloc_pd(ibv_pd* pd) {
  delete pd;
  return 0;
}
ibv_mr* reg_mr(ibv_pd* pd, void* address, std::size_t length, int) {
  std::lock_guard<std::mutex> lock(big_lock);
  auto* f = new FakeMr{};
  f->mr.context = pd->context;
  f->mr.pd = pd;
  f->mr.addr = address;
  f->mr.length = length;
  f->mr.lkey = f->mr.rkey = next_key++;
  regions[f->mr.rkey] = {static_cast<char*>(address), length};
  return &f->mr;
}
int dereg_mr(ibv_mr* mr) {
  std::lock_guard<std::mutex> lock(big_lock);
  regions.erase(mr->rkey);
  delete reinterpret_cast<FakeMr*>(mr);
  return 0;
}
ibv_comp_channel* create_comp_channel(ibv_context* context) {
  auto* f = new FakeChannel{};
  f->channel.context = context;
  f->channel.fd = ::eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);  // one read per event
  return &f->channel;
}
int destroy_comp_channel(ibv_comp_channel* channel) {
  ::close(channel->fd);
  delete reinterpret_cast<FakeChannel*>(channel);
  return 0;
}
ibv_cq* create_cq(ibv_context* context, int entries, void*, ibv_comp_channel* channel, int) {
  auto* f = new FakeCq{};
  f->cq.context = context;
  f->cq.channel = channel;
  f->cq.cqe = entries;
  f->channel = reinterpret_cast<FakeChannel*>(channel);
  return &f->cq;
}
int destroy_cq(ibv_cq* cq) {
  delete fake(cq);
  return 0;
}
int get_cq_event(ibv_comp_channel* channel, ibv_cq** cq, void** user) {
  std::uint64_t one = 0;
  if (::read(channel->fd, &one, sizeof(one)) != sizeof(one)) return -1;  // EAGAIN: the fd is non-blocking
  std::lock_guard<std::mutex> lock(big_lock);
  auto* f = reinterpret_cast<FakeChannel*>(channel);
  if (f->events.empty()) {
    errno = EAGAIN;
    return -1;
  }
  *cq = f->events.front();
  f->events.pop_front();
  *user = nullptr;
  return 0;
}
void ack_cq_events(ibv_cq*, unsigned int) {}
ibv_qp* create_qp(ibv_pd* pd, ibv_qp_init_attr* attr) {
  std::lock_guard<std::mutex> lock(big_lock);
  auto* f = new FakeQp{};
  f->qp.context = pd->context;
  f->qp.pd = pd;
  f->qp.send_cq = attr->send_cq;
  f->qp.recv_cq = attr->recv_cq;
  f->qp.qp_type = attr->qp_type;
  f->qp.qp_num = next_qp_num++;
  queue_pairs[f->qp.qp_num] = f;
  return &f->qp;
}
int modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int mask) {
  std::lock_guard<std::mutex> lock(big_lock);
  FakeQp* f = fake(qp);
  if (mask & IBV_QP_STATE) f->state = attr->qp_state;
  if (mask & IBV_QP_DEST_QPN) f->remote = attr->dest_qp_num;
  if (f->state == IBV_QPS_ERR) flush_receives(f);
  return 0;
}
int destroy_qp(ibv_qp* qp) {
  std::lock_guard<std::mutex> lock(big_lock);
  queue_pairs.erase(qp->qp_num);
  delete fake(qp);
  return 0;
}
const char* wc_status_str(ibv_wc_status status) {
  switch (status) {
    case IBV_WC_SUCCESS: return "success";
    case IBV_WC_RETRY_EXC_ERR: return "transport retry counter exceeded";
    case IBV_WC_REM_ACCESS_ERR: return "remote access error";
    case IBV_WC_WR_FLUSH_ERR: return "Work Request Flushed Error";
    default: return "other error";
  }
}

}  // namespace

const VerbsApi& fake_verbs() {
  static const VerbsApi api = {
      get_device_list,
      free_device_list,
      get_device_name,
      open_device,
      close_device,
      query_device,
      query_port,
      query_gid,
      alloc_pd,
      dealloc_pd,
      reg_mr,
      dereg_mr,
      create_comp_channel,
      destroy_comp_channel,
      create_cq,
      destroy_cq,
      get_cq_event,
      ack_cq_events,
      create_qp,
      modify_qp,
      destroy_qp,
      wc_status_str,
  };
  return api;
}

}  // namespace onebit::transport::ibverbs::testing
