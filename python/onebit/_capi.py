"""onebit's C ABI as ctypes sees it: every struct of include/onebit/onebit.h (with the onebit_types.h
it includes) and preload.h, and the prototype (restype, argtypes) of every ONEBIT_API function,
declared here once.

The headers are the truth; tests/python/capi_check.py parses them and fails when a function, a
struct or a field here disagrees (ctest python.capi). Imports nothing but ctypes, so the check
runs without torch or a built library.

How C types are spelled here, so that the shim's call sites convert as they always did:
  - onebit_result_t and the other enums: c_int (each is int-sized: the *_ENUM_MAX_ members);
  - data pointers (float*, const float*, void*, a device stream): c_void_p, which takes the shim's
    c_void_p(tensor.data_ptr()) (_ptr), a plain int address and byref(c_float) alike;
  - a struct pointer: POINTER(the struct), which takes byref(struct) and an array of structs;
  - an out-pointer to a scalar (size_t*, double*, int*, uint64_t*, onebit_comm_t*): POINTER of
    that scalar, which takes byref(c_size_t()) and so on;
  - const char*: c_char_p (bytes in, bytes out); char* out-buffers: POINTER(c_char), which takes a
    create_string_buffer.
"""
import ctypes
from ctypes import POINTER, c_char, c_char_p, c_double, c_float, c_int, c_int32, c_int64, c_size_t, c_uint64, c_void_p


class Stats(ctypes.Structure):  # onebit_stats_t
    _fields_ = [(name, c_uint64) for name in (
        "compressed_calls", "full_precision_calls", "bytes_sent", "bytes_received",
        "compressed_bytes_sent", "full_precision_bytes_sent")]


class PreloadStats(ctypes.Structure):  # onebit_preload_stats_t (preload.h)
    _fields_ = [("onebit", Stats), ("forwarded_calls", c_uint64), ("forwarded_bytes", c_uint64)]


class Config(ctypes.Structure):  # onebit_config_t
    _fields_ = [("timeout_ms", c_int64), ("sockets_per_peer", c_int),
                ("socket_ifname", c_char_p), ("auth_key", c_char_p),
                ("job_id", c_char_p), ("secret", c_char_p)]


class AdamConfig(ctypes.Structure):  # onebit_adam_config_t
    _fields_ = [("lr", c_float), ("beta1", c_float), ("beta2", c_float),
                ("eps", c_float), ("weight_decay", c_float), ("freeze_step", c_int64)]


class AdamAutoFreeze(ctypes.Structure):  # onebit_adam_auto_freeze_t
    _fields_ = [("window", c_int64), ("threshold", c_double), ("max_step", c_int64)]


class AdamSchedule(ctypes.Structure):  # onebit_adam_schedule_t
    _fields_ = [("freeze_step", c_int64), ("automatic", AdamAutoFreeze),
                ("deepspeed_schedule", c_int32), ("bias_correction", c_int32)]


class AdamHyper(ctypes.Structure):  # onebit_adam_hyper_t
    _fields_ = [("lr", c_double), ("beta1", c_double), ("beta2", c_double),
                ("eps", c_double), ("weight_decay", c_double)]


class AdamDriverStatus(ctypes.Structure):  # onebit_adam_driver_status_t
    _fields_ = [("step", c_int64), ("freeze_step", c_int64), ("steps_taken", c_int64),
                ("next", c_int32), ("freezes_now", c_int32)]


class AdamDriverState(ctypes.Structure):  # onebit_adam_driver_state_t
    _fields_ = [("step", c_int64), ("freeze_step", c_int64), ("automatic", c_int64),
                ("bias_correction", c_int64), ("deepspeed_schedule", c_int64)]


class ZeroOneAdamConfig(ctypes.Structure):  # onebit_zero_one_adam_config_t
    _fields_ = [("lr", c_float), ("beta1", c_float), ("beta2", c_float),
                ("eps", c_float), ("weight_decay", c_float), ("var_freeze_step", c_int64),
                ("var_update_scaler", c_int64), ("local_step_scaler", c_int64),
                ("local_step_clipper", c_int64)]


class ZeroOneAdamSchedule(ctypes.Structure):  # onebit_zero_one_adam_schedule_t
    _fields_ = [("step", c_int64), ("var_interval", c_int64), ("var_counter", c_int64),
                ("local_step_interval", c_int64), ("local_step_counter", c_int64)]


