// The Gloo front door. Loaded with LD_PRELOAD, this library defines gloo::allreduce — the one
// function every dense CPU allreduce of PyTorch's gloo backend goes through — ahead of libgloo's.
// A call on a tagged fp32 buffer, in place, with a sum, runs onebit's compressed allreduce; every
// other call goes to libgloo's own gloo::allreduce untouched (found with dlsym(RTLD_NEXT)).
//
// The compressed call uses onebit's TCP transport, one communicator per gloo::Context, created on
// the context's first tagged call: rank 0 picks a port, the address travels over the context itself
// (a gloo broadcast under the intercepted call's own tag), every rank joins. (Issue 5 asks for the
// context's own pairs by default; that transport is not written yet — docs/design.md.)
#include <dlfcn.h>

#include <gloo/allreduce.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include "common/error.h"
#include "common/log.h"
#include "common/params.h"
#include "onebit/preload.h"
#include "plugin/capi/abi_guard.h"
#include "plugin/engine/communicator.h"
#include "transport/tcp/socket.h"

namespace onebit::preload {
namespace {

using AllreduceFunction = void (*)(const gloo::AllreduceOptions&);

AllreduceFunction real_allreduce() {
  static const AllreduceFunction function = [] {
    auto* found = reinterpret_cast<AllreduceFunction>(dlsym(RTLD_NEXT, "_ZN4gloo9allreduceERKNS_16AllreduceOptionsE"));
    if (found == nullptr) {
      ONEBIT_LOG(WARN, "preload: libgloo's gloo::allreduce not found (", dlerror(),
                 "); libonebit-preload.so must be linked after libgloo");
    }
    return found;
  }();
  return function;
}

using ReduceFunction = std::function<void(void*, const void*, const void*, std::size_t)>;

// Whether a reduce function adds floats. PyTorch passes a pointer to its own instantiation of
// gloo::sum<float>, which need not be ours, so the function is asked rather than compared.
bool is_float_sum(const ReduceFunction& reduce) {
  if (!reduce) return false;
  const float a[2] = {1.5f, -2.0f}, b[2] = {0.25f, 4.0f};
  float c[2] = {0.0f, 0.0f};
  reduce(c, a, b, 2);
  return c[0] == 1.75f && c[1] == 2.0f;
}

struct Front {
  std::mutex mutex;
  std::map<const gloo::Context*, std::unique_ptr<Communicator>> communicators;
};

Front& front() {
  static Front* instance = new Front();  // leaked: frameworks tear down contexts at exit
  return *instance;
}

// This context's communicator, joined on first use. Every rank makes the same tagged calls in the
// same order, so every rank gets here on the same call.
Communicator& communicator_for(const std::shared_ptr<gloo::Context>& context, std::uint32_t tag,
                               std::chrono::milliseconds timeout) {
  Front& f = front();
  std::lock_guard<std::mutex> lock(f.mutex);
  auto found = f.communicators.find(context.get());
  if (found != f.communicators.end()) return *found->second;

  char root[256] = {0};
  if (!param::Root().empty()) {
    std::snprintf(root, sizeof(root), "%s", param::Root().c_str());
  } else if (context->rank == 0) {
    const char* master = std::getenv("MASTER_ADDR");
    const std::string host = master != nullptr && *master != '\0' ? master : "127.0.0.1";
    // A free port on rank 0's host, for the bootstrap root; it travels to every rank below.
    tcp::Address any = tcp::parse_host_port(host + ":0", "MASTER_ADDR");
    const int port = [&] {
      tcp::Fd probe = tcp::listen_on(any, 1);
      return static_cast<int>(tcp::local_address(probe.get()).port());
    }();
    std::snprintf(root, sizeof(root), "%s:%d", host.c_str(), port);
  }
  if (param::Root().empty()) {
    gloo::BroadcastOptions broadcast(context);
    broadcast.setOutput(root, sizeof(root));
    broadcast.setRoot(0);
    broadcast.setTag(tag);  // the intercepted call's tag: its own gloo traffic never happens
    broadcast.setTimeout(timeout);
    gloo::broadcast(broadcast);
  }
  CommSetup setup;
  setup.rank = context->rank;
  setup.size = context->size;
  setup.root = root;
  setup.timeout_ms = timeout.count();
  ONEBIT_LOG(INFO, "preload: gloo context ", context.get(), " (rank ", setup.rank, " of ", setup.size,
             "): joining onebit at ", setup.root);
  auto made = std::make_unique<Communicator>(setup);
  Communicator& comm = *made;
  f.communicators[context.get()] = std::move(made);
  return comm;
}

// Decides and, if it takes the call, runs it. False: the caller forwards to libgloo.
bool take(const gloo::detail::AllreduceOptionsImpl& call) {
  if (param::Enable() == 0) return false;
  if (call.out.size() != 1 || call.elementSize != sizeof(float)) return false;
  if (!call.in.empty() && (call.in.size() != 1 || call.in[0]->ptr != call.out[0]->ptr)) return false;
  void* buffer = call.out[0]->ptr;
  std::shared_ptr<Tag> tag = TagRegistry::instance().find(buffer);
  if (!tag || tag->count != call.elements || tag->dtype != kernels::Dtype::kFloat32) return false;
  if (!is_float_sum(call.reduce)) {
    ONEBIT_LOG(INFO, "preload: tag '", tag->name, "': not a float sum; forwarded to gloo");
    return false;
  }
  ONEBIT_LOG(TRACE, "preload: tag '", tag->name, "': ", call.elements, " floats, compressed");
  Communicator& comm = communicator_for(call.context, call.tag, call.timeout);
  comm.compressed_allreduce(*tag, buffer, call.elements, kernels::Dtype::kFloat32, ReduceOp::kSum);
  return true;
}

}  // namespace
}  // namespace onebit::preload

namespace gloo {

// Declared a friend by gloo::AllreduceOptions, which is how it reads the call's options.
void allreduce(const AllreduceOptions& opts) {
  bool taken = false;
  try {
    taken = onebit::preload::take(opts.impl_);
  } catch (const onebit::Error& error) {
    // Gloo reports failures by throwing; PyTorch turns them into a Python RuntimeError.
    throw ::gloo::IoException(std::string("onebit: ") + error.what());
  }
  if (taken) return;
  auto real = onebit::preload::real_allreduce();
  if (real == nullptr) throw ::gloo::Exception("onebit: libgloo's gloo::allreduce is not available to forward to");
  real(opts);
}

}  // namespace gloo

extern "C" onebit_result_t onebit_preload_stats(onebit_stats_t* stats) {
  return onebit::abi_guard("onebit_preload_stats", [&] {
    ONEBIT_CHECK(stats != nullptr, ONEBIT_INVALID_ARGUMENT, "stats is NULL");
    *stats = onebit_stats_t{};
    auto& f = onebit::preload::front();
    std::lock_guard<std::mutex> lock(f.mutex);
    for (const auto& [context, comm] : f.communicators) {
      const onebit_stats_t s = comm->stats();
      stats->compressed_calls += s.compressed_calls;
      stats->full_precision_calls += s.full_precision_calls;
      stats->bytes_sent += s.bytes_sent;
      stats->bytes_received += s.bytes_received;
      stats->compressed_bytes_sent += s.compressed_bytes_sent;
      stats->full_precision_bytes_sent += s.full_precision_bytes_sent;
    }
  });
}
