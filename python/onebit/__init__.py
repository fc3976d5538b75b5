"""onebit for PyTorch: tag tensors whose allreduce onebit should compress.

Run the training script with the front-door library preloaded, e.g.

    LD_PRELOAD=/path/to/libonebit-preload.so torchrun ... train.py

then, in the script, ``onebit.tag(tensor, "name")`` makes every ``dist.all_reduce(tensor)`` of that
exact tensor (gloo backend, float32, SUM) run onebit's 1-bit compressed, error-compensated
allreduce; everything else is untouched. (The optimizer shim of issue 5 is not here yet.)
"""
import ctypes

__all__ = ["tag", "untag", "stats", "OnebitNotLoaded"]

_DTYPES = {"torch.float32": 0, "torch.float16": 1, "torch.bfloat16": 2}


class OnebitNotLoaded(RuntimeError):
    pass


class _Stats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "compressed_calls", "full_precision_calls", "bytes_sent", "bytes_received",
        "compressed_bytes_sent", "full_precision_bytes_sent")]


def _library():
    process = ctypes.CDLL(None)
    if not hasattr(process, "onebit_preload_stats"):
        raise OnebitNotLoaded(
            "onebit is not loaded in this process: run with LD_PRELOAD=/path/to/libonebit-preload.so")
    process.onebit_last_error.restype = ctypes.c_char_p
    return process


def _check(lib, result):
    if result != 0:
        raise RuntimeError(lib.onebit_last_error().decode())


def tag(tensor, name):
    """Compress allreduces of exactly this tensor (same storage, same number of elements) under
    `name`. The error-feedback state belongs to the name. Every rank must tag the same names."""
    lib = _library()
    dtype = _DTYPES.get(str(tensor.dtype))
    if dtype is None:
        raise ValueError(f"onebit.tag: {tensor.dtype} is not float32, float16 or bfloat16")
    if not tensor.is_contiguous():
        raise ValueError("onebit.tag: the tensor must be contiguous")
    _check(lib, lib.onebit_tag(name.encode(), ctypes.c_void_p(tensor.data_ptr()),
                               ctypes.c_size_t(tensor.numel()), ctypes.c_int(dtype)))


def untag(tensor):
    """Stop compressing this tensor and free its error-feedback state."""
    lib = _library()
    _check(lib, lib.onebit_untag(ctypes.c_void_p(tensor.data_ptr())))


def stats():
    """Counters of the compressed and full-precision calls onebit ran in this process."""
    lib = _library()
    out = _Stats()
    _check(lib, lib.onebit_preload_stats(ctypes.byref(out)))
    return {name: getattr(out, name) for name, _ in _Stats._fields_}
