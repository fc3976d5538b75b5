// The Gloo front door. Loaded with LD_PRELOAD, this library defines gloo::allreduce — the one
// function every dense CPU allreduce of PyTorch's gloo backend goes through — ahead of libgloo's.
// A call on a tagged fp32 or fp16 buffer, in place, with a sum, runs onebit's compressed allreduce;
// every other call goes to libgloo's own gloo::allreduce untouched (transport/gloo/libgloo.h).
// Under a PyTorch that bundles its own gloo (pip wheels) it forwards everything: see
// real_allreduce().
//
// Each gloo::Context gets one onebit communicator, made on the context's first tagged call. Its
// transport (ONEBIT_TRANSPORT):
//   gloo  the context's own pairs (transport/gloo), under onebit's slot prefix and the call's tag;
//   tcp   onebit's TCP mesh: rank 0 picks a port and a random identity and secret, which travel
//         over the context itself (a gloo broadcast under the intercepted call's own tag); every
//         rank joins, and nothing that was not told them can.
//
// Every rank must decide alike, or the job hangs: the decision depends only on the tag (name,
// element count, dtype) and the call's shape, which every rank of a correct program shares.
#include <dlfcn.h>

#include <cstring>
#include <string>

#include <gloo/allreduce.h>
#include <gloo/common/error.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "common/crypto.h"
#include "common/error.h"
#include "common/launcher.h"
#include "common/log.h"
#include "common/params.h"
#include "engine/communicator.h"
#include "onebit/preload.h"
#include "plugin/capi/abi_guard.h"
#include "transport/gloo/gloo_transport.h"
#include "transport/gloo/libgloo.h"
#include "transport/tcp/bootstrap.h"
#include "transport/tcp/root_listener.h"
#include "transport/tcp/socket.h"

