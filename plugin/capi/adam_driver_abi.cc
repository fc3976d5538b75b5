// The C ABI of OnebitAdam's driver (include/onebit/onebit.h, "OnebitAdam's driver"): an opaque
// handle over optim::AdamDriver, each entry point a guarded call.
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "onebit/onebit.h"
#include "optim/adam_driver.h"
#include "plugin/capi/abi_guard.h"
#include "plugin/capi/optimizer_args.h"

struct onebit_adam_driver {
  onebit::optim::AdamDriver driver;
};

namespace {

using onebit::capi::copy_fields;
using onebit::capi::copy_text;
using onebit::capi::non_null;
using onebit::optim::AdamDriver;
using onebit::optim::AdamDriverState;

AdamDriver& driver_of(onebit_adam_driver_t handle) {
  ONEBIT_CHECK(handle != nullptr, ONEBIT_INVALID_ARGUMENT, "driver is NULL");
  return handle->driver;
}

AdamDriverState from_c(const onebit_adam_driver_state_t& s) {
  ONEBIT_CHECK(s.automatic == 0 || s.automatic == 1, ONEBIT_INVALID_ARGUMENT, "state.automatic must be 0 or 1, not ",
               s.automatic);
  return AdamDriverState{s.step, s.freeze_step, s.automatic == 1, s.bias_correction, s.deepspeed_schedule};
}

}  // namespace

extern "C" {

onebit_result_t onebit_adam_driver_create(const char* who, const onebit_adam_schedule_t* schedule, size_t parameters,
                                          size_t groups, onebit_adam_driver_t* driver) {
  return onebit::abi_guard("onebit_adam_driver_create", [&] {
    ONEBIT_CHECK(who != nullptr && driver != nullptr, ONEBIT_INVALID_ARGUMENT, "who or driver is NULL");
    const onebit_adam_schedule_t& s = non_null(schedule, "schedule");
    const onebit::optim::AdamSchedule made{s.freeze_step,
                                           {s.automatic.window, s.automatic.threshold, s.automatic.max_step},
                                           s.deepspeed_schedule != 0,
                                           s.bias_correction != 0};
    *driver = new onebit_adam_driver{AdamDriver(who, made, parameters, groups)};
  });
}

void onebit_adam_driver_destroy(onebit_adam_driver_t driver) { delete driver; }

onebit_result_t onebit_adam_driver_status(onebit_adam_driver_t driver, onebit_adam_driver_status_t* status) {
  return onebit::abi_guard("onebit_adam_driver_status", [&] {
    const AdamDriver& d = driver_of(driver);
    ONEBIT_CHECK(status != nullptr, ONEBIT_INVALID_ARGUMENT, "status is NULL");
    const bool undecided = d.freeze_step() == AdamDriver::kUndecided;
    *status = onebit_adam_driver_status_t{d.step(), undecided ? -1 : d.freeze_step(), d.steps_taken(), d.next(),
                                          d.freezes_now() ? 1 : 0};
  });
}

onebit_result_t onebit_adam_driver_config(onebit_adam_driver_t driver, const onebit_adam_hyper_t* group,
                                          onebit_adam_config_t* config) {
  return onebit::abi_guard("onebit_adam_driver_config", [&] {
    const AdamDriver& d = driver_of(driver);
    const onebit_adam_hyper_t& g = non_null(group, "group");
    ONEBIT_CHECK(config != nullptr, ONEBIT_INVALID_ARGUMENT, "config is NULL");
    *config = d.config({g.lr, g.beta1, g.beta2, g.eps, g.weight_decay});
  });
}

onebit_result_t onebit_adam_driver_taken(onebit_adam_driver_t driver, int* measure) {
  return onebit::abi_guard("onebit_adam_driver_taken", [&] {
    AdamDriver& d = driver_of(driver);
    ONEBIT_CHECK(measure != nullptr, ONEBIT_INVALID_ARGUMENT, "measure is NULL");
    *measure = d.taken() ? 1 : 0;
  });
}

onebit_result_t onebit_adam_driver_decide(onebit_adam_driver_t driver, const double* changes, size_t ranks) {
  return onebit::abi_guard("onebit_adam_driver_decide", [&] { driver_of(driver).decide(changes, ranks); });
}

onebit_result_t onebit_adam_driver_news(onebit_adam_driver_t driver, char* text, size_t text_size, size_t* length) {
  return onebit::abi_guard("onebit_adam_driver_news",
                           [&] { copy_text(driver_of(driver).news(), text, text_size, length); });
}

onebit_result_t onebit_adam_driver_changes(onebit_adam_driver_t driver, int64_t* steps, double* changes,
                                           size_t capacity, size_t* count) {
  return onebit::abi_guard("onebit_adam_driver_changes", [&] {
    const auto& recorded = driver_of(driver).changes();
    ONEBIT_CHECK(count != nullptr && (capacity == 0 || (steps != nullptr && changes != nullptr)),
                 ONEBIT_INVALID_ARGUMENT, "steps, changes or count is NULL");
    for (std::size_t i = 0; i < recorded.size() && i < capacity; ++i) {
      steps[i] = recorded[i].first;
      changes[i] = recorded[i].second;
    }
    *count = recorded.size();
  });
}

onebit_result_t onebit_adam_driver_agreed_fields(onebit_adam_driver_t driver, const onebit_adam_driver_state_t* state,
                                                 const char** names, int64_t* values, size_t capacity, size_t* count) {
  return onebit::abi_guard("onebit_adam_driver_agreed_fields", [&] {
    AdamDriverState saved;
    if (state != nullptr) saved = from_c(*state);
    copy_fields(driver_of(driver).agreed_fields(state != nullptr ? &saved : nullptr), names, values, capacity, count);
  });
}

onebit_result_t onebit_adam_driver_state(onebit_adam_driver_t driver, onebit_adam_driver_state_t* state) {
  return onebit::abi_guard("onebit_adam_driver_state", [&] {
    const AdamDriverState s = driver_of(driver).state();
    ONEBIT_CHECK(state != nullptr, ONEBIT_INVALID_ARGUMENT, "state is NULL");
    *state =
        onebit_adam_driver_state_t{s.step, s.freeze_step, s.automatic ? 1 : 0, s.bias_correction, s.deepspeed_schedule};
  });
}

onebit_result_t onebit_adam_driver_resume_refusal(onebit_adam_driver_t driver, const onebit_adam_driver_state_t* saved,
                                                  char* text, size_t text_size, size_t* length) {
  return onebit::abi_guard("onebit_adam_driver_resume_refusal", [&] {
    const AdamDriver& d = driver_of(driver);
    copy_text(d.resume_refusal(from_c(non_null(saved, "saved"))), text, text_size, length);
  });
}

onebit_result_t onebit_adam_driver_resume(onebit_adam_driver_t driver, const onebit_adam_driver_state_t* saved,
                                          const int64_t* steps, const double* changes, size_t count) {
  return onebit::abi_guard("onebit_adam_driver_resume", [&] {
    AdamDriver& d = driver_of(driver);
    ONEBIT_CHECK(count == 0 || (steps != nullptr && changes != nullptr), ONEBIT_INVALID_ARGUMENT,
                 "steps or changes is NULL (count ", count, ")");
    std::vector<std::pair<std::int64_t, double>> recorded;
    for (std::size_t i = 0; i < count; ++i) recorded.emplace_back(steps[i], changes[i]);
    d.resume(from_c(non_null(saved, "saved")), std::move(recorded));
  });
}

}  // extern "C"