class LambConfig(ctypes.Structure):  # onebit_lamb_config_t
    _fields_ = [("lr", c_float), ("beta1", c_float), ("beta2", c_float),
                ("eps", c_float), ("weight_decay", c_float), ("freeze_step", c_int64),
                ("max_coeff", c_double), ("min_coeff", c_double), ("coeff_beta", c_double),
                ("factor_max", c_double), ("factor_min", c_double),
                ("factor_threshold", c_double)]


class LambLayer(ctypes.Structure):  # onebit_lamb_layer_t
    _fields_ = [("coeff_freeze", c_double), ("last_factor", c_double),
                ("scaling_coeff", c_double), ("lamb_coeff", c_double)]


# The C typedef of each struct above (the check matches fields by these names).
STRUCTS = {
    "onebit_stats_t": Stats,
    "onebit_preload_stats_t": PreloadStats,
    "onebit_config_t": Config,
    "onebit_adam_config_t": AdamConfig,
    "onebit_adam_auto_freeze_t": AdamAutoFreeze,
    "onebit_adam_schedule_t": AdamSchedule,
    "onebit_adam_hyper_t": AdamHyper,
    "onebit_adam_driver_status_t": AdamDriverStatus,
    "onebit_adam_driver_state_t": AdamDriverState,
    "onebit_zero_one_adam_config_t": ZeroOneAdamConfig,
    "onebit_zero_one_adam_schedule_t": ZeroOneAdamSchedule,
    "onebit_lamb_config_t": LambConfig,
    "onebit_lamb_layer_t": LambLayer,
}

_result = c_int  # onebit_result_t
_enum = c_int  # onebit_dtype_t, onebit_op_t
_comm = c_void_p  # onebit_comm_t (an opaque struct pointer)
_driver = c_void_p  # onebit_adam_driver_t (an opaque struct pointer)
_checkpoint = c_void_p  # onebit_checkpoint_t (an opaque struct pointer)
_data = c_void_p  # float*, const float*, void*: see the module's docstring
_AdamConfigP, _AutoFreezeP = POINTER(AdamConfig), POINTER(AdamAutoFreeze)
_ZeroOneConfigP, _ScheduleP = POINTER(ZeroOneAdamConfig), POINTER(ZeroOneAdamSchedule)
_LambConfigP, _LayerP = POINTER(LambConfig), POINTER(LambLayer)

