// The device steps of include/onebit/onebit.h in a library built with CUDA (libonebit-nccl-preload.so):
// the C ABI's checks (optimizer_args.h), then optim/cuda's kernels on the caller's stream. Host
// memory passed where device memory is due is refused naming the array, before anything runs.
#include "onebit/onebit.h"

#include <cuda_runtime.h>

#include <cstdint>

#include "common/error.h"
#include "optim/cuda/adam_device.h"
#include "optim/cuda/lamb_device.h"
#include "optim/cuda/variance_measures.h"
#include "optim/cuda/zero_one_adam_device.h"
#include "optim/lamb_rules.h"
#include "optim/tiled_sums.h"
#include "plugin/capi/abi_guard.h"
#include "plugin/capi/optimizer_args.h"

namespace {

using onebit::capi::check_arrays;
using onebit::capi::non_null;
using onebit::capi::to_adam;
using onebit::capi::to_lamb;
using onebit::capi::to_zero_one_adam;
namespace zero_one_adam = onebit::optim::zero_one_adam;
namespace lamb = onebit::optim::lamb;
namespace tiled = onebit::optim::tiled;

// Device (or managed) memory of the current device, which the kernels run on: a host pointer, one
// CUDA does not know, or another device's memory (the caller's current device is not the arrays':
// the launch would fail, or fault the context) is the caller's mistake, named.
void check_on_device(std::size_t count, std::initializer_list<std::pair<const void*, const char*>> arrays) {
  if (count == 0) return;
  int current = -1;
  const cudaError_t got = cudaGetDevice(&current);
  ONEBIT_CHECK(got == cudaSuccess, ONEBIT_SYSTEM_ERROR, "no current CUDA device: ", cudaGetErrorString(got));
  for (const auto& [pointer, name] : arrays) {
    if (pointer == nullptr) continue;  // optional (m_before); required ones were checked already
    cudaPointerAttributes attributes{};
    const cudaError_t asked = cudaPointerGetAttributes(&attributes, pointer);
    ONEBIT_CHECK(asked == cudaSuccess, ONEBIT_INVALID_ARGUMENT, name, ": CUDA does not know this pointer (",
                 cudaGetErrorString(asked), ")");
    ONEBIT_CHECK(attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged,
                 ONEBIT_INVALID_ARGUMENT, name, " is not device memory: the _device steps take device pointers ",
                 "(a CUDA tensor's data_ptr); host arrays go to the steps without _device");
    ONEBIT_CHECK(attributes.type == cudaMemoryTypeManaged || attributes.device == current, ONEBIT_INVALID_ARGUMENT,
                 name, " is memory of CUDA device ", attributes.device, " but the current device is ", current,
                 ": make the arrays' device current (cudaSetDevice, torch.cuda.device) for the _device steps");
  }
}

void check_launch(cudaError_t launched, const char* what) {
  ONEBIT_CHECK(launched == cudaSuccess, ONEBIT_SYSTEM_ERROR, what,
               ": the kernel did not launch: ", cudaGetErrorString(launched));
}

cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

// The layers of a LAMB step over all of them: counts and states present, and, for a step that
// takes them (configs_due), every layer's config present and in range, a bad one named by its
// layer (lamb::cuda::apply_steps checks the states likewise). Returns the elements in all.
std::size_t check_lamb_layers(const onebit_lamb_config_t* configs, bool configs_due, const onebit_lamb_layer_t* states,
                              const std::size_t* counts, std::size_t layers) {
  if (layers == 0) return 0;
  ONEBIT_CHECK(counts != nullptr && states != nullptr && (configs != nullptr || !configs_due), ONEBIT_INVALID_ARGUMENT,
               "counts, states or configs is NULL with ", layers, " layers");
  std::size_t total = 0;
  for (std::size_t j = 0; j < layers; ++j) {
    if (configs_due) {
      try {
        to_lamb(&configs[j]);
      } catch (const onebit::Error& error) {
        onebit::fail(error.code(), "layer ", j, ": ", error.what());
      }
    }
    total += counts[j];
  }
  return total;
}

// A call that sums reads its sums back and synchronizes `stream` (optim/cuda/tiled_sums.h), which
// a CUDA graph cannot hold: on a capturing stream the synchronization would fail and invalidate the
// caller's whole capture. Refused first, before any other CUDA call (a capture in CUDA's global mode
// forbids some of them), with nothing queued.
void check_not_capturing(void* stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  const cudaError_t asked = cudaStreamIsCapturing(as_stream(stream), &capture);
  if (asked != cudaSuccess) (void)cudaGetLastError();  // not left for the caller's next launch check
  // The legacy stream while another stream captures (CUDA's global mode): as good as capturing.
  if (asked == cudaErrorStreamCaptureImplicit) capture = cudaStreamCaptureStatusActive;
  ONEBIT_CHECK(asked == cudaSuccess || asked == cudaErrorStreamCaptureImplicit, ONEBIT_SYSTEM_ERROR,
               "cannot ask whether the stream is capturing a CUDA graph: ", cudaGetErrorString(asked));
  ONEBIT_CHECK(capture == cudaStreamCaptureStatusNone, ONEBIT_UNSUPPORTED,
               "the stream is capturing a CUDA graph, and this call reads its sums back to the host and synchronizes "
               "the stream, which a graph cannot hold: call it outside the capture (nothing was queued)");
}

// The workspace of a call that sums: device memory, at least `needed` bytes (as `sizer` says),
// aligned for its sums.
void check_workspace(void* workspace, std::size_t bytes, std::size_t needed, const char* sizer) {
  ONEBIT_CHECK(workspace != nullptr, ONEBIT_INVALID_ARGUMENT, "workspace is NULL: this call needs ", needed,
               " bytes of device memory (", sizer, ")");
  ONEBIT_CHECK(bytes >= needed, ONEBIT_INVALID_ARGUMENT, "workspace of ", bytes,
               " bytes is too small: this call needs ", needed, " (", sizer, ")");
  ONEBIT_CHECK(reinterpret_cast<std::uintptr_t>(workspace) % alignof(tiled::Sums) == 0, ONEBIT_INVALID_ARGUMENT,
               "workspace at ", workspace, " is not aligned to ", alignof(tiled::Sums), " bytes");
  check_on_device(1, {{workspace, "workspace"}});
}

}  // namespace