namespace onebit::front::gloo {
namespace {

using AllreduceFunction = void (*)(const ::gloo::AllreduceOptions&);
constexpr const char* kAllreduceSymbol = "_ZN4gloo9allreduceERKNS_16AllreduceOptionsE";

// The gloo::allreduce the framework would have called without this library, and whose it is.
//
// Debian's PyTorch links libgloo.so.0, the gloo this library is built against: its options and
// context layouts are ours, and libgloo() finds it in the process (this library does not link it,
// so that it never shadows another gloo). pip
// wheels bundle a gloo of their own inside libtorch_cpu.so — exported and called through the PLT,
// so this definition still takes its calls, but of another gloo version, whose AllreduceOptions
// and Context layouts this library does not know (reading them crashed in a test). There every
// call goes to the bundled gloo::allreduce untouched, and nothing is compressed: the way in for
// such a PyTorch is onebit's torch.distributed backend (python/onebit/backend.py), and the first
// call says so in a WARN line.
struct RealAllreduce {
  AllreduceFunction function = nullptr;
  bool bundled = false;  // the framework's own gloo, not libgloo.so.0
  std::string library;
};

const RealAllreduce& real_allreduce() {
  static const RealAllreduce real = [] {
    RealAllreduce r;
    // libtorch_cpu.so is loaded in a local scope (Python extensions are): look there first.
    if (void* torch = dlopen("libtorch_cpu.so", RTLD_NOW | RTLD_NOLOAD)) {
      void* own = dlsym(torch, kAllreduceSymbol);
      Dl_info info{};
      if (own != nullptr && dladdr(own, &info) != 0 && info.dli_fname != nullptr &&
          std::strstr(info.dli_fname, "libtorch_cpu") != nullptr) {
        r.function = reinterpret_cast<AllreduceFunction>(own);
        r.bundled = true;
        r.library = info.dli_fname;
      }
      dlclose(torch);  // NOLOAD took a reference; torch stays loaded
    }
    if (r.function == nullptr) {
      const transport::gloo::Libgloo& gloo = transport::gloo::libgloo();
      r.function = gloo.allreduce;
      r.library = gloo.path;
      if (r.function == nullptr) r.library = gloo.error;
    }
    if (r.function == nullptr) {
      ONEBIT_LOG(WARN, "preload: libgloo's ::gloo::allreduce not found (", r.library,
                 "): nothing of this process calls gloo, or its gloo is not libgloo.so.0");
    } else if (r.bundled) {
      ONEBIT_LOG(WARN, "preload: this PyTorch bundles its own gloo (", r.library,
                 ", as pip wheels do), not the libgloo.so.0 libonebit-preload.so was built for: every allreduce "
                 "goes to it untouched and nothing is compressed. Unset LD_PRELOAD and use onebit's "
                 "torch.distributed backend: onebit.register_backend(); dist.init_process_group(\"onebit\", ...) "
                 "(docs/usage/pytorch.md)");
    } else {
      ONEBIT_LOG(INFO, "preload: forwarding to ::gloo::allreduce in ", r.library);
    }
    return r;
  }();
  return real;
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

// Whether a reduce function adds halfs (gloo::float16, IEEE binary16 bits).
bool is_half_sum(const ReduceFunction& reduce) {
  if (!reduce) return false;
  const std::uint16_t a[2] = {0x3e00, 0xc000}, b[2] = {0x3400, 0x4400};  // 1.5, −2; 0.25, 4
  std::uint16_t c[2] = {0, 0};
  reduce(c, a, b, 2);
  return c[0] == 0x3f00 && c[1] == 0x4000;  // 1.75, 2
}

// The door's process-wide state: a communicator per gloo context it has compressed a call on, and
// the calls it forwarded to libgloo (onebit_preload_stats).
struct GlooDoor {
  std::mutex mutex;
  struct Entry {
    std::weak_ptr<::gloo::Context> context;  // expired: the framework destroyed it (and maybe reused the address)
    std::unique_ptr<Communicator> communicator;
  };
  std::map<const ::gloo::Context*, Entry> communicators;
  std::atomic<std::uint64_t> forwarded_calls{0};
  std::atomic<std::uint64_t> forwarded_bytes{0};
};

GlooDoor& door() {
  static GlooDoor* instance = new GlooDoor();  // leaked: frameworks tear down contexts at exit
  return *instance;
}

// What rank 0 tells every rank of a gloo context before onebit's TCP bootstrap: where the root is,
// and the communicator's identity and secret — random, so that only this context's ranks can join
// (transport/tcp/bootstrap.h), whatever else runs on the host. Rank 0 listens at `root` before it
// sends it; when it cannot, `root` is empty and `failure` says why, so every rank fails now.
struct Invitation {
  char root[256] = {0};
  char identity[48] = {0};
  char secret[72] = {0};
  char failure[512] = {0};
};

// Each rank's answer to the invitation (empty text: it reaches the root), gathered by rank 0, and
// rank 0's verdict sent back: the answers of the ranks that cannot, one result code for all.
struct Answer {
  std::int32_t code = ONEBIT_SUCCESS;
  char text[1024] = {0};
};

// Whether this context is the job's first whole world, as seen from its rank 0: the launcher's
// rank 0 and world size (without a launcher: the first context). Only that one takes ONEBIT_ROOT,
// or a port on MASTER_ADDR's host; any other (a subgroup, whose rank 0 may run anywhere, or a later
// world) takes a free port on this host's address on the route there, so that two communicators
// never compete for one address.
bool first_world_of_job(const ::gloo::Context& context) {
  static std::atomic<bool> served{false};
  std::string from;
  const int job_rank = launcher_rank(&from), job_size = launcher_world_size(&from);
  if (job_rank > 0 || (job_size > 0 && context.size != job_size)) return false;
  return !served.exchange(true);
}

// Rank 0's root, listened on now and held for the communicator (root_listener.h).
std::string listen_for_root(const ::gloo::Context& context) {
  namespace tcp = transport::tcp;
  const bool first_world = first_world_of_job(context);
  if (first_world && !param::Root().empty()) {
    return tcp::open_root_listener(tcp::parse_host_port(param::Root(), "ONEBIT_ROOT")).to_string();
  }
  const std::string master = launcher_master_addr();
  const std::string master_host = !master.empty() ? master : "127.0.0.1";
  const bool ipv6 = master_host.find(':') != std::string::npos;
  tcp::Address any = param::Root().empty()
                         ? tcp::parse_host_port(ipv6 ? "[" + master_host + "]:0" : master_host + ":0", "MASTER_ADDR")
                         : tcp::parse_host_port(param::Root(), "ONEBIT_ROOT");
  if (!first_world) any = tcp::address_toward(any);
  any.set_port(0);
  return tcp::open_root_listener(any).to_string();
}

Invitation invitation_from_rank_0(const ::gloo::Context& context) {
  Invitation invitation;
  try {
    std::snprintf(invitation.root, sizeof(invitation.root), "%s", listen_for_root(context).c_str());
  } catch (const Error& error) {
    std::snprintf(invitation.failure, sizeof(invitation.failure),
                  "rank 0 cannot serve the bootstrap root of gloo context (%d ranks): %s", context.size, error.what());
  }
  std::uint8_t id[8], secret[32];
  crypto::random_bytes(id, sizeof(id));
  crypto::random_bytes(secret, sizeof(secret));
  std::snprintf(invitation.identity, sizeof(invitation.identity), "gloo context %s",
                crypto::hex(id, sizeof(id)).c_str());
  std::snprintf(invitation.secret, sizeof(invitation.secret), "%s", crypto::hex(secret, sizeof(secret)).c_str());
  return invitation;
}

// Rank 0 sends `value` to every rank (part `part` of onebit's topology messages), or every rank
// sends its `value` to rank 0 (`gathered`: one per rank, rank 0's own left as it is).
template <typename T>
void over_pairs(transport::gloo::GlooTransport& pairs, const ::gloo::Context& context, std::uint32_t tag,
                std::uint16_t part, T* value, std::vector<T>* gathered, std::chrono::milliseconds timeout,
                const char* what) {
  const wire::MessageKey key{0, 0, wire::Kind::kTopology, part};
  const wire::CallShape shape{sizeof(T), 0, 0};
  std::vector<Request> requests(context.rank == 0 ? context.size - 1 : 1);
  std::vector<Request*> all;
  for (int peer = 1; context.rank == 0 && peer < context.size; ++peer) {
    T* at = gathered != nullptr ? &(*gathered)[peer] : value;
    if (gathered != nullptr) {
      pairs.irecv(requests[peer - 1], peer, tag, key, shape, at, sizeof(T));
    } else {
      pairs.isend(requests[peer - 1], peer, tag, key, shape, at, sizeof(T));
    }
    all.push_back(&requests[peer - 1]);
  }
  if (context.rank != 0) {
    if (gathered != nullptr) {
      pairs.isend(requests[0], 0, tag, key, shape, value, sizeof(T));
    } else {
      pairs.irecv(requests[0], 0, tag, key, shape, value, sizeof(T));
    }
    all.push_back(&requests[0]);
  }
  pairs.wait_all(all, Clock::now() + timeout, [what](const Request&) { return std::string(what); });
}

// Text a peer wrote into a fixed field, read no further than the field (snprintf ends it with a NUL,
// but the bytes came over the wire).
template <std::size_t N>
std::string field_text(const char (&field)[N]) {
  return std::string(field, strnlen(field, N));
}

// Rank 0's verdict on the ranks' answers: which cannot reach the root (the first 16 named) and the
// first one's reason, under its code.
Answer verdict(const std::vector<Answer>& answers) {
  Answer verdict;
  std::vector<int> failed;
  for (int r = 0; r < static_cast<int>(answers.size()); ++r) {
    if (answers[r].code != ONEBIT_SUCCESS) failed.push_back(r);
  }
  if (failed.empty()) return verdict;
  verdict.code = answers[failed[0]].code;
  std::string named;
  for (std::size_t i = 0; i < failed.size() && i < 16; ++i)
    named.append(i ? ", " : "").append(std::to_string(failed[i]));
  if (failed.size() > 16) named.append(", ...");
  std::snprintf(verdict.text, sizeof(verdict.text),
                "rank(s) %s (%zu of %zu) cannot reach the root; rank %d's reason: %s", named.c_str(), failed.size(),
                answers.size(), failed[0], field_text(answers[failed[0]].text).c_str());
  return verdict;
}

// Sends rank 0's invitation to every rank, then agrees on every rank's answer to whether it reaches
// the root, over the context's own pairs under onebit's slot prefix and the intercepted call's tag
// (whose own gloo traffic never happens). Throws the same error on every rank when rank 0 cannot
// serve a root or a rank cannot reach it.
void agree_on_invitation(const std::shared_ptr<::gloo::Context>& context, std::uint32_t tag,
                         std::chrono::milliseconds timeout, Invitation* invitation) {
  Answer mine, agreed;
  try {
    transport::gloo::GlooTransport pairs(context.get());
    over_pairs<Invitation>(pairs, *context, tag, 1, invitation, nullptr, timeout, "rank 0's invitation");
    if (invitation->failure[0] != '\0') fail(ONEBIT_SYSTEM_ERROR, field_text(invitation->failure));
    if (context->rank != 0) {
      try {
        transport::tcp::check_root_reachable(
            context->rank, transport::tcp::parse_host_port(field_text(invitation->root), "rank 0's root"),
            std::min(timeout, transport::tcp::kRootCheckWindow));
      } catch (const Error& error) {
        mine.code = error.code();
        std::snprintf(mine.text, sizeof(mine.text), "%s", error.what());
      }
    }
    std::vector<Answer> answers(context->rank == 0 ? context->size : 0);
    over_pairs(pairs, *context, tag, 2, &mine, &answers, timeout, "the ranks' answers to the invitation");
    if (context->rank == 0) agreed = verdict(answers);
    over_pairs<Answer>(pairs, *context, tag, 3, &agreed, nullptr, timeout, "rank 0's verdict on the invitation");
  } catch (const Error& error) {
    fail(error.code(), "joining onebit's TCP transport over the gloo context failed: ", error.what());
  }
  if (agreed.code != ONEBIT_SUCCESS) {
    fail(static_cast<onebit_result_t>(agreed.code), "joining onebit's TCP transport over the gloo context (",
         context->size, " ranks) failed: ", field_text(agreed.text));
  }
}

std::unique_ptr<Communicator> join_over_tcp(const std::shared_ptr<::gloo::Context>& context, std::uint32_t tag,
                                            std::chrono::milliseconds timeout) {
  Invitation invitation;
  if (context->rank == 0) invitation = invitation_from_rank_0(*context);
  try {
    agree_on_invitation(context, tag, timeout, &invitation);
    CommSetup setup;
    setup.rank = context->rank;
    setup.size = context->size;
    setup.root = field_text(invitation.root);
    setup.identity = field_text(invitation.identity);
    setup.secret = field_text(invitation.secret);
    setup.timeout_ms = timeout.count();
    ONEBIT_LOG(INFO, "preload: gloo context ", context.get(), " (rank ", setup.rank, " of ", setup.size,
               "): joining onebit's TCP transport at ", setup.root, " as ", setup.identity);
    return std::make_unique<Communicator>(setup);
  } catch (...) {  // rank 0's listener, if no communicator took it, would hold the port until exit
    if (context->rank == 0 && invitation.root[0] != '\0') {
      (void)transport::tcp::take_root_listener(transport::tcp::parse_host_port(field_text(invitation.root), "root"));
    }
    throw;
  }
}

// This context's communicator, made on first use. Every rank makes the same tagged calls in the
// same order, so every rank gets here on the same call (the tcp bootstrap relies on it).
Communicator& communicator_for(const std::shared_ptr<::gloo::Context>& context, std::uint32_t tag,
                               std::chrono::milliseconds timeout) {
  GlooDoor& f = door();
  std::lock_guard<std::mutex> lock(f.mutex);
  for (auto it = f.communicators.begin(); it != f.communicators.end();) {
    it = it->second.context.expired() ? f.communicators.erase(it) : std::next(it);
  }
  auto found = f.communicators.find(context.get());
  if (found != f.communicators.end()) return *found->second.communicator;

  const std::string& transport = param::Transport();
  std::unique_ptr<Communicator> made;
  if (transport == "gloo") {
    ONEBIT_LOG(INFO, "preload: gloo context ", context.get(), " (rank ", context->rank, " of ", context->size,
               "): compressed calls run over its own pairs");
    made = std::make_unique<Communicator>(std::make_unique<transport::gloo::GlooTransport>(context.get()));
  } else if (transport == "tcp" || transport == "ibverbs") {
    made = join_over_tcp(context, tag, timeout);  // the communicator picks its transport from ONEBIT_TRANSPORT
  } else {
    fail(ONEBIT_INVALID_ARGUMENT, "ONEBIT_TRANSPORT=", transport, " is not a transport: use gloo, tcp or ibverbs");
  }
  Communicator& comm = *made;
  f.communicators[context.get()] = GlooDoor::Entry{context, std::move(made)};
  return comm;
}

void count_forwarded(const ::gloo::detail::AllreduceOptionsImpl& call) {
  door().forwarded_calls += 1;
  door().forwarded_bytes += call.elements * call.elementSize;
}

// Compresses the call if it is on a tagged buffer and onebit can stand in for it (in place, the
// tag's dtype and count, a float or half sum), and says so. False: the caller forwards to libgloo.
bool compress_if_tagged(const ::gloo::detail::AllreduceOptionsImpl& call) {
  if (param::Enable() == 0 || call.out.size() != 1) return false;
  void* buffer = call.out[0]->ptr;
  std::shared_ptr<Tag> tag = TagRegistry::instance().find(buffer);
  if (!tag) return false;  // the common case, not logged
  auto forward = [&](const char* why) {
    ONEBIT_LOG(INFO, "preload: tag '", tag->name, "' (", call.elements, " elements of ", call.elementSize,
               " bytes): forwarded to gloo: ", why);
    return false;
  };
  if (!call.in.empty() && (call.in.size() != 1 || call.in[0]->ptr != buffer)) return forward("not in place");
  if (call.elementSize != kernels::dtype_size(tag->dtype)) return forward("element size is not the tag's dtype");
  if (call.elements != tag->count) return forward("element count differs from the tag's");
  switch (tag->dtype) {
    case kernels::Dtype::kFloat32:
      if (!is_float_sum(call.reduce)) return forward("not a float sum");
      break;
    case kernels::Dtype::kFloat16:
      if (!is_half_sum(call.reduce)) return forward("not a float16 sum");
      break;
    case kernels::Dtype::kBFloat16: return forward("gloo has no bfloat16 sum to stand in for");
  }
  ONEBIT_LOG(INFO, "preload: tag '", tag->name, "': ", call.elements, " ", kernels::dtype_name(tag->dtype),
             " (gloo tag ", call.tag, "): compressed");
  Communicator* comm = nullptr;
  try {
    comm = &communicator_for(call.context, call.tag, call.timeout);
  } catch (const ::gloo::Exception& error) {  // the tcp bootstrap's broadcast
    const std::string text = error.what();
    fail(text.find("Timed out") != std::string::npos ? ONEBIT_TIMEOUT : ONEBIT_REMOTE_ERROR, "rank ",
         call.context->rank, ": tag '", tag->name,
         "': joining onebit's TCP transport over the gloo context failed: ", text);
  } catch (const Error& error) {
    fail(error.code(), "rank ", call.context->rank, ": tag '", tag->name, "': ", error.what());
  }
  comm->compressed_allreduce(*tag, buffer, call.elements, tag->dtype, ReduceOp::kSum, call.tag);
  return true;
}

}  // namespace
}  // namespace onebit::front::gloo

namespace gloo {

// Declared a friend by gloo::AllreduceOptions, which is how it reads the call's options.
void allreduce(const AllreduceOptions& opts) {
  const auto& real = onebit::front::gloo::real_allreduce();
  if (real.bundled) return real.function(opts);  // another gloo's options: not ours to read
  bool compressed = false;
  try {
    compressed = onebit::front::gloo::compress_if_tagged(opts.impl_);
  } catch (const onebit::Error& error) {
    // Gloo reports failures by throwing; PyTorch turns them into a Python RuntimeError.
    throw ::gloo::IoException(std::string("onebit: ") + error.what());
  }
  if (compressed) return;
  onebit::front::gloo::count_forwarded(opts.impl_);
  if (real.function == nullptr)
    throw ::gloo::Exception("onebit: libgloo's ::gloo::allreduce is not available to forward to");
  real.function(opts);
}

}  // namespace gloo

extern "C" onebit_result_t onebit_preload_stats(onebit_preload_stats_t* stats) {
  return onebit::abi_guard("onebit_preload_stats", [&] {
    ONEBIT_CHECK(stats != nullptr, ONEBIT_INVALID_ARGUMENT, "stats is NULL");
    *stats = onebit_preload_stats_t{};
    auto& f = onebit::front::gloo::door();
    std::lock_guard<std::mutex> lock(f.mutex);
    for (const auto& [context, entry] : f.communicators) {
      const onebit_stats_t s = entry.communicator->stats();
      stats->onebit.compressed_calls += s.compressed_calls;
      stats->onebit.full_precision_calls += s.full_precision_calls;
      stats->onebit.bytes_sent += s.bytes_sent;
      stats->onebit.bytes_received += s.bytes_received;
      stats->onebit.compressed_bytes_sent += s.compressed_bytes_sent;
      stats->onebit.full_precision_bytes_sent += s.full_precision_bytes_sent;
    }
    stats->forwarded_calls = f.forwarded_calls;
    stats->forwarded_bytes = f.forwarded_bytes;
  });
}
