"""Calls into the C core that every optimizer module makes: an array's address, and the texts the
C core writes for the shims (onebit.h, "What the shims say"). Private."""
from __future__ import annotations

import ctypes
import weakref

from . import _capi, _check

_NOT_RECORDED = -2**63  # a checkpoint's setting not recorded (onebit_resume_refusal)


def _ptr(tensor):
    return ctypes.c_void_p(tensor.data_ptr())


def _core_text(lib, name, *args):
    """A text the C core writes (onebit.h, "What the shims say"): `name`(*args, text, size, &length)."""
    function, length = getattr(lib, name), ctypes.c_size_t()
    text = ctypes.create_string_buffer(512)
    _check(lib, function(*args, text, ctypes.c_size_t(len(text)), ctypes.byref(length)))
    if length.value >= len(text):
        text = ctypes.create_string_buffer(length.value + 1)
        _check(lib, function(*args, text, ctypes.c_size_t(len(text)), ctypes.byref(length)))
    return text.value.decode()


def _core_fields(lib, name, *args):
    """{name: value} of what every rank must hold alike, in the C core's names:
    `name`(*args, names, values, capacity, &count) (onebit.h)."""
    count = ctypes.c_size_t()
    _check(lib, getattr(lib, name)(*args, None, None, 0, ctypes.byref(count)))
    names, values = (ctypes.c_char_p * count.value)(), (ctypes.c_int64 * count.value)()
    _check(lib, getattr(lib, name)(*args, names, values, count, ctypes.byref(count)))
    return {field.decode(): value for field, value in zip(names, values)}


class _AdamDriver:
    """OnebitAdam's driver in the C core (onebit.h, "OnebitAdam's driver"): the schedule, the
    automatic freeze, the step settings, the agreed fields and the resume rule, for the Python shim
    as for the C++ one. Destroyed with its owner."""

    COUNTING, WARMUP, COMPRESSED = 0, 1, 2  # onebit_adam_step_kind_t

    def __init__(self, lib, who, schedule, parameters, groups):
        self._lib = lib
        handle = ctypes.c_void_p()
        _check(lib, lib.onebit_adam_driver_create(who.encode(), ctypes.byref(schedule), parameters, groups,
                                                  ctypes.byref(handle)))
        self._handle = handle
        self._release = weakref.finalize(self, lib.onebit_adam_driver_destroy, handle)

    def status(self):
        status = _capi.AdamDriverStatus()
        _check(self._lib, self._lib.onebit_adam_driver_status(self._handle, ctypes.byref(status)))
        return status

    def config(self, group):
        """The step settings of parameter group `group` (a param_groups dict) for the next step."""
        beta1, beta2 = group["betas"]
        hyper = _capi.AdamHyper(*(float(x) for x in (group["lr"], beta1, beta2, group["eps"], group["weight_decay"])))
        config = _capi.AdamConfig()
        _check(self._lib, self._lib.onebit_adam_driver_config(self._handle, ctypes.byref(hyper), ctypes.byref(config)))
        return config

    def taken(self):
        """The step was taken: whether the variance change is to be measured now (then decide())."""
        measure = ctypes.c_int()
        _check(self._lib, self._lib.onebit_adam_driver_taken(self._handle, ctypes.byref(measure)))
        return bool(measure.value)

    def decide(self, changes):
        _check(self._lib, self._lib.onebit_adam_driver_decide(self._handle, (ctypes.c_double * len(changes))(*changes),
                                                              len(changes)))

    def news(self):
        return _core_text(self._lib, "onebit_adam_driver_news", self._handle)

    def changes(self):
        """(step, change) of every measurement of the automatic freeze."""
        count = ctypes.c_size_t()
        _check(self._lib, self._lib.onebit_adam_driver_changes(self._handle, None, None, 0, ctypes.byref(count)))
        steps, changes = (ctypes.c_int64 * count.value)(), (ctypes.c_double * count.value)()
        _check(self._lib, self._lib.onebit_adam_driver_changes(self._handle, steps, changes, count,
                                                               ctypes.byref(count)))
        return list(zip(steps, changes))

    def agreed_fields(self, state=None):
        """{name: value} of what every rank must hold alike (`state`: a checkpoint's, at load)."""
        return _core_fields(self._lib, "onebit_adam_driver_agreed_fields", self._handle,
                            None if state is None else ctypes.byref(state))

    def state(self):
        state = _capi.AdamDriverState()
        _check(self._lib, self._lib.onebit_adam_driver_state(self._handle, ctypes.byref(state)))
        return state

    def resume_refusal(self, state):
        return _core_text(self._lib, "onebit_adam_driver_resume_refusal", self._handle, ctypes.byref(state)) or None

    def resume(self, state, changes):
        steps = (ctypes.c_int64 * len(changes))(*(int(step) for step, _ in changes))
        values = (ctypes.c_double * len(changes))(*(float(change) for _, change in changes))
        _check(self._lib, self._lib.onebit_adam_driver_resume(self._handle, ctypes.byref(state), steps, values,
                                                              len(changes)))
