// The device steps of include/onebit/onebit.h in a library built without CUDA (libonebit.so,
// libonebit-preload.so): present, so that every library exports one ABI, and refusing with the
// reason and where the working ones are. device_steps.cc is the CUDA build's.
#include "onebit/onebit.h"

#include "common/error.h"
#include "plugin/capi/abi_guard.h"

namespace {

onebit_result_t absent(const char* entry_point) {
  return onebit::abi_guard(entry_point, [] {
    onebit::fail(ONEBIT_UNSUPPORTED,
                 "this library was built without CUDA, so it has no device steps: load "
                 "libonebit-nccl-preload.so (onebit.nccl_preload_path()), or step on the CPU");
  });
}

}  // namespace

extern "C" {

int onebit_device_steps(void) { return 0; }

onebit_result_t onebit_adam_warmup_step_device(const onebit_adam_config_t*, float*, float*, float*, const float*,
                                               size_t, void*) {
  return absent("onebit_adam_warmup_step_device");
}

onebit_result_t onebit_adam_momentum_step_device(const onebit_adam_config_t*, float*, float*, const float*, size_t,
                                                 void*) {
  return absent("onebit_adam_momentum_step_device");
}

onebit_result_t onebit_adam_apply_step_device(const onebit_adam_config_t*, float*, float*, const float*, size_t,
                                              void*) {
  return absent("onebit_adam_apply_step_device");
}

onebit_result_t onebit_dormant_count_device(const float*, size_t, float, void*, size_t, size_t*, void*) {
  return absent("onebit_dormant_count_device");
}

onebit_result_t onebit_adam_variance_change_device(const float*, const float*, size_t, void*, size_t, double*, void*) {
  return absent("onebit_adam_variance_change_device");
}

onebit_result_t onebit_zero_one_adam_gradient_step_device(const onebit_zero_one_adam_config_t*, float*, float*, float*,
                                                          const float*, size_t, int, void*) {
  return absent("onebit_zero_one_adam_gradient_step_device");
}

onebit_result_t onebit_zero_one_adam_local_step_device(const onebit_zero_one_adam_config_t*, float*, float*,
                                                       const float*, float*, float*, const float*, size_t, void*) {
  return absent("onebit_zero_one_adam_local_step_device");
}

onebit_result_t onebit_zero_one_adam_sync_begin_device(const onebit_zero_one_adam_config_t*, float*, const float*,
                                                       float, size_t, void*) {
  return absent("onebit_zero_one_adam_sync_begin_device");
}

onebit_result_t onebit_zero_one_adam_sync_end_device(const onebit_zero_one_adam_config_t*, float*, float*, float*,
                                                     float*, const float*, float*, size_t, void*) {
  return absent("onebit_zero_one_adam_sync_end_device");
}

onebit_result_t onebit_lamb_warmup_steps_device(const onebit_lamb_config_t*, onebit_lamb_layer_t*, const size_t*,
                                                size_t, int64_t, float*, float*, float*, float*, const float*, void*,
                                                size_t, void*) {
  return absent("onebit_lamb_warmup_steps_device");
}

onebit_result_t onebit_lamb_scaling_coeffs_device(const float*, const size_t*, size_t, onebit_lamb_layer_t*, void*,
                                                  size_t, void*) {
  return absent("onebit_lamb_scaling_coeffs_device");
}

onebit_result_t onebit_lamb_momentum_step_device(const onebit_lamb_config_t*, const onebit_lamb_layer_t*, float*,
                                                 float*, const float*, size_t, void*) {
  return absent("onebit_lamb_momentum_step_device");
}

onebit_result_t onebit_lamb_apply_steps_device(const onebit_lamb_config_t*, onebit_lamb_layer_t*, const size_t*, size_t,
                                               float*, float*, const float*, const float*, float*, void*, size_t,
                                               void*) {
  return absent("onebit_lamb_apply_steps_device");
}

}  // extern "C"
