#include "engine/communicator.h"

#include "common/error.h"
#include "common/launcher.h"
#include "common/log.h"
#include "common/params.h"
#include "common/siphash.h"
#include "transport/factory.h"
#include "transport/tcp/tcp_transport.h"

namespace onebit {
namespace {

std::atomic<std::uint64_t> next_comm_id{1};

void check_rank_limit(int size) {
  ONEBIT_CHECK(size <= Communicator::kMaxRanks, ONEBIT_INVALID_ARGUMENT, "a communicator of ", size,
               " ranks: onebit takes at most ", Communicator::kMaxRanks,
               " (its ring numbers 2 (W-1) steps in 16-bit message parts)");
}

const CommSetup& within_rank_limit(const CommSetup& setup) {
  check_rank_limit(setup.size);
  return setup;
}

// The ranks per host a communicator of `size` ranks uses (1: flat). `requested` > 0 is explicit
// (CommSetup::local_size); otherwise ONEBIT_LOCAL_SIZE, else torchrun's LOCAL_WORLD_SIZE, for a
// communicator of the job's whole world only: a subgroup's ranks are not numbered host by host.
// A value onebit's own variable (or the caller) sets must fit, or the communicator is refused;
// torchrun's, which the user did not set for onebit, falls back to flat with a warning. `say`:
// log what was decided (a communicator's making does; a question asked again, as a checkpoint's
// layout is, does not repeat it).
int resolve_local_size(int requested, int rank, int size, bool say = true) {
  std::string from = "the communicator's local_size";
  long long local = requested;
  bool explicit_value = true;
  if (requested <= 0) {
    std::string unused;
    const std::int64_t env_world = param::WorldSize() >= 0 ? param::WorldSize() : launcher_world_size(&unused);
    if (param::LocalSize() >= 0) {
      local = param::LocalSize();
      from = "ONEBIT_LOCAL_SIZE";
    } else {
      local = launcher_local_world_size(&from);
      explicit_value = false;
      if (local < 0) return 1;
    }
    if (env_world >= 0 && env_world != size) {
      if (say)
        ONEBIT_LOG(INFO, "rank ", rank, "/", size, ": ", from, "=", local, " is for the job's ", env_world,
                   " ranks; this communicator of ", size, " compresses flat");
      return 1;
    }
  }
  auto refuse = [&](const std::string& why) {
    if (explicit_value) fail(ONEBIT_INVALID_ARGUMENT, "rank ", rank, "/", size, ": ", from, "=", local, " ", why);
    if (say) ONEBIT_LOG(WARN, "rank ", rank, "/", size, ": ", from, "=", local, " ", why, "; compressing flat");
    return 1;
  };
  if (local < 1) return refuse("is not a number of ranks per host (1 or more)");
  if (size % local != 0) {
    return refuse("does not divide the " + std::to_string(size) +
                  " ranks: every host must run the same number of ranks");
  }
  if (requested <= 0) {
    std::string local_rank_from;
    const int local_rank = launcher_local_rank(&local_rank_from);
    if (local_rank >= 0 && local_rank != rank % local) {
      return refuse("but " + local_rank_from + " is " + std::to_string(local_rank) + ", not rank % " +
                    std::to_string(local) + " = " + std::to_string(rank % local) +
                    ": the ranks are not numbered host by host (h*L ... h*L+L-1)");
    }
  }
  if (say && local > 1 && local < size) {
    ONEBIT_LOG(INFO, "rank ", rank, "/", size, ": hierarchical compression, ", local, " ranks per host (", from, "), ",
               size / local, " hosts");
  }
  return static_cast<int>(local);
}

}  // namespace

CommSetup CommSetup::from_environment() {
  CommSetup setup;
  std::string rank_from = "ONEBIT_RANK", size_from = "ONEBIT_WORLD_SIZE";
  setup.rank = static_cast<int>(param::Rank());
  if (setup.rank < 0) setup.rank = launcher_rank(&rank_from);
  setup.size = static_cast<int>(param::WorldSize());
  if (setup.size < 0) setup.size = launcher_world_size(&size_from);
  ONEBIT_CHECK(setup.rank >= 0, ONEBIT_INVALID_ARGUMENT,
               "no rank in the environment: set ONEBIT_RANK (or run under torchrun, mpirun or srun)");
  ONEBIT_CHECK(setup.size >= 1, ONEBIT_INVALID_ARGUMENT,
               "no world size in the environment: set ONEBIT_WORLD_SIZE (or run under torchrun, mpirun or srun)");
  setup.root = param::Root();
  setup.root_served_at_once = true;
  if (setup.root.empty()) {
    const std::string host = launcher_master_addr();
    ONEBIT_CHECK(!host.empty(), ONEBIT_INVALID_ARGUMENT,
                 "no bootstrap address: set ONEBIT_ROOT=host:port (rank 0's host) or MASTER_ADDR");
    const std::string port = std::to_string(param::RootPort());
    setup.root = host.find(':') != std::string::npos ? "[" + host + "]:" + port : host + ":" + port;
  }
  ONEBIT_LOG(INFO, "communicator from the environment: rank ", setup.rank, " (", rank_from, ") of ", setup.size, " (",
             size_from, "), root ", setup.root);
  return setup;
}

namespace {
transport::tcp::TransportOptions transport_options(const CommSetup& setup) {
  transport::tcp::TransportOptions options;
  options.sockets_per_peer =
      setup.sockets_per_peer > 0 ? setup.sockets_per_peer : static_cast<int>(param::SocketsPerPeer());
  const std::int64_t timeout = setup.timeout_ms > 0 ? setup.timeout_ms : param::TimeoutMs();
  ONEBIT_CHECK(timeout > 0, ONEBIT_INVALID_ARGUMENT, "ONEBIT_TIMEOUT_MS=", timeout, " must be positive");
  options.timeout = std::chrono::milliseconds(timeout);
  options.ifname = setup.socket_ifname.empty() ? param::SocketIfname() : setup.socket_ifname;
  options.membership.auth_key = setup.auth_key.empty() ? param::AuthKey() : setup.auth_key;
  options.membership.identity = setup.identity.empty() ? launcher_job_identity() : setup.identity;
  if (options.membership.identity.empty()) {
    ONEBIT_LOG(INFO, "rank ", setup.rank, "/", setup.size,
               ": this communicator has no identity (no job_id, "
               "ONEBIT_JOB_ID or launcher variables): another job of ",
               setup.size,
               " ranks on the same root "
               "address could join it");
  }
  options.membership.secret = setup.secret;
  options.max_unexpected_bytes = static_cast<std::uint64_t>(param::UnexpectedMb()) << 20;
  options.root_served_at_once = setup.root_served_at_once;
  return options;
}

int checked_size(const CommSetup& s) {
  ONEBIT_CHECK(s.size >= 1, ONEBIT_INVALID_ARGUMENT, "size ", s.size, " must be at least 1");
  ONEBIT_CHECK(s.rank >= 0 && s.rank < s.size, ONEBIT_INVALID_ARGUMENT, "rank ", s.rank, " is out of range for size ",
               s.size);
  return s.size;
}

std::unique_ptr<Transport> make_transport(const CommSetup& setup) {
  return open_transport(setup.rank, checked_size(setup), setup.root, transport_options(setup));
}
}  // namespace

Communicator::Communicator(const CommSetup& setup)
    : id_(next_comm_id++),
      transport_(make_transport(within_rank_limit(setup))),
      kernels_(kernels::cpu_kernels()),
      local_size_(resolve_local_size(setup.local_size, transport_->rank(), transport_->size())) {}

Communicator::Communicator(std::unique_ptr<Transport> transport, int local_size)
    : id_(next_comm_id++),
      transport_(std::move(transport)),
      kernels_(kernels::cpu_kernels()),
      local_size_(resolve_local_size(local_size, transport_->rank(), transport_->size())) {
  check_rank_limit(transport_->size());
}

int Communicator::ranks_per_host_from_environment(int rank, int size) {
  const int local = resolve_local_size(0, rank, size, /*say=*/false);
  return local > 1 && local < size ? local : 1;
}

Communicator::~Communicator() {
  close();
  TagRegistry::instance().forget_communicator(id_);
}

Communicator::CallScope::CallScope(Communicator& comm) : comm_(comm) {
  std::lock_guard<std::mutex> lock(comm.calls_mutex_);
  ONEBIT_CHECK(!comm.closing_, ONEBIT_INVALID_ARGUMENT, comm.where(), ": the communicator is being destroyed");
  ++comm.calls_in_flight_;
}

Communicator::CallScope::~CallScope() {
  std::lock_guard<std::mutex> lock(comm_.calls_mutex_);
  if (--comm_.calls_in_flight_ == 0) comm_.calls_left_.notify_all();
}

void Communicator::close() {
  std::unique_lock<std::mutex> lock(calls_mutex_);
  closing_ = true;
  if (calls_in_flight_ == 0) return;
  // Only a call still running is failed: after a clean last call the peers must not hear an abort.
  lock.unlock();
  transport_->abort(ONEBIT_INVALID_ARGUMENT, where() +
                                                 ": the communicator was destroyed while this call ran "
                                                 "(onebit_comm_destroy on another thread)");
  lock.lock();
  calls_left_.wait(lock, [&] { return calls_in_flight_ == 0; });
}

std::string Communicator::where() const { return "rank " + std::to_string(rank()) + "/" + std::to_string(size()); }

Deadline Communicator::call_deadline() const { return Clock::now() + transport_->timeout(); }

void Communicator::allreduce(void* buffer, std::size_t count, kernels::Dtype dtype, ReduceOp op) {
  CallScope scope(*this);
  ONEBIT_CHECK(buffer != nullptr || count == 0, ONEBIT_INVALID_ARGUMENT, where(), ": buffer is NULL with count ",
               count);
  std::shared_ptr<Tag> tag = TagRegistry::instance().find(buffer);
  if (tag) {
    ONEBIT_CHECK(tag->count == count && tag->dtype == dtype, ONEBIT_INVALID_ARGUMENT, where(), ": buffer ", buffer,
                 " is tagged '", tag->name, "' with ", tag->count, " elements of ", kernels::dtype_name(tag->dtype),
                 " but the call passes ", count, " elements of ", kernels::dtype_name(dtype));
    compressed_allreduce(*tag, buffer, count, dtype, op);
  } else {
    ring_allreduce(buffer, count, dtype, op);
  }
}

void Communicator::check_topology(const Tag& tag) {
  std::lock_guard<std::mutex> lock(topology_mutex_);
  if (topology_checked_) return;
  const int world = size();
  const int me = rank();
  // Every rank tells every other its ranks per host, once: a rank that counts hosts differently
  // would otherwise wait for messages nobody sends, until the timeout. On channel 0, not the
  // call's: concurrent first calls of different tags may reach this in another order on each rank.
  const std::uint32_t channel = 0;
  std::vector<std::int32_t> theirs(world, 0);
  const std::int32_t mine = hierarchical() ? local_size_ : 1;  // flat is flat, whatever the count said
  std::vector<Request> requests(2 * (world - 1));
  std::vector<Request*> all;
  const wire::MessageKey key{0, 0, wire::Kind::kTopology, 0};
  const wire::CallShape shape{static_cast<std::uint64_t>(world), 0, 0};
  std::size_t next = 0;
  for (int p = 0; p < world; ++p) {
    if (p == me) continue;
    transport_->irecv(requests[next], p, channel, key, shape, &theirs[p], sizeof(std::int32_t));
    all.push_back(&requests[next++]);
    transport_->isend(requests[next], p, channel, key, shape, &mine, sizeof(std::int32_t));
    all.push_back(&requests[next++]);
  }
  try {
    transport_->wait_all(all, call_deadline(), [](const Request&) {
      return std::string(
          "the ranks-per-host exchange of the first tagged call (does every rank set the same "
          "ONEBIT_LOCAL_SIZE or LOCAL_WORLD_SIZE?)");
    });
  } catch (const Error& error) {
    fail(error.code(), where(), ": allreduce of tag '", tag.name,
         "': the ranks-per-host exchange before the first "
         "tagged call failed (",
         mine, " rank(s) per host here); buffer and error state unchanged: ", error.what());
  }
  for (int p = 0; p < world; ++p) {
    ONEBIT_CHECK(p == me || theirs[p] == mine, ONEBIT_MISMATCH, where(), ": allreduce of tag '", tag.name,
                 "': this rank runs ", mine, " rank(s) per host", mine == 1 ? " (flat)" : "", " but rank ", p, " runs ",
                 theirs[p], theirs[p] == 1 ? " (flat)" : "",
                 "; every rank must set the same ONEBIT_LOCAL_SIZE (or LOCAL_WORLD_SIZE)");
  }
  topology_checked_ = true;
}

StageTimes Communicator::compressed_stage_times() const {
  std::lock_guard<std::mutex> lock(stage_mutex_);
  return stage_times_;
}

onebit_stats_t Communicator::stats() const {
  const TransportStats t = transport_->stats();
  onebit_stats_t s{};
  s.compressed_calls = compressed_calls_;
  s.full_precision_calls = full_precision_calls_;
  s.bytes_sent = t.bytes_sent;
  s.bytes_received = t.bytes_received;
  s.compressed_bytes_sent = compressed_bytes_;
  s.full_precision_bytes_sent = full_precision_bytes_;
  return s;
}

}  // namespace onebit
