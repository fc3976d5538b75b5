// The C ABI of include/onebit/onebit.h.
#include "onebit/onebit.h"

#include <functional>
#include <memory>

#include "kernels/cpu/cpu_kernels.h"
#include "plugin/capi/abi_guard.h"
#include "engine/communicator.h"
#include "optim/frozen_variance.h"
#include "optim/onebit_adam.h"
#include "optim/onebit_lamb.h"
#include "optim/zero_one_adam.h"

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

onebit::optim::AdamConfig to_adam(const onebit_adam_config_t* c) {
  ONEBIT_CHECK(c != nullptr, ONEBIT_INVALID_ARGUMENT, "config is NULL");
  ONEBIT_CHECK(c->lr >= 0 && c->beta1 >= 0 && c->beta1 < 1 && c->beta2 >= 0 && c->beta2 < 1 && c->eps > 0 &&
                   c->weight_decay >= 0 && c->freeze_step >= 0,
               ONEBIT_INVALID_ARGUMENT, "adam config out of range: lr ", c->lr, ", betas (", c->beta1, ", ", c->beta2,
               "), eps ", c->eps, ", weight_decay ", c->weight_decay, ", freeze_step ", c->freeze_step,
               " (need lr, wd >= 0; 0 <= beta < 1; eps > 0; freeze_step >= 0)");
  return onebit::optim::AdamConfig{c->lr, c->beta1, c->beta2, c->eps, c->weight_decay, c->freeze_step};
}

onebit::optim::AutoFreeze to_auto_freeze(const onebit_adam_auto_freeze_t* c) {
  ONEBIT_CHECK(c != nullptr, ONEBIT_INVALID_ARGUMENT, "auto freeze config is NULL");
  const onebit::optim::AutoFreeze config{c->window, c->threshold, c->max_step};
  onebit::optim::check(config);
  return config;
}

const onebit_zero_one_adam_config_t& to_zero_one_adam(const onebit_zero_one_adam_config_t* c) {
  ONEBIT_CHECK(c != nullptr, ONEBIT_INVALID_ARGUMENT, "config is NULL");
  onebit::optim::zero_one_adam::check(*c);
  return *c;
}

const onebit_lamb_config_t& to_lamb(const onebit_lamb_config_t* c) {
  ONEBIT_CHECK(c != nullptr, ONEBIT_INVALID_ARGUMENT, "config is NULL");
  onebit::optim::lamb::check(*c);
  return *c;
}

template <typename T>
T& non_null(T* pointer, const char* what) {
  ONEBIT_CHECK(pointer != nullptr, ONEBIT_INVALID_ARGUMENT, what, " is NULL");
  return *pointer;
}