# name: (restype, argtypes), in the headers' order.
PROTOTYPES = {
    "onebit_version": (c_int, ()),
    "onebit_result_string": (c_char_p, (_result,)),
    "onebit_last_error": (c_char_p, ()),
    "onebit_cpu_kernels": (_result, (POINTER(c_char_p),)),
    "onebit_comm_init": (_result, (POINTER(_comm), c_int, c_int, c_char_p)),
    "onebit_comm_init_config": (_result, (POINTER(_comm), c_int, c_int, c_char_p, POINTER(Config))),
    "onebit_root_listen": (_result, (c_char_p, POINTER(c_char), c_size_t)),
    "onebit_root_check": (_result, (c_int, c_int, c_char_p, c_int64)),
    "onebit_root_close": (_result, (c_char_p,)),
    "onebit_comm_init_env": (_result, (POINTER(_comm),)),
    "onebit_comm_destroy": (_result, (_comm,)),
    "onebit_comm_rank": (_result, (_comm, POINTER(c_int))),
    "onebit_comm_size": (_result, (_comm, POINTER(c_int))),
    "onebit_comm_local_size": (_result, (_comm, POINTER(c_int))),
    "onebit_local_size_from_env": (_result, (c_int, c_int, POINTER(c_int))),
    "onebit_comm_stats": (_result, (_comm, POINTER(Stats))),
    "onebit_tag": (_result, (c_char_p, _data, c_size_t, _enum)),
    "onebit_untag": (_result, (_data,)),
    "onebit_tag_detach": (_result, (_data,)),
    "onebit_tag_find": (_result, (_data, c_size_t, _enum, POINTER(c_int), POINTER(c_char), c_size_t)),
    "onebit_tag_stats": (_result, (c_char_p, POINTER(c_uint64), POINTER(c_uint64))),
    "onebit_tag_state_size": (_result, (c_char_p, POINTER(c_size_t), POINTER(c_size_t))),
    "onebit_tag_state_check": (_result, (c_char_p, c_size_t)),
    "onebit_tag_set_step_settings": (_result, (c_char_p, POINTER(c_char_p), POINTER(c_double), c_size_t)),
    "onebit_tag_state_check_layout": (_result, (c_int, c_int, c_int, c_int)),
    "onebit_tag_state_save": (_result, (c_char_p, _data, _data)),
    "onebit_tag_state_load": (_result, (c_char_p, _data, c_size_t, _data, c_size_t)),
    "onebit_allreduce": (_result, (_comm, _data, c_size_t, _enum, _enum)),
    "onebit_adam_freeze_step": (c_int64, (c_int64,)),
    "onebit_adam_compressing": (c_int, (_AdamConfigP, c_int64)),
    "onebit_adam_warmup_step": (_result, (_AdamConfigP, _data, _data, _data, _data, c_size_t)),
    "onebit_adam_momentum_step": (_result, (_AdamConfigP, _data, _data, c_size_t)),
    "onebit_adam_momentum_step_keeping": (_result, (_AdamConfigP, _data, _data, _data, c_size_t)),
    "onebit_adam_apply_step": (_result, (_AdamConfigP, _data, _data, _data, c_size_t)),
    "onebit_device_steps": (c_int, ()),
    "onebit_adam_warmup_step_device": (_result, (_AdamConfigP, _data, _data, _data, _data, c_size_t, c_void_p)),
    "onebit_adam_momentum_step_device": (_result, (_AdamConfigP, _data, _data, _data, c_size_t, c_void_p)),
    "onebit_adam_apply_step_device": (_result, (_AdamConfigP, _data, _data, _data, c_size_t, c_void_p)),
    "onebit_adam_step_bound": (c_float, (c_float, c_float)),
    "onebit_dormant_count": (_result, (_data, c_size_t, c_float, POINTER(c_size_t))),
    "onebit_adam_auto_freeze_measures": (c_int, (_AutoFreezeP, c_int64)),
    "onebit_adam_variance_change": (_result, (_data, _data, c_size_t, POINTER(c_double))),
    "onebit_adam_auto_freeze_decide": (c_int64, (_AutoFreezeP, c_int64, c_double)),
    "onebit_freeze_report": (_result, (c_char_p, c_int64, POINTER(c_size_t), POINTER(c_size_t), c_size_t,
                                       POINTER(c_char), c_size_t, POINTER(c_size_t))),
    "onebit_step_failure_text": (_result, (c_char_p, c_int64, c_char_p, _result, c_char_p, POINTER(c_char), c_size_t,
                                           POINTER(c_size_t))),
    "onebit_adam_auto_freeze_decide_ranks": (c_int64, (_AutoFreezeP, c_int64, POINTER(c_double), c_size_t,
                                                       POINTER(c_double))),
    "onebit_ranks_disagreement": (_result, (c_char_p, POINTER(c_char_p), c_size_t, POINTER(c_int64), c_size_t, _enum,
                                            POINTER(c_char), c_size_t, POINTER(c_size_t))),
    "onebit_resume_refusal": (_result, (c_int64, POINTER(c_char_p), POINTER(c_int64), POINTER(c_int64), c_size_t, c_int,
                                        POINTER(c_char), c_size_t, POINTER(c_size_t))),
    "onebit_zero_one_adam_agreed_fields": (_result, (_ZeroOneConfigP, _ScheduleP, c_size_t, c_size_t,
                                                     POINTER(c_char_p), POINTER(c_int64), c_size_t, POINTER(c_size_t))),
    "onebit_zero_one_adam_resume_refusal": (_result, (_ZeroOneConfigP, _ScheduleP, _ZeroOneConfigP, POINTER(c_char),
                                                      c_size_t, POINTER(c_size_t))),
    "onebit_zero_one_adam_sync_refusal": (_result, (POINTER(c_float), c_size_t, c_int64, POINTER(c_char), c_size_t,
                                                    POINTER(c_size_t))),
    "onebit_lamb_agreed_fields": (_result, (_LambConfigP, c_int64, c_size_t, c_size_t, POINTER(c_char_p),
                                            POINTER(c_int64), c_size_t, POINTER(c_size_t))),
    "onebit_lamb_resume_refusal": (_result, (_LambConfigP, c_int64, c_int64, POINTER(c_char), c_size_t,
                                             POINTER(c_size_t))),
    "onebit_checkpoint_create": (_result, (POINTER(_checkpoint),)),
    "onebit_checkpoint_destroy": (None, (_checkpoint,)),
    "onebit_checkpoint_put_int": (_result, (_checkpoint, c_char_p, c_int64)),
    "onebit_checkpoint_put_ints": (_result, (_checkpoint, c_char_p, POINTER(c_int64), c_size_t)),
    "onebit_checkpoint_put_floats": (_result, (_checkpoint, c_char_p, _data, c_size_t)),
    "onebit_checkpoint_put_doubles": (_result, (_checkpoint, c_char_p, POINTER(c_double), c_size_t)),
    "onebit_checkpoint_put_text": (_result, (_checkpoint, c_char_p, c_char_p)),
    "onebit_checkpoint_write": (_result, (_checkpoint, c_char_p)),
    "onebit_checkpoint_stream": (_result, (c_char_p, POINTER(_checkpoint))),
    "onebit_checkpoint_commit": (_result, (_checkpoint,)),
    "onebit_checkpoint_read": (_result, (c_char_p, POINTER(_checkpoint))),
    "onebit_checkpoint_read_rank": (_result, (c_char_p, c_int, POINTER(_checkpoint))),
    "onebit_checkpoint_record": (_result, (_checkpoint, c_char_p, POINTER(c_int), POINTER(c_size_t))),
    "onebit_checkpoint_names": (_result, (_checkpoint, POINTER(c_char_p), c_size_t, POINTER(c_size_t))),
    "onebit_checkpoint_get_int": (_result, (_checkpoint, c_char_p, POINTER(c_int64))),
    "onebit_checkpoint_get_ints": (_result, (_checkpoint, c_char_p, POINTER(c_int64), c_size_t)),
    "onebit_checkpoint_get_floats": (_result, (_checkpoint, c_char_p, _data, c_size_t)),
    "onebit_checkpoint_get_doubles": (_result, (_checkpoint, c_char_p, POINTER(c_double), c_size_t)),
    "onebit_checkpoint_get_text": (_result, (_checkpoint, c_char_p, POINTER(c_char), c_size_t, POINTER(c_size_t))),
    "onebit_adam_driver_create": (_result, (c_char_p, POINTER(AdamSchedule), c_size_t, c_size_t, POINTER(_driver))),
    "onebit_adam_driver_destroy": (None, (_driver,)),
    "onebit_adam_driver_status": (_result, (_driver, POINTER(AdamDriverStatus))),
    "onebit_adam_driver_config": (_result, (_driver, POINTER(AdamHyper), _AdamConfigP)),
    "onebit_adam_driver_taken": (_result, (_driver, POINTER(c_int))),
    "onebit_adam_driver_decide": (_result, (_driver, POINTER(c_double), c_size_t)),
    "onebit_adam_driver_news": (_result, (_driver, POINTER(c_char), c_size_t, POINTER(c_size_t))),
    "onebit_adam_driver_changes": (_result, (_driver, POINTER(c_int64), POINTER(c_double), c_size_t,
                                             POINTER(c_size_t))),
    "onebit_adam_driver_agreed_fields": (_result, (_driver, POINTER(AdamDriverState), POINTER(c_char_p),
                                                   POINTER(c_int64), c_size_t, POINTER(c_size_t))),
    "onebit_adam_driver_state": (_result, (_driver, POINTER(AdamDriverState))),
    "onebit_adam_driver_resume_refusal": (_result, (_driver, POINTER(AdamDriverState), POINTER(c_char), c_size_t,
                                                    POINTER(c_size_t))),
    "onebit_adam_driver_resume": (_result, (_driver, POINTER(AdamDriverState), POINTER(c_int64), POINTER(c_double),
                                            c_size_t)),
    "onebit_measure_workspace_size": (c_size_t, (c_size_t,)),
    "onebit_dormant_count_device": (_result, (_data, c_size_t, c_float, c_void_p, c_size_t, POINTER(c_size_t),
                                              c_void_p)),
    "onebit_adam_variance_change_device": (_result, (_data, _data, c_size_t, c_void_p, c_size_t, POINTER(c_double),
                                                     c_void_p)),
    "onebit_zero_one_adam_schedule_init": (_result, (_ScheduleP,)),
    "onebit_zero_one_adam_next": (_result, (_ZeroOneConfigP, _ScheduleP, POINTER(c_int))),
    "onebit_zero_one_adam_advance": (_result, (_ZeroOneConfigP, _ScheduleP)),
    "onebit_zero_one_adam_gradient_step": (_result, (_ZeroOneConfigP, _data, _data, _data, _data, c_size_t, c_int)),
    "onebit_zero_one_adam_local_step": (_result, (_ZeroOneConfigP, _data, _data, _data, _data, _data, _data,
                                                  c_size_t)),
    "onebit_zero_one_adam_sync_begin": (_result, (_ZeroOneConfigP, _data, _data, c_float, c_size_t)),
    "onebit_zero_one_adam_sync_end": (_result, (_ZeroOneConfigP, _data, _data, _data, _data, _data, _data,
                                                c_size_t)),
    "onebit_zero_one_adam_gradient_step_device": (_result, (_ZeroOneConfigP, _data, _data, _data, _data, c_size_t,
                                                            c_int, c_void_p)),
    "onebit_zero_one_adam_local_step_device": (_result, (_ZeroOneConfigP, _data, _data, _data, _data, _data, _data,
                                                         c_size_t, c_void_p)),
    "onebit_zero_one_adam_sync_begin_device": (_result, (_ZeroOneConfigP, _data, _data, c_float, c_size_t, c_void_p)),
    "onebit_zero_one_adam_sync_end_device": (_result, (_ZeroOneConfigP, _data, _data, _data, _data, _data, _data,
                                                       c_size_t, c_void_p)),
    "onebit_lamb_layer_init": (_result, (_LayerP,)),
    "onebit_lamb_compressing": (c_int, (_LambConfigP, c_int64)),
    "onebit_lamb_warmup_step": (_result, (_LambConfigP, _LayerP, c_int64, _data, _data, _data, _data, _data,
                                          c_size_t)),
    "onebit_lamb_scaling_coeffs": (_result, (_data, POINTER(c_size_t), c_size_t, _LayerP)),
    "onebit_lamb_momentum_step": (_result, (_LambConfigP, _LayerP, _data, _data, _data, c_size_t)),
    "onebit_lamb_apply_step": (_result, (_LambConfigP, _LayerP, _data, _data, _data, _data, _data, c_size_t)),
    "onebit_lamb_workspace_size": (c_size_t, (POINTER(c_size_t), c_size_t)),
    "onebit_lamb_warmup_steps_device": (_result, (_LambConfigP, _LayerP, POINTER(c_size_t), c_size_t, c_int64, _data,
                                                  _data, _data, _data, _data, c_void_p, c_size_t, c_void_p)),
    "onebit_lamb_scaling_coeffs_device": (_result, (_data, POINTER(c_size_t), c_size_t, _LayerP, c_void_p, c_size_t,
                                                    c_void_p)),
    "onebit_lamb_momentum_step_device": (_result, (_LambConfigP, _LayerP, _data, _data, _data, c_size_t, c_void_p)),
    "onebit_lamb_apply_steps_device": (_result, (_LambConfigP, _LayerP, POINTER(c_size_t), c_size_t, _data, _data,
                                                 _data, _data, _data, c_void_p, c_size_t, c_void_p)),
    "onebit_preload_stats": (_result, (POINTER(PreloadStats),)),  # preload.h: the Gloo door only
}


def declare(lib):
    """Sets restype and argtypes of every function in PROTOTYPES that `lib` exports; returns `lib`.

    A function `lib` lacks is skipped, not an error: which functions a library has depends on what
    it is (onebit_preload_stats only in libonebit-preload.so) and how old it is (onebit_root_listen,
    the device steps), and the callers test hasattr(lib, ...) where they need one."""
    for name, (restype, argtypes) in PROTOTYPES.items():
        if hasattr(lib, name):
            function = getattr(lib, name)
            function.restype = restype
            function.argtypes = argtypes
    return lib
