// The C ABI of include/onebit/onebit.h, its optimizer half: 1-bit Adam, its frozen-variance
// measures and auto freeze, 0/1 Adam and 1-bit LAMB, each entry point a guarded call into optim/.
#include "onebit/onebit.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "optim/agreement.h"
#include "optim/frozen_variance.h"
#include "optim/lamb_rules.h"
#include "optim/onebit_adam.h"
#include "optim/onebit_lamb.h"
#include "optim/reports.h"
#include "optim/tiled_sums.h"
#include "optim/zero_one_adam.h"
#include "plugin/capi/abi_guard.h"
#include "plugin/capi/optimizer_args.h"

namespace {

using onebit::capi::check_arrays;
using onebit::capi::copy_fields;
using onebit::capi::copy_text;
using onebit::capi::non_null;
using onebit::capi::to_adam;
using onebit::capi::to_lamb;
using onebit::capi::to_zero_one_adam;

onebit::optim::AutoFreeze to_auto_freeze(const onebit_adam_auto_freeze_t* c) {
  ONEBIT_CHECK(c != nullptr, ONEBIT_INVALID_ARGUMENT, "auto freeze config is NULL");
  const onebit::optim::AutoFreeze config{c->window, c->threshold, c->max_step};
  onebit::optim::check(config);
  return config;
}

}  // namespace