extern "C" {

int onebit_device_steps(void) { return 1; }

onebit_result_t onebit_adam_warmup_step_device(const onebit_adam_config_t* config, float* params, float* m, float* v,
                                               const float* grad, size_t count, void* stream) {
  return onebit::abi_guard("onebit_adam_warmup_step_device", [&] {
    const auto c = to_adam(config);
    check_arrays(count, {params, m, v, grad});
    check_on_device(count, {{params, "params"}, {m, "m"}, {v, "v"}, {grad, "grad"}});
    check_launch(onebit::optim::cuda::warmup_step(c, params, m, v, grad, count, as_stream(stream)), "warmup step");
  });
}

onebit_result_t onebit_adam_momentum_step_device(const onebit_adam_config_t* config, float* m, float* m_before,
                                                 const float* grad, size_t count, void* stream) {
  return onebit::abi_guard("onebit_adam_momentum_step_device", [&] {
    const auto c = to_adam(config);
    check_arrays(count, {m, grad});
    onebit::capi::check_apart(m, m_before, count);
    check_on_device(count, {{m, "m"}, {m_before, "m_before"}, {grad, "grad"}});
    check_launch(onebit::optim::cuda::momentum_step(c, m, m_before, grad, count, as_stream(stream)), "momentum step");
  });
}

onebit_result_t onebit_adam_apply_step_device(const onebit_adam_config_t* config, float* params, float* m,
                                              const float* v, size_t count, void* stream) {
  return onebit::abi_guard("onebit_adam_apply_step_device", [&] {
    const auto c = to_adam(config);
    check_arrays(count, {params, m, v});
    check_on_device(count, {{params, "params"}, {m, "m"}, {v, "v"}});
    check_launch(onebit::optim::cuda::apply_step(c, params, m, v, count, as_stream(stream)), "apply step");
  });
}

onebit_result_t onebit_dormant_count_device(const float* v, size_t count, float eps, void* workspace,
                                            size_t workspace_bytes, size_t* dormant, void* stream) {
  return onebit::abi_guard("onebit_dormant_count_device", [&] {
    check_arrays(count, {v});
    ONEBIT_CHECK(eps > 0, ONEBIT_INVALID_ARGUMENT, "eps ", eps, " (need > 0)");
    ONEBIT_CHECK(dormant != nullptr, ONEBIT_INVALID_ARGUMENT, "dormant is NULL");
    check_not_capturing(stream);
    check_on_device(count, {{v, "v"}});
    check_workspace(workspace, workspace_bytes, tiled::workspace_bytes(&count, 1), "onebit_measure_workspace_size");
    *dormant = onebit::optim::cuda::dormant_count(v, count, eps, workspace, as_stream(stream));
  });
}

onebit_result_t onebit_adam_variance_change_device(const float* v, const float* v_then, size_t count, void* workspace,
                                                   size_t workspace_bytes, double* change, void* stream) {
  return onebit::abi_guard("onebit_adam_variance_change_device", [&] {
    check_arrays(count, {v, v_then});
    ONEBIT_CHECK(change != nullptr, ONEBIT_INVALID_ARGUMENT, "change is NULL");
    check_not_capturing(stream);
    check_on_device(count, {{v, "v"}, {v_then, "v_then"}});
    check_workspace(workspace, workspace_bytes, tiled::workspace_bytes(&count, 1), "onebit_measure_workspace_size");
    *change = onebit::optim::cuda::variance_change(v, v_then, count, workspace, as_stream(stream));
  });
}

onebit_result_t onebit_zero_one_adam_gradient_step_device(const onebit_zero_one_adam_config_t* config, float* params,
                                                          float* m, float* v, const float* grad, size_t count,
                                                          int update_variance, void* stream) {
  return onebit::abi_guard("onebit_zero_one_adam_gradient_step_device", [&] {
    const auto& c = to_zero_one_adam(config);
    check_arrays(count, {params, m, v, grad});
    check_on_device(count, {{params, "params"}, {m, "m"}, {v, "v"}, {grad, "grad"}});
    check_launch(
        zero_one_adam::cuda::gradient_step(c, params, m, v, grad, count, update_variance != 0, as_stream(stream)),
        "0/1 Adam gradient step");
  });
}

onebit_result_t onebit_zero_one_adam_local_step_device(const onebit_zero_one_adam_config_t* config, float* params,
                                                       float* m, const float* v, float* u, float* lrs,
                                                       const float* grad, size_t count, void* stream) {
  return onebit::abi_guard("onebit_zero_one_adam_local_step_device", [&] {
    const auto& c = to_zero_one_adam(config);
    check_arrays(count, {params, m, v, u, grad});
    float& sum = non_null(lrs, "lrs");
    check_on_device(count, {{params, "params"}, {m, "m"}, {v, "v"}, {u, "u"}, {grad, "grad"}});
    check_launch(zero_one_adam::cuda::local_step(c, params, m, v, u, &sum, grad, count, as_stream(stream)),
                 "0/1 Adam local step");
  });
}

onebit_result_t onebit_zero_one_adam_sync_begin_device(const onebit_zero_one_adam_config_t* config, float* u,
                                                       const float* v, float lrs, size_t count, void* stream) {
  return onebit::abi_guard("onebit_zero_one_adam_sync_begin_device", [&] {
    const auto& c = to_zero_one_adam(config);
    check_arrays(count, {u, v});
    zero_one_adam::check_sync(lrs);
    check_on_device(count, {{u, "u"}, {v, "v"}});
    check_launch(zero_one_adam::cuda::sync_begin(c, u, v, lrs, count, as_stream(stream)), "0/1 Adam sync begin");
  });
}

onebit_result_t onebit_zero_one_adam_sync_end_device(const onebit_zero_one_adam_config_t* config, float* params,
                                                     float* params_at_sync, float* m, float* u, const float* v,
                                                     float* lrs, size_t count, void* stream) {
  return onebit::abi_guard("onebit_zero_one_adam_sync_end_device", [&] {
    const auto& c = to_zero_one_adam(config);
    check_arrays(count, {params, params_at_sync, m, u, v});
    zero_one_adam::check_sync(non_null(lrs, "lrs"));
    check_on_device(count, {{params, "params"}, {params_at_sync, "params_at_sync"}, {m, "m"}, {u, "u"}, {v, "v"}});
    check_launch(zero_one_adam::cuda::sync_end(c, params, params_at_sync, m, u, v, lrs, count, as_stream(stream)),
                 "0/1 Adam sync end");
  });
}

onebit_result_t onebit_lamb_warmup_steps_device(const onebit_lamb_config_t* configs, onebit_lamb_layer_t* states,
                                                const size_t* counts, size_t layers, int64_t step, float* params,
                                                float* m, float* v, float* v_fresh, const float* grad, void* workspace,
                                                size_t workspace_bytes, void* stream) {
  return onebit::abi_guard("onebit_lamb_warmup_steps_device", [&] {
    const std::size_t total = check_lamb_layers(configs, true, states, counts, layers);
    check_arrays(total, {params, m, v, v_fresh, grad});
    check_not_capturing(stream);
    check_on_device(total, {{params, "params"}, {m, "m"}, {v, "v"}, {v_fresh, "v_fresh"}, {grad, "grad"}});
    check_workspace(workspace, workspace_bytes, tiled::workspace_bytes(counts, layers), "onebit_lamb_workspace_size");
    lamb::cuda::warmup_steps(configs, states, counts, layers, step, params, m, v, v_fresh, grad, workspace,
                             as_stream(stream));
  });
}

onebit_result_t onebit_lamb_scaling_coeffs_device(const float* m, const size_t* counts, size_t layers,
                                                  onebit_lamb_layer_t* states, void* workspace, size_t workspace_bytes,
                                                  void* stream) {
  return onebit::abi_guard("onebit_lamb_scaling_coeffs_device", [&] {
    const std::size_t total = check_lamb_layers(nullptr, false, states, counts, layers);
    check_arrays(total, {m});
    check_not_capturing(stream);
    check_on_device(total, {{m, "m"}});
    check_workspace(workspace, workspace_bytes, tiled::workspace_bytes(counts, layers), "onebit_lamb_workspace_size");
    lamb::cuda::scaling_coeffs(m, counts, layers, states, workspace, as_stream(stream));
  });
}

onebit_result_t onebit_lamb_momentum_step_device(const onebit_lamb_config_t* config, const onebit_lamb_layer_t* layer,
                                                 float* m, float* m_last, const float* grad, size_t count,
                                                 void* stream) {
  return onebit::abi_guard("onebit_lamb_momentum_step_device", [&] {
    const auto& c = to_lamb(config);
    const auto& l = non_null(layer, "layer");
    check_arrays(count, {m, m_last, grad});
    check_on_device(count, {{m, "m"}, {m_last, "m_last"}, {grad, "grad"}});
    lamb::cuda::momentum_step(c, l, m, m_last, grad, count, as_stream(stream));
  });
}

onebit_result_t onebit_lamb_apply_steps_device(const onebit_lamb_config_t* configs, onebit_lamb_layer_t* states,
                                               const size_t* counts, size_t layers, float* params, float* m,
                                               const float* m_last, const float* v, float* v_fresh, void* workspace,
                                               size_t workspace_bytes, void* stream) {
  return onebit::abi_guard("onebit_lamb_apply_steps_device", [&] {
    const std::size_t total = check_lamb_layers(configs, true, states, counts, layers);
    check_arrays(total, {params, m, m_last, v, v_fresh});
    check_not_capturing(stream);
    check_on_device(total, {{params, "params"}, {m, "m"}, {m_last, "m_last"}, {v, "v"}, {v_fresh, "v_fresh"}});
    check_workspace(workspace, workspace_bytes, tiled::workspace_bytes(counts, layers), "onebit_lamb_workspace_size");
    lamb::cuda::apply_steps(configs, states, counts, layers, params, m, m_last, v, v_fresh, workspace,
                            as_stream(stream));
  });
}

}  // extern "C"
