"""Calls into the C core that every optimizer module makes: an array's address, and the texts the
C core writes for the shims (onebit.h, "What the shims say"). Private."""
from __future__ import annotations

import ctypes

from . import _check

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


def _schedule_change_refusal(lib, step, freeze, inclusive, settings=()):
    """Why a checkpoint saved after `step` steps cannot go on under this optimizer's schedule, or
    None: the C core's rule and words (onebit_resume_refusal). `freeze` is (name, saved, mine) of
    the freeze step, `settings` more of them; a saved value of None was not recorded."""
    every = [freeze, *settings]
    names = (ctypes.c_char_p * len(every))(*[name.encode() for name, _, _ in every])
    saved = (ctypes.c_int64 * len(every))(*[_NOT_RECORDED if s is None else int(s) for _, s, _ in every])
    mine = (ctypes.c_int64 * len(every))(*[int(m) for _, _, m in every])
    refusal = _core_text(lib, "onebit_resume_refusal", ctypes.c_int64(step), names, saved, mine, len(every),
                         int(inclusive))
    return refusal or None