extern "C" {

int64_t onebit_adam_freeze_step(int64_t requested) {
  std::int64_t answer = requested;
  onebit::abi_guard("onebit_adam_freeze_step", [&] { answer = onebit::optim::freeze_step(requested); });
  return answer;
}

int onebit_adam_compressing(const onebit_adam_config_t* config, int64_t step) {
  int answer = -1;
  const onebit_result_t result = onebit::abi_guard(
      "onebit_adam_compressing", [&] { answer = onebit::optim::compressing(to_adam(config), step) ? 1 : 0; });
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

onebit_result_t onebit_adam_momentum_step_keeping(const onebit_adam_config_t* config, float* m, float* m_before,
                                                  const float* grad, size_t count) {
  return onebit::abi_guard("onebit_adam_momentum_step_keeping", [&] {
    const auto c = to_adam(config);
    check_arrays(count, {m, m_before, grad});
    onebit::capi::check_apart(m, m_before, count);
    onebit::optim::momentum_step_keeping(c, m, m_before, grad, count);
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

size_t onebit_measure_workspace_size(size_t count) { return onebit::optim::tiled::workspace_bytes(&count, 1); }

int64_t onebit_adam_auto_freeze_decide(const onebit_adam_auto_freeze_t* config, int64_t step, double change) {
  std::int64_t answer = -2;
  onebit::abi_guard("onebit_adam_auto_freeze_decide",
                    [&] { answer = onebit::optim::decide(to_auto_freeze(config), step, change); });
  return answer;
}

onebit_result_t onebit_freeze_report(const char* who, int64_t step, const size_t* dormant, const size_t* counts,
                                     size_t groups, char* text, size_t text_size, size_t* length) {
  return onebit::abi_guard("onebit_freeze_report", [&] {
    ONEBIT_CHECK(who != nullptr && (groups == 0 || (dormant != nullptr && counts != nullptr)), ONEBIT_INVALID_ARGUMENT,
                 "who, dormant and counts must not be NULL");
    copy_text(onebit::optim::freeze_report(who, step, dormant, counts, groups), text, text_size, length);
  });
}

onebit_result_t onebit_step_failure_text(const char* who, int64_t step, const char* stage, onebit_result_t code,
                                         const char* error, char* text, size_t text_size, size_t* length) {
  return onebit::abi_guard("onebit_step_failure_text", [&] {
    ONEBIT_CHECK(who != nullptr && stage != nullptr && error != nullptr, ONEBIT_INVALID_ARGUMENT,
                 "who, stage and error must not be NULL");
    copy_text(onebit::optim::step_failure(who, step, stage, code, error), text, text_size, length);
  });
}

onebit_result_t onebit_ranks_disagreement(const char* who, const char* const* fields, size_t field_count,
                                          const int64_t* table, size_t ranks, onebit_agreed_at_t at, char* text,
                                          size_t text_size, size_t* length) {
  return onebit::abi_guard("onebit_ranks_disagreement", [&] {
    ONEBIT_CHECK(who != nullptr && (field_count == 0 || fields != nullptr), ONEBIT_INVALID_ARGUMENT,
                 "who and fields must not be NULL");
    ONEBIT_CHECK(ranks == 0 || field_count == 0 || table != nullptr, ONEBIT_INVALID_ARGUMENT, "table is NULL");
    ONEBIT_CHECK(at == ONEBIT_AGREED_AT_CONSTRUCTION || at == ONEBIT_AGREED_AT_CHECKPOINT_LOAD, ONEBIT_INVALID_ARGUMENT,
                 "at is ", static_cast<int>(at));
    std::vector<std::string> names;
    for (size_t f = 0; f < field_count; ++f) {
      ONEBIT_CHECK(fields[f] != nullptr, ONEBIT_INVALID_ARGUMENT, "fields[", f, "] is NULL");
      names.emplace_back(fields[f]);
    }
    const auto where = at == ONEBIT_AGREED_AT_CONSTRUCTION ? onebit::optim::AgreedAt::kConstruction
                                                           : onebit::optim::AgreedAt::kCheckpointLoad;
    copy_text(onebit::optim::disagreement(who, names, table, ranks, where), text, text_size, length);
  });
}

onebit_result_t onebit_resume_refusal(int64_t step, const char* const* names, const int64_t* saved, const int64_t* mine,
                                      size_t count, int freeze_inclusive, char* text, size_t text_size,
                                      size_t* length) {
  return onebit::abi_guard("onebit_resume_refusal", [&] {
    ONEBIT_CHECK(count == 0 || (names != nullptr && saved != nullptr && mine != nullptr), ONEBIT_INVALID_ARGUMENT,
                 "names, saved and mine must not be NULL");
    std::vector<onebit::optim::ResumedSetting> settings;
    for (size_t i = 0; i < count; ++i) {
      ONEBIT_CHECK(names[i] != nullptr, ONEBIT_INVALID_ARGUMENT, "names[", i, "] is NULL");
      settings.push_back({names[i], saved[i], mine[i]});
    }
    copy_text(onebit::optim::resume_refusal(step, settings, freeze_inclusive != 0), text, text_size, length);
  });
}

int64_t onebit_adam_auto_freeze_decide_ranks(const onebit_adam_auto_freeze_t* config, int64_t step,
                                             const double* changes, size_t ranks, double* decided) {
  std::int64_t answer = -2;
  onebit::abi_guard("onebit_adam_auto_freeze_decide_ranks", [&] {
    const onebit::optim::AutoFreeze rule = to_auto_freeze(config);
    double change = INFINITY;
    if (onebit::optim::measures(rule, step)) {
      ONEBIT_CHECK(changes != nullptr && ranks > 0, ONEBIT_INVALID_ARGUMENT, "step ", step,
                   " measures the variance: give every rank's change (changes ",
                   changes == nullptr ? "is NULL" : "given", ", ranks ", ranks, ")");
      change = onebit::optim::largest_change(changes, ranks);
    }
    answer = onebit::optim::decide(rule, step, change);
    if (decided != nullptr) *decided = change;
  });
  return answer;
}

onebit_result_t onebit_zero_one_adam_schedule_init(onebit_zero_one_adam_schedule_t* schedule) {
  return onebit::abi_guard("onebit_zero_one_adam_schedule_init",
                           [&] { non_null(schedule, "schedule") = onebit::optim::zero_one_adam::initial_schedule(); });
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

onebit_result_t onebit_zero_one_adam_gradient_step(const onebit_zero_one_adam_config_t* config, float* params, float* m,
                                                   float* v, const float* grad, size_t count, int update_variance) {
  return onebit::abi_guard("onebit_zero_one_adam_gradient_step", [&] {
    const auto& c = to_zero_one_adam(config);
    check_arrays(count, {params, m, v, grad});
    onebit::optim::zero_one_adam::gradient_step(c, params, m, v, grad, count, update_variance != 0);
  });
}

onebit_result_t onebit_zero_one_adam_local_step(const onebit_zero_one_adam_config_t* config, float* params, float* m,
                                                const float* v, float* u, float* lrs, const float* grad, size_t count) {
  return onebit::abi_guard("onebit_zero_one_adam_local_step", [&] {
    const auto& c = to_zero_one_adam(config);
    check_arrays(count, {params, m, v, u, grad});
    onebit::optim::zero_one_adam::local_step(c, params, m, v, u, &non_null(lrs, "lrs"), grad, count);
  });
}

onebit_result_t onebit_zero_one_adam_sync_begin(const onebit_zero_one_adam_config_t* config, float* u, const float* v,
                                                float lrs, size_t count) {
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
    onebit::optim::zero_one_adam::sync_end(c, params, params_at_sync, m, u, v, &non_null(lrs, "lrs"), count);
  });
}

onebit_result_t onebit_lamb_layer_init(onebit_lamb_layer_t* layer) {
  return onebit::abi_guard("onebit_lamb_layer_init",
                           [&] { non_null(layer, "layer") = onebit::optim::lamb::initial_layer(); });
}

int onebit_lamb_compressing(const onebit_lamb_config_t* config, int64_t step) {
  int answer = -1;
  const onebit_result_t result = onebit::abi_guard(
      "onebit_lamb_compressing", [&] { answer = onebit::optim::lamb::compressing(to_lamb(config), step) ? 1 : 0; });
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

size_t onebit_lamb_workspace_size(const size_t* counts, size_t layers) {
  size_t bytes = 0;
  onebit::abi_guard("onebit_lamb_workspace_size", [&] {
    ONEBIT_CHECK(counts != nullptr || layers == 0, ONEBIT_INVALID_ARGUMENT, "counts is NULL with ", layers, " layers");
    bytes = onebit::optim::tiled::workspace_bytes(counts, layers);
  });
  return bytes;
}

onebit_result_t onebit_zero_one_adam_agreed_fields(const onebit_zero_one_adam_config_t* config,
                                                   const onebit_zero_one_adam_schedule_t* schedule, size_t parameters,
                                                   size_t groups, const char** names, int64_t* values, size_t capacity,
                                                   size_t* count) {
  return onebit::abi_guard("onebit_zero_one_adam_agreed_fields", [&] {
    const auto& c = to_zero_one_adam(config);
    copy_fields(onebit::optim::zero_one_adam_fields(c, non_null(schedule, "schedule"), parameters, groups), names,
                values, capacity, count);
  });
}

onebit_result_t onebit_zero_one_adam_resume_refusal(const onebit_zero_one_adam_config_t* config,
                                                    const onebit_zero_one_adam_schedule_t* saved,
                                                    const onebit_zero_one_adam_config_t* saved_knobs, char* text,
                                                    size_t text_size, size_t* length) {
  return onebit::abi_guard("onebit_zero_one_adam_resume_refusal", [&] {
    const auto& c = to_zero_one_adam(config);
    copy_text(onebit::optim::zero_one_adam_resume_refusal(c, non_null(saved, "saved"), saved_knobs), text, text_size,
              length);
  });
}

onebit_result_t onebit_zero_one_adam_sync_refusal(const float* lr_sums, size_t groups, int64_t step, char* text,
                                                  size_t text_size, size_t* length) {
  return onebit::abi_guard("onebit_zero_one_adam_sync_refusal", [&] {
    ONEBIT_CHECK(lr_sums != nullptr || groups == 0, ONEBIT_INVALID_ARGUMENT, "lr_sums is NULL (groups ", groups, ")");
    copy_text(onebit::optim::zero_one_adam_sync_refusal(lr_sums, groups, step), text, text_size, length);
  });
}

onebit_result_t onebit_lamb_agreed_fields(const onebit_lamb_config_t* config, int64_t step, size_t parameters,
                                          size_t layers, const char** names, int64_t* values, size_t capacity,
                                          size_t* count) {
  return onebit::abi_guard("onebit_lamb_agreed_fields", [&] {
    const auto c = to_lamb(config);
    copy_fields(onebit::optim::lamb_fields(c, step, parameters, layers), names, values, capacity, count);
  });
}

onebit_result_t onebit_lamb_resume_refusal(const onebit_lamb_config_t* config, int64_t step, int64_t saved_freeze_step,
                                           char* text, size_t text_size, size_t* length) {
  return onebit::abi_guard("onebit_lamb_resume_refusal", [&] {
    const auto c = to_lamb(config);
    copy_text(onebit::optim::lamb_resume_refusal(c, step, saved_freeze_step), text, text_size, length);
  });
}

}  // extern "C"
