"""onebit for PyTorch: tag tensors whose allreduce onebit should compress.

Run the training script with the front-door library preloaded, e.g.

    LD_PRELOAD=/path/to/libonebit-preload.so torchrun ... train.py

then, in the script, ``onebit.tag(tensor, "name")`` makes every ``dist.all_reduce(tensor)`` of that
exact tensor (gloo backend, float32 or float16, SUM) run onebit's 1-bit compressed,
error-compensated allreduce; everything else is untouched. ``onebit.OnebitAdam`` is the optimizer
that drives it, ``onebit.ddp_comm_hook`` its DDP hook (docs/usage.md).
"""
import ctypes

__all__ = ["tag", "untag", "stats", "OnebitNotLoaded", "OnebitAdam", "ddp_comm_hook"]


def __getattr__(name):  # torch is imported only by those who use the optimizer
    if name in ("OnebitAdam", "ddp_comm_hook"):
        from . import optim
        return getattr(optim, name)
    raise AttributeError(f"module 'onebit' has no attribute {name!r}")

_DTYPES = {"torch.float32": 0, "torch.float16": 1, "torch.bfloat16": 2}


class OnebitNotLoaded(RuntimeError):
    pass


class _Stats(ctypes.Structure):  # onebit_stats_t
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "compressed_calls", "full_precision_calls", "bytes_sent", "bytes_received",
        "compressed_bytes_sent", "full_precision_bytes_sent")]


class _PreloadStats(ctypes.Structure):  # onebit_preload_stats_t
    _fields_ = [("onebit", _Stats), ("forwarded_calls", ctypes.c_uint64), ("forwarded_bytes", ctypes.c_uint64)]


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
    """What onebit did in this process, as a dict:

    compressed_calls, bytes_sent, bytes_received, compressed_bytes_sent: the all_reduces onebit took
    and what its transport moved for them (per rank); forwarded_calls, forwarded_bytes: the
    all_reduces passed on to gloo untouched and their buffers' bytes (gloo's ring sends about
    2·(W−1)/W times that); full_precision_*: onebit's own ring, which the front door does not use.
    """
    lib = _library()
    out = _PreloadStats()
    _check(lib, lib.onebit_preload_stats(ctypes.byref(out)))
    result = {name: getattr(out.onebit, name) for name, _ in _Stats._fields_}
    result["forwarded_calls"] = out.forwarded_calls
    result["forwarded_bytes"] = out.forwarded_bytes
    return result
