// The C ABI of include/onebit/onebit.h: versions, result strings, the last error, and
// communicators, tags and allreduce. The optimizer ABI (1-bit Adam, 0/1 Adam, 1-bit LAMB) is
// optimizer_abi.cc.
#include "onebit/onebit.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>

#include "common/log.h"
#include "common/params.h"
#include "common/siphash.h"
#include "engine/communicator.h"
#include "kernels/cpu/cpu_kernels.h"
#include "plugin/capi/abi_guard.h"
#include "transport/tcp/bootstrap.h"
#include "transport/tcp/root_listener.h"

namespace onebit {

std::string& thread_last_error() {
  thread_local std::string message;
  return message;
}

}  // namespace onebit

extern "C" {

int onebit_version(void) { return ONEBIT_VERSION_CODE; }

const char* onebit_result_string(onebit_result_t result) {
  switch (result) {
    case ONEBIT_SUCCESS: return "ONEBIT_SUCCESS";
    case ONEBIT_INVALID_ARGUMENT: return "ONEBIT_INVALID_ARGUMENT";
    case ONEBIT_SYSTEM_ERROR: return "ONEBIT_SYSTEM_ERROR";
    case ONEBIT_TIMEOUT: return "ONEBIT_TIMEOUT";
    case ONEBIT_REMOTE_ERROR: return "ONEBIT_REMOTE_ERROR";
    case ONEBIT_MISMATCH: return "ONEBIT_MISMATCH";
    case ONEBIT_NUMERIC_ERROR: return "ONEBIT_NUMERIC_ERROR";
    case ONEBIT_INTERNAL_ERROR: return "ONEBIT_INTERNAL_ERROR";
    case ONEBIT_UNSUPPORTED: return "ONEBIT_UNSUPPORTED";
    default: break;
  }
  return "ONEBIT_UNKNOWN_RESULT";
}

const char* onebit_last_error(void) { return onebit::thread_last_error().c_str(); }

onebit_result_t onebit_cpu_kernels(const char** name) {
  return onebit::abi_guard("onebit_cpu_kernels", [&] {
    ONEBIT_CHECK(name != nullptr, ONEBIT_INVALID_ARGUMENT, "name is NULL");
    *name = onebit::kernels::cpu_kernels().name;
  });
}

}  // extern "C"

// ---- communicators, tags, allreduce ----

namespace {
// A fixed key: the settings digest tells equal settings from unequal ones, it keeps no secret.
constexpr onebit::SipKey kSettingsKey = {0x6f6e65626974u, 0x73657474696e6773u};
}  // namespace

struct onebit_comm {
  std::unique_ptr<onebit::Communicator> impl;
};

namespace {

onebit::kernels::Dtype to_dtype(onebit_dtype_t dtype) {
  switch (dtype) {
    case ONEBIT_FLOAT32: return onebit::kernels::Dtype::kFloat32;
    case ONEBIT_FLOAT16: return onebit::kernels::Dtype::kFloat16;
    case ONEBIT_BFLOAT16: return onebit::kernels::Dtype::kBFloat16;
    default: break;
  }
  onebit::fail(ONEBIT_INVALID_ARGUMENT, "unknown dtype ", static_cast<int>(dtype),
               " (ONEBIT_FLOAT32, ONEBIT_FLOAT16 or ONEBIT_BFLOAT16)");
}

onebit::ReduceOp to_op(onebit_op_t op) {
  switch (op) {
    case ONEBIT_SUM: return onebit::ReduceOp::kSum;
    case ONEBIT_AVG: return onebit::ReduceOp::kAvg;
    default: break;
  }
  onebit::fail(ONEBIT_INVALID_ARGUMENT, "unknown op ", static_cast<int>(op), " (ONEBIT_SUM or ONEBIT_AVG)");
}

onebit::Communicator& checked(onebit_comm_t comm) {
  ONEBIT_CHECK(comm != nullptr && comm->impl != nullptr, ONEBIT_INVALID_ARGUMENT, "comm is NULL");
  return *comm->impl;
}

onebit_result_t make_comm(const char* entry, onebit_comm_t* comm, const std::function<onebit::CommSetup()>& setup) {
  return onebit::abi_guard(entry, [&] {
    ONEBIT_CHECK(comm != nullptr, ONEBIT_INVALID_ARGUMENT, "comm is NULL");
    *comm = nullptr;
    auto made = std::make_unique<onebit_comm>();
    made->impl = std::make_unique<onebit::Communicator>(setup());
    *comm = made.release();
  });
}

}  // namespace