void check_arrays(std::size_t count, std::initializer_list<const void*> arrays) {
  for (const void* a : arrays) {
    ONEBIT_CHECK(a != nullptr || count == 0, ONEBIT_INVALID_ARGUMENT, "an array is NULL with count ", count);
  }
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

onebit_result_t onebit_tag_stats(const char* name, uint64_t* calls, uint64_t* bytes_sent) {
  return onebit::abi_guard("onebit_tag_stats", [&] {
    ONEBIT_CHECK(name != nullptr && calls != nullptr && bytes_sent != nullptr, ONEBIT_INVALID_ARGUMENT,
                 "name, calls and bytes_sent must not be NULL");
    auto tag = onebit::TagRegistry::instance().find_name(name);
    ONEBIT_CHECK(tag != nullptr, ONEBIT_INVALID_ARGUMENT, "no tag named '", name, "'");
    std::lock_guard<std::mutex> lock(tag->busy);
    *calls = tag->calls;
    *bytes_sent = tag->bytes_sent;
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
    ONEBIT_CHECK(worker_count != nullptr && server_count != nullptr, ONEBIT_INVALID_ARGUMENT, "a count pointer is NULL");
    auto tag = named_tag(name);
    std::lock_guard<std::mutex> lock(tag->busy);
    tag->saved_sizes(worker_count, server_count);
  });
}

onebit_result_t onebit_tag_state_save(const char* name, float* worker, float* server) {
  return onebit::abi_guard("onebit_tag_state_save", [&] {
    auto tag = named_tag(name);
    std::lock_guard<std::mutex> lock(tag->busy);
    tag->save(worker, server);
  });
}

onebit_result_t onebit_tag_state_load(const char* name, const float* worker, size_t worker_count, const float* server,
                                      size_t server_count) {
  return onebit::abi_guard("onebit_tag_state_load", [&] {
    auto tag = named_tag(name);
    std::lock_guard<std::mutex> lock(tag->busy);
    tag->load(worker, worker_count, server, server_count);
  });
}

onebit_result_t onebit_allreduce(onebit_comm_t comm, void* buf, size_t count, onebit_dtype_t dtype, onebit_op_t op) {
  return onebit::abi_guard("onebit_allreduce", [&] { checked(comm).allreduce(buf, count, to_dtype(dtype), to_op(op)); });
}

int64_t onebit_adam_freeze_step(int64_t requested) {
  std::int64_t answer = requested;
  onebit::abi_guard("onebit_adam_freeze_step", [&] { answer = onebit::optim::freeze_step(requested); });
  return answer;
}

int onebit_adam_compressing(const onebit_adam_config_t* config, int64_t step) {
  int answer = -1;
  const onebit_result_t result = onebit::abi_guard("onebit_adam_compressing", [&] {
    answer = onebit::optim::compressing(to_adam(config), step) ? 1 : 0;
  });
  return result == ONEBIT_SUCCESS ? answer : -1;
}

onebit_result_t onebit_adam_warmup_step(const onebit_adam_config_t* config, float* params, float* m, float* v,
                                        const float* grad, size_t count) {
  return onebit::abi_guard("onebit_adam_warmup_step", [&] {
    const auto c = to_adam(config);
    check_arrays(count, {params, m, v, grad});
    onebit::optim::warmup_step(c, params, m, v, grad, count);
  });
}

onebit_result_t onebit_adam_momentum_step(const onebit_adam_config_t* config, float* m, const float* grad,
                                          size_t count) {
  return onebit::abi_guard("onebit_adam_momentum_step", [&] {
    const auto c = to_adam(config);
    check_arrays(count, {m, grad});
    onebit::optim::momentum_step(c, m, grad, count);
  });
}

onebit_result_t onebit_adam_apply_step(const onebit_adam_config_t* config, float* params, float* m, const float* v,
                                       size_t count) {
  return onebit::abi_guard("onebit_adam_apply_step", [&] {
    const auto c = to_adam(config);
    check_arrays(count, {params, m, v});
    onebit::optim::apply_step(c, params, m, v, count);
  });
}

float onebit_adam_step_bound(float beta1, float beta2) { return onebit::optim::adam_step_bound(beta1, beta2); }

onebit_result_t onebit_dormant_count(const float* v, size_t count, float eps, size_t* dormant) {
  return onebit::abi_guard("onebit_dormant_count", [&] {
    check_arrays(count, {v});
    ONEBIT_CHECK(eps > 0, ONEBIT_INVALID_ARGUMENT, "eps ", eps, " (need > 0)");
    non_null(dormant, "dormant") = onebit::optim::count_dormant(v, count, eps);
  });
}

int onebit_adam_auto_freeze_measures(const onebit_adam_auto_freeze_t* config, int64_t step) {
  int answer = -1;
  const onebit_result_t result = onebit::abi_guard("onebit_adam_auto_freeze_measures", [&] {
    answer = onebit::optim::measures(to_auto_freeze(config), step) ? 1 : 0;
  });
  return result == ONEBIT_SUCCESS ? answer : -1;
}

onebit_result_t onebit_adam_variance_change(const float* v, const float* v_then, size_t count, double* change) {
  return onebit::abi_guard("onebit_adam_variance_change", [&] {
    check_arrays(count, {v, v_then});
    ONEBIT_CHECK(change != nullptr, ONEBIT_INVALID_ARGUMENT, "change is NULL");
    *change = onebit::optim::variance_change(v, v_then, count);
  });
}

int64_t onebit_adam_auto_freeze_decide(const onebit_adam_auto_freeze_t* config, int64_t step, double change) {
  std::int64_t answer = -2;
  onebit::abi_guard("onebit_adam_auto_freeze_decide",
                    [&] { answer = onebit::optim::decide(to_auto_freeze(config), step, change); });
  return answer;
}

onebit_result_t onebit_zero_one_adam_schedule_init(onebit_zero_one_adam_schedule_t* schedule) {
  return onebit::abi_guard("onebit_zero_one_adam_schedule_init", [&] {
    non_null(schedule, "schedule") = onebit::optim::zero_one_adam::initial_schedule();
  });
}

onebit_result_t onebit_zero_one_adam_next(const onebit_zero_one_adam_config_t* config,
                                          const onebit_zero_one_adam_schedule_t* schedule,
                                          onebit_zero_one_adam_step_t* kind) {
  return onebit::abi_guard("onebit_zero_one_adam_next", [&] {
    const auto& c = to_zero_one_adam(config);
    const auto& s = non_null(schedule, "schedule");
    onebit::optim::zero_one_adam::check(s);
    non_null(kind, "kind") = onebit::optim::zero_one_adam::next(c, s);
  });
}

onebit_result_t onebit_zero_one_adam_advance(const onebit_zero_one_adam_config_t* config,
                                             onebit_zero_one_adam_schedule_t* schedule) {
  return onebit::abi_guard("onebit_zero_one_adam_advance", [&] {
    const auto& c = to_zero_one_adam(config);
    auto& s = non_null(schedule, "schedule");
    onebit::optim::zero_one_adam::check(s);
    onebit::optim::zero_one_adam::advance(c, s);
  });
}

onebit_result_t onebit_zero_one_adam_gradient_step(const onebit_zero_one_adam_config_t* config, float* params,
                                                   float* m, float* v, const float* grad, size_t count,
                                                   int update_variance) {
  return onebit::abi_guard("onebit_zero_one_adam_gradient_step", [&] {
    const auto& c = to_zero_one_adam(config);
    check_arrays(count, {params, m, v, grad});
    onebit::optim::zero_one_adam::gradient_step(c, params, m, v, grad, count, update_variance != 0);
  });
}

onebit_result_t onebit_zero_one_adam_local_step(const onebit_zero_one_adam_config_t* config, float* params,
                                                float* m, const float* v, float* u, float* lrs, const float* grad,
                                                size_t count) {
  return onebit::abi_guard("onebit_zero_one_adam_local_step", [&] {
    const auto& c = to_zero_one_adam(config);
    check_arrays(count, {params, m, v, u, grad});
    onebit::optim::zero_one_adam::local_step(c, params, m, v, u, &non_null(lrs, "lrs"), grad, count);
  });
}

onebit_result_t onebit_zero_one_adam_sync_begin(const onebit_zero_one_adam_config_t* config, float* u,
                                                const float* v, float lrs, size_t count) {
  return onebit::abi_guard("onebit_zero_one_adam_sync_begin", [&] {
    const auto& c = to_zero_one_adam(config);
    check_arrays(count, {u, v});
    onebit::optim::zero_one_adam::sync_begin(c, u, v, lrs, count);
  });
}

onebit_result_t onebit_zero_one_adam_sync_end(const onebit_zero_one_adam_config_t* config, float* params,
                                              float* params_at_sync, float* m, float* u, const float* v, float* lrs,
                                              size_t count) {
  return onebit::abi_guard("onebit_zero_one_adam_sync_end", [&] {
    const auto& c = to_zero_one_adam(config);
    check_arrays(count, {params, params_at_sync, m, u, v});
    ONEBIT_CHECK(non_null(lrs, "lrs") > 0, ONEBIT_INVALID_ARGUMENT, "lrs is ", *lrs, " (need > 0, as at sync_begin)");
    onebit::optim::zero_one_adam::sync_end(c, params, params_at_sync, m, u, v, lrs, count);
  });
}

onebit_result_t onebit_lamb_layer_init(onebit_lamb_layer_t* layer) {
  return onebit::abi_guard("onebit_lamb_layer_init",
                           [&] { non_null(layer, "layer") = onebit::optim::lamb::initial_layer(); });
}

int onebit_lamb_compressing(const onebit_lamb_config_t* config, int64_t step) {
  int answer = -1;
  const onebit_result_t result = onebit::abi_guard("onebit_lamb_compressing", [&] {
    answer = onebit::optim::lamb::compressing(to_lamb(config), step) ? 1 : 0;
  });
  return result == ONEBIT_SUCCESS ? answer : -1;
}

onebit_result_t onebit_lamb_warmup_step(const onebit_lamb_config_t* config, onebit_lamb_layer_t* layer, int64_t step,
                                        float* params, float* m, float* v, float* v_fresh, const float* grad,
                                        size_t count) {
  return onebit::abi_guard("onebit_lamb_warmup_step", [&] {
    const auto& c = to_lamb(config);
    check_arrays(count, {params, m, v, v_fresh, grad});
    onebit::optim::lamb::warmup_step(c, non_null(layer, "layer"), step, params, m, v, v_fresh, grad, count);
  });
}

onebit_result_t onebit_lamb_scaling_coeffs(const float* m, const size_t* counts, size_t layers,
                                           onebit_lamb_layer_t* states) {
  return onebit::abi_guard("onebit_lamb_scaling_coeffs", [&] {
    check_arrays(layers, {counts, states});
    std::size_t total = 0;
    for (std::size_t j = 0; j < layers; ++j) total += counts[j];
    check_arrays(total, {m});
    onebit::optim::lamb::scaling_coeffs(m, counts, layers, states);
  });
}

onebit_result_t onebit_lamb_momentum_step(const onebit_lamb_config_t* config, const onebit_lamb_layer_t* layer,
                                          float* m, float* m_last, const float* grad, size_t count) {
  return onebit::abi_guard("onebit_lamb_momentum_step", [&] {
    const auto& c = to_lamb(config);
    check_arrays(count, {m, m_last, grad});
    onebit::optim::lamb::momentum_step(c, non_null(layer, "layer"), m, m_last, grad, count);
  });
}

onebit_result_t onebit_lamb_apply_step(const onebit_lamb_config_t* config, onebit_lamb_layer_t* layer, float* params,
                                       float* m, const float* m_last, const float* v, float* v_fresh, size_t count) {
  return onebit::abi_guard("onebit_lamb_apply_step", [&] {
    const auto& c = to_lamb(config);
    check_arrays(count, {params, m, m_last, v, v_fresh});
    onebit::optim::lamb::apply_step(c, non_null(layer, "layer"), params, m, m_last, v, v_fresh, count);
  });
}

}  // extern "C"
