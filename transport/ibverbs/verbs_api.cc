#include "transport/ibverbs/verbs_api.h"

#include <dlfcn.h>

#include <atomic>

#include "common/error.h"

namespace onebit::transport::ibverbs {
namespace {

struct Loaded {
  VerbsApi api{};
  std::string error;  // empty: loaded
};

// Every symbol at the version rdma-core has exported since 2006 (IBVERBS_1.1), which is also what
// verbs.h's declarations bind to; plain lookup for a library built without symbol versions.
template <typename F>
bool bind(void* library, const char* name, F*& out, std::string* error) {
  void* symbol = ::dlvsym(library, name, "IBVERBS_1.1");
  if (symbol == nullptr) symbol = ::dlsym(library, name);
  if (symbol == nullptr) {
    *error = std::string("libibverbs.so.1 has no ") + name + " (rdma-core too old?)";
    return false;
  }
  out = reinterpret_cast<F*>(symbol);
  return true;
}

Loaded load() {
  Loaded loaded;
  void* library = ::dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* why = ::dlerror();
    loaded.error = std::string("cannot load libibverbs.so.1 (install rdma-core / libibverbs1): ") + (why ? why : "");
    return loaded;
  }
  VerbsApi& a = loaded.api;
  std::string& e = loaded.error;
  // The library stays loaded for the life of the process: providers keep threads and state.
  bind(library, "ibv_get_device_list", a.get_device_list, &e) &&
      bind(library, "ibv_free_device_list", a.free_device_list, &e) &&
      bind(library, "ibv_get_device_name", a.get_device_name, &e) &&
      bind(library, "ibv_open_device", a.open_device, &e) && bind(library, "ibv_close_device", a.close_device, &e) &&
      bind(library, "ibv_query_device", a.query_device, &e) && bind(library, "ibv_query_port", a.query_port, &e) &&
      bind(library, "ibv_query_gid", a.query_gid, &e) && bind(library, "ibv_alloc_pd", a.alloc_pd, &e) &&
      bind(library, "ibv_dealloc_pd", a.dealloc_pd, &e) && bind(library, "ibv_reg_mr", a.reg_mr, &e) &&
      bind(library, "ibv_dereg_mr", a.dereg_mr, &e) &&
      bind(library, "ibv_create_comp_channel", a.create_comp_channel, &e) &&
      bind(library, "ibv_destroy_comp_channel", a.destroy_comp_channel, &e) &&
      bind(library, "ibv_create_cq", a.create_cq, &e) && bind(library, "ibv_destroy_cq", a.destroy_cq, &e) &&
      bind(library, "ibv_get_cq_event", a.get_cq_event, &e) &&
      bind(library, "ibv_ack_cq_events", a.ack_cq_events, &e) && bind(library, "ibv_create_qp", a.create_qp, &e) &&
      bind(library, "ibv_modify_qp", a.modify_qp, &e) && bind(library, "ibv_destroy_qp", a.destroy_qp, &e) &&
      bind(library, "ibv_wc_status_str", a.wc_status_str, &e);
  return loaded;
}

const Loaded& loaded() {
  static const Loaded once = load();
  return once;
}

std::atomic<const VerbsApi*> stand_in{nullptr};

}  // namespace

void use_verbs_for_testing(const VerbsApi* api) { stand_in = api; }

const VerbsApi& verbs() {
  if (const VerbsApi* api = stand_in.load()) return *api;
  const Loaded& l = loaded();
  ONEBIT_CHECK(l.error.empty(), ONEBIT_SYSTEM_ERROR, "ONEBIT_TRANSPORT=ibverbs: ", l.error);
  return l.api;
}

bool verbs_loadable(std::string* why_not) {
  if (stand_in.load() != nullptr) return true;
  const Loaded& l = loaded();
  if (why_not != nullptr) *why_not = l.error;
  return l.error.empty();
}

}  // namespace onebit::transport::ibverbs
