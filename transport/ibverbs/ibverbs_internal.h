// The verbs transport's own parts, shared by ibverbs_transport.cc (requests, failure, the progress
// thread's handlers in progress_thread.cc) and device_setup.cc (opening the device, connecting the
// queue pairs); not an interface. The sizes of a queue pair's work and control slots, work-request
// ids, the device (which is also the registration cache's Registrar) and a peer: its queue pair,
// rendezvous and control buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "common/aligned_buffer.h"
#include "common/error.h"
#include "transport/ibverbs/ibverbs_transport.h"
#include "transport/ibverbs/rendezvous.h"
#include "transport/ibverbs/setup.h"
#include "transport/ibverbs/verbs_api.h"

namespace onebit::transport::ibverbs {

constexpr int kSendDepth = 256;     // send work requests (writes and offers) per queue pair
constexpr int kReceiveSlots = 128;  // control-message receives kept posted per queue pair
constexpr int kOfferSlots = 128;    // control-message send buffers per peer
constexpr std::size_t kSlotBytes = wire::ClearToSend::kSize;

std::string errno_text(int err);

// A work request's id: what it is, the peer, and a slot (control buffer) or write id.
enum class Work : std::uint64_t { kWrite = 1, kOffer = 2, kReceive = 3 };
inline std::uint64_t work_id(Work kind, int peer, std::uint32_t slot) {
  return static_cast<std::uint64_t>(kind) << 56 | static_cast<std::uint64_t>(peer) << 32 | slot;
}
inline Work work_kind(std::uint64_t id) { return static_cast<Work>(id >> 56); }
inline int work_peer(std::uint64_t id) { return static_cast<int>((id >> 32) & 0xffffff); }
inline std::uint32_t work_slot(std::uint64_t id) { return static_cast<std::uint32_t>(id); }

// An abort on the set-up socket: u32 length, then the error text.
constexpr std::size_t kMaxAbortText = 4000;

struct IbverbsTransport::Device final : Registrar {
  std::string name;
  ibv_context* context = nullptr;
  ibv_pd* pd = nullptr;
  ibv_comp_channel* channel = nullptr;
  ibv_cq* cq = nullptr;
  LocalPort local;
  ibv_port_attr port_attr{};
  ibv_gid gid{};

  Registration register_memory(void* begin, std::size_t bytes) override {
    ibv_mr* mr = verbs().reg_mr(pd, begin, bytes, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (mr == nullptr) {
      const int err = errno;
      fail(ONEBIT_SYSTEM_ERROR, "ibv_reg_mr of ", bytes, " bytes at ", begin, " on ", name, ": ", errno_text(err),
           err == ENOMEM || err == EPERM ? " (is the locked-memory limit, ulimit -l, too low?)" : "");
    }
    return Registration{mr->lkey, mr->rkey, mr};
  }
  void deregister(const Registration& registration) noexcept override {
    if (registration.handle != nullptr) verbs().dereg_mr(static_cast<ibv_mr*>(registration.handle));
  }
  ~Device() override {
    const VerbsApi& api = verbs();
    if (cq) api.destroy_cq(cq);
    if (channel) api.destroy_comp_channel(channel);
    if (pd) api.dealloc_pd(pd);
    if (context) api.close_device(context);
  }
};

struct IbverbsTransport::Peer {
  Peer(int me, int rank) : rank(rank), rendezvous(me, rank) {}
  // Before the completion queue (the transport's device_ outlives its peers), and before the
  // control buffer's registration goes (members are destroyed after this body).
  ~Peer() {
    if (qp != nullptr) verbs().destroy_qp(qp);
  }
  const int rank;
  tcp::Fd side;  // the set-up socket; aborts and the peer's end arrive here
  ibv_qp* qp = nullptr;
  Rendezvous rendezvous;
  bool closed = false;     // its side socket ended with nothing outstanding: it left the job
  std::string side_input;  // an abort being read

  // Control slots: [0, kReceiveSlots) posted receives, then kOfferSlots send buffers. An engine
  // buffer, so the registration cache registers it once.
  AlignedBuffer<std::uint8_t> control;
  RegistrationCache::Lease control_lease;
  std::vector<std::uint32_t> free_offer_slots;
  std::deque<wire::ClearToSend> offers_waiting;  // no slot or no send queue room yet

  int sends_posted = 0;  // send work requests on the queue pair, not yet completed
  struct PendingWrite {
    Request* send;
    wire::ClearToSend offer;
  };
  std::deque<PendingWrite> writes_waiting;   // no send queue room yet
  std::map<std::uint32_t, Request*> writes;  // posted, by write id
  std::uint32_t next_write_id = 0;

  std::uint8_t* slot(std::uint32_t index) { return control.data() + index * kSlotBytes; }
  // A work request's one scatter/gather entry: the whole control slot.
  ibv_sge slot_entry(std::uint32_t index) {
    ibv_sge sge{};
    sge.addr = reinterpret_cast<std::uint64_t>(slot(index));
    sge.length = kSlotBytes;
    sge.lkey = control_lease.registration.lkey;
    return sge;
  }
};

}  // namespace onebit::transport::ibverbs