extern "C" {

onebit_result_t onebit_comm_init(onebit_comm_t* comm, int rank, int size, const char* root) {
  return onebit_comm_init_config(comm, rank, size, root, nullptr);
}

onebit_result_t onebit_root_listen(const char* where, char* root, size_t root_size) {
  return onebit::abi_guard("onebit_root_listen", [&] {
    ONEBIT_CHECK(where != nullptr && root != nullptr, ONEBIT_INVALID_ARGUMENT, "where or root is NULL");
    namespace tcp = onebit::transport::tcp;
    const tcp::Address wanted = tcp::parse_host_port(where, "onebit_root_listen's where");
    // Refused before the listener opens: a buffer too small leaves nothing open.
    ONEBIT_CHECK(root_size > wanted.to_string().size() + 5, ONEBIT_INVALID_ARGUMENT, "root_size ", root_size,
                 " cannot hold an address of ", where, " with its port (give 64 bytes)");
    const std::string bound = tcp::open_root_listener(wanted).to_string();
    std::snprintf(root, root_size, "%s", bound.c_str());
  });
}

onebit_result_t onebit_root_check(int rank, int size, const char* root, int64_t timeout_ms) {
  return onebit::abi_guard("onebit_root_check", [&] {
    ONEBIT_CHECK(root != nullptr, ONEBIT_INVALID_ARGUMENT, "root is NULL");
    ONEBIT_CHECK(timeout_ms >= 0, ONEBIT_INVALID_ARGUMENT, "timeout_ms ", timeout_ms, " must not be negative");
    ONEBIT_CHECK(rank >= 1 && rank < size, ONEBIT_INVALID_ARGUMENT, "rank ", rank, " of ", size,
                 ": the ranks other than 0 check the root");
    namespace tcp = onebit::transport::tcp;
    const tcp::Address address = tcp::parse_host_port(root, "root");
    const std::int64_t wanted = timeout_ms > 0 ? timeout_ms : tcp::kRootCheckWindow.count();
    const auto window = std::chrono::milliseconds(std::min<std::int64_t>(wanted, onebit::param::TimeoutMs()));
    tcp::check_root_reachable(rank, address, window);
  });
}

onebit_result_t onebit_root_close(const char* root) {
  return onebit::abi_guard("onebit_root_close", [&] {
    ONEBIT_CHECK(root != nullptr, ONEBIT_INVALID_ARGUMENT, "root is NULL");
    namespace tcp = onebit::transport::tcp;
    ONEBIT_CHECK(static_cast<bool>(tcp::take_root_listener(tcp::parse_host_port(root, "root"))),
                 ONEBIT_INVALID_ARGUMENT, "no listener is held at ", root, " (onebit_root_listen opens one)");
  });
}

onebit_result_t onebit_comm_init_config(onebit_comm_t* comm, int rank, int size, const char* root,
                                        const onebit_config_t* config) {
  return make_comm("onebit_comm_init_config", comm, [&] {
    ONEBIT_CHECK(root != nullptr || size == 1, ONEBIT_INVALID_ARGUMENT, "root is NULL");
    onebit::CommSetup setup;
    setup.rank = rank;
    setup.size = size;
    setup.root = root != nullptr ? root : "";
    if (config != nullptr) {
      ONEBIT_CHECK(config->timeout_ms >= 0 && config->sockets_per_peer >= 0, ONEBIT_INVALID_ARGUMENT,
                   "config: timeout_ms ", config->timeout_ms, " and sockets_per_peer ", config->sockets_per_peer,
                   " must not be negative");
      setup.timeout_ms = config->timeout_ms;
      setup.sockets_per_peer = config->sockets_per_peer;
      setup.socket_ifname = config->socket_ifname != nullptr ? config->socket_ifname : "";
      setup.auth_key = config->auth_key != nullptr ? config->auth_key : "";
      setup.identity = config->job_id != nullptr ? config->job_id : "";
      setup.secret = config->secret != nullptr ? config->secret : "";
    }
    return setup;
  });
}

onebit_result_t onebit_comm_init_env(onebit_comm_t* comm) {
  return make_comm("onebit_comm_init_env", comm, [] { return onebit::CommSetup::from_environment(); });
}

onebit_result_t onebit_comm_destroy(onebit_comm_t comm) {
  return onebit::abi_guard("onebit_comm_destroy", [&] { delete comm; });
}

onebit_result_t onebit_comm_rank(onebit_comm_t comm, int* rank) {
  return onebit::abi_guard("onebit_comm_rank", [&] {
    ONEBIT_CHECK(rank != nullptr, ONEBIT_INVALID_ARGUMENT, "rank is NULL");
    *rank = checked(comm).rank();
  });
}

onebit_result_t onebit_comm_size(onebit_comm_t comm, int* size) {
  return onebit::abi_guard("onebit_comm_size", [&] {
    ONEBIT_CHECK(size != nullptr, ONEBIT_INVALID_ARGUMENT, "size is NULL");
    *size = checked(comm).size();
  });
}

onebit_result_t onebit_comm_local_size(onebit_comm_t comm, int* local_size) {
  return onebit::abi_guard("onebit_comm_local_size", [&] {
    ONEBIT_CHECK(local_size != nullptr, ONEBIT_INVALID_ARGUMENT, "local_size is NULL");
    *local_size = checked(comm).local_size();
  });
}

onebit_result_t onebit_local_size_from_env(int rank, int size, int* local_size) {
  return onebit::abi_guard("onebit_local_size_from_env", [&] {
    ONEBIT_CHECK(local_size != nullptr, ONEBIT_INVALID_ARGUMENT, "local_size is NULL");
    ONEBIT_CHECK(size >= 1 && rank >= 0 && rank < size, ONEBIT_INVALID_ARGUMENT, "rank ", rank, " of ", size);
    *local_size = onebit::Communicator::ranks_per_host_from_environment(rank, size);
  });
}

onebit_result_t onebit_comm_stats(onebit_comm_t comm, onebit_stats_t* stats) {
  return onebit::abi_guard("onebit_comm_stats", [&] {
    ONEBIT_CHECK(stats != nullptr, ONEBIT_INVALID_ARGUMENT, "stats is NULL");
    *stats = checked(comm).stats();
  });
}

onebit_result_t onebit_tag(const char* name, void* ptr, size_t count, onebit_dtype_t dtype) {
  return onebit::abi_guard("onebit_tag", [&] {
    ONEBIT_CHECK(name != nullptr, ONEBIT_INVALID_ARGUMENT, "name is NULL");
    onebit::TagRegistry::instance().tag(name, ptr, count, to_dtype(dtype));
  });
}

onebit_result_t onebit_untag(void* ptr) {
  return onebit::abi_guard("onebit_untag", [&] { onebit::TagRegistry::instance().untag(ptr); });
}

onebit_result_t onebit_tag_detach(void* ptr) {
  return onebit::abi_guard("onebit_tag_detach", [&] { onebit::TagRegistry::instance().detach(ptr); });
}

onebit_result_t onebit_tag_find(const void* ptr, size_t count, onebit_dtype_t dtype, int* tagged, char* name,
                                size_t name_size) {
  return onebit::abi_guard("onebit_tag_find", [&] {
    ONEBIT_CHECK(tagged != nullptr, ONEBIT_INVALID_ARGUMENT, "tagged is NULL");
    ONEBIT_CHECK(name != nullptr || name_size == 0, ONEBIT_INVALID_ARGUMENT, "name is NULL with name_size ", name_size);
    const onebit::kernels::Dtype kind = to_dtype(dtype);  // refused alike whatever is tagged
    const auto tag = onebit::TagRegistry::instance().find(ptr);
    *tagged = tag != nullptr && tag->count == count && tag->dtype == kind ? 1 : 0;
    if (name_size == 0) return;
    const std::string said = tag != nullptr ? tag->name : std::string();
    const std::size_t length = std::min(said.size(), name_size - 1);
    std::memcpy(name, said.data(), length);
    name[length] = '\0';
  });
}

onebit_result_t onebit_tag_stats(const char* name, uint64_t* calls, uint64_t* bytes_sent) {
  return onebit::abi_guard("onebit_tag_stats", [&] {
    ONEBIT_CHECK(name != nullptr && calls != nullptr && bytes_sent != nullptr, ONEBIT_INVALID_ARGUMENT,
                 "name, calls and bytes_sent must not be NULL");
    auto tag = onebit::TagRegistry::instance().find_name(name);
    ONEBIT_CHECK(tag != nullptr, ONEBIT_INVALID_ARGUMENT, "no tag named '", name, "'");
    std::lock_guard<std::mutex> lock(tag->busy);
    onebit::TagRegistry::instance().drop_aborted_states(*tag);
    *calls = tag->calls_made();
    *bytes_sent = tag->bytes_sent;
  });
}

onebit_result_t onebit_tag_set_step_settings(const char* name, const char* const* keys, const double* values,
                                             size_t count) {
  return onebit::abi_guard("onebit_tag_set_step_settings", [&] {
    ONEBIT_CHECK(name != nullptr, ONEBIT_INVALID_ARGUMENT, "name is NULL");
    ONEBIT_CHECK(count == 0 || (keys != nullptr && values != nullptr), ONEBIT_INVALID_ARGUMENT,
                 "keys or values is NULL with count ", count);
    auto tag = onebit::TagRegistry::instance().find_name(name);
    ONEBIT_CHECK(tag != nullptr, ONEBIT_INVALID_ARGUMENT, "no tag named '", name, "'");
    std::string text, material;
    for (size_t i = 0; i < count; ++i) {
      ONEBIT_CHECK(keys[i] != nullptr, ONEBIT_INVALID_ARGUMENT, "keys[", i, "] is NULL");
      char value[32];  // the shortest text that reads back as the same double
      const auto written = std::to_chars(value, value + sizeof(value), values[i]);
      const bool text_only = values[i] == 0.0 && std::strchr(keys[i], ':') != nullptr;  // "stage: ..."
      if (i > 0) text.append(", ");  // appends, not "a" + std::string: GCC 12 warns falsely there
      text.append(keys[i]);
      if (!text_only) text.append(" ").append(value, written.ptr);
      material.append(keys[i]).push_back('\0');
      material.append(reinterpret_cast<const char*>(&values[i]), sizeof(double));
    }
    // Never 0 once set, so that "none set" and a set of settings never compare equal.
    const std::uint64_t digest = count == 0 ? 0 : onebit::siphash24(kSettingsKey, material.data(), material.size()) | 1;
    std::lock_guard<std::mutex> lock(tag->settings_mutex);
    tag->settings = digest;
    tag->settings_text = onebit::printable(text);
  });
}

namespace {
std::shared_ptr<onebit::Tag> named_tag(const char* name) {
  ONEBIT_CHECK(name != nullptr, ONEBIT_INVALID_ARGUMENT, "name is NULL");
  auto tag = onebit::TagRegistry::instance().find_name(name);
  ONEBIT_CHECK(tag != nullptr, ONEBIT_INVALID_ARGUMENT, "no tag named '", name, "'");
  return tag;
}
}  // namespace

onebit_result_t onebit_tag_state_size(const char* name, size_t* worker_count, size_t* server_count) {
  return onebit::abi_guard("onebit_tag_state_size", [&] {
    ONEBIT_CHECK(worker_count != nullptr && server_count != nullptr, ONEBIT_INVALID_ARGUMENT,
                 "a count pointer is NULL");
    auto tag = named_tag(name);
    std::lock_guard<std::mutex> lock(tag->busy);
    onebit::TagRegistry::instance().drop_aborted_states(*tag);
    tag->saved_sizes(worker_count, server_count);
  });
}

onebit_result_t onebit_tag_state_save(const char* name, float* worker, float* server) {
  return onebit::abi_guard("onebit_tag_state_save", [&] {
    auto tag = named_tag(name);
    std::lock_guard<std::mutex> lock(tag->busy);
    onebit::TagRegistry::instance().drop_aborted_states(*tag);
    tag->save(worker, server);
  });
}

onebit_result_t onebit_tag_state_load(const char* name, const float* worker, size_t worker_count, const float* server,
                                      size_t server_count) {
  return onebit::abi_guard("onebit_tag_state_load", [&] {
    auto tag = named_tag(name);
    std::lock_guard<std::mutex> lock(tag->busy);
    onebit::TagRegistry::instance().drop_aborted_states(*tag);
    tag->load(worker, worker_count, server, server_count);
  });
}

onebit_result_t onebit_tag_state_check(const char* name, size_t worker_count) {
  return onebit::abi_guard("onebit_tag_state_check", [&] {
    auto tag = named_tag(name);
    std::lock_guard<std::mutex> lock(tag->busy);
    onebit::TagRegistry::instance().drop_aborted_states(*tag);
    tag->check_load(worker_count);
  });
}

namespace {
std::string describe_layout(int size, int local_size) {
  return std::to_string(size) + " ranks" +
         (local_size <= 0   ? ""
          : local_size == 1 ? ", flat"
                            : ", " + std::to_string(local_size) + " per host");
}
}  // namespace

onebit_result_t onebit_tag_state_check_layout(int saved_size, int saved_local_size, int size, int local_size) {
  return onebit::abi_guard("onebit_tag_state_check_layout", [&] {
    ONEBIT_CHECK(saved_size >= 1 && size >= 1 && local_size >= 1, ONEBIT_INVALID_ARGUMENT, "layouts of ", saved_size,
                 " ranks (", saved_local_size, " per host) and ", size, " (", local_size,
                 " per host): sizes and this job's ranks per host must be 1 or more");
    const bool same = saved_size == size && (saved_local_size <= 0 || saved_local_size == local_size);
    ONEBIT_CHECK(same, ONEBIT_INVALID_ARGUMENT, "saved by a job of ", describe_layout(saved_size, saved_local_size),
                 ", loading into one of ", describe_layout(size, local_size),
                 ": each rank's error feedback belongs to the chunks of the layout it was made in. Resume with that "
                 "layout, or drop the error feedback (Python: load_state_dict(..., reset_error_feedback=True); C++: "
                 "a Checkpoint with empty worker_error and server_error; docs/usage/restarting.md, \"Restarting a "
                 "job\")");
  });
}

onebit_result_t onebit_allreduce(onebit_comm_t comm, void* buf, size_t count, onebit_dtype_t dtype, onebit_op_t op) {
  return onebit::abi_guard("onebit_allreduce",
                           [&] { checked(comm).allreduce(buf, count, to_dtype(dtype), to_op(op)); });
}

}  // extern "C"
