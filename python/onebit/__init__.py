"""onebit for PyTorch: tag tensors whose allreduce onebit should compress.

Two ways in (docs/usage/pytorch.md):
  - PyTorch 2.x from pip (its gloo is bundled in libtorch_cpu.so): the "onebit" backend,
        onebit.register_backend(); dist.init_process_group("onebit", ...)
    with libonebit.so from the wheel (lib_dir()), ONEBIT_LIBRARY or the checkout's build tree;
  - a PyTorch linked with the system libgloo.so.0 (Debian's python3-torch): the training script
    run with LD_PRELOAD=/path/to/libonebit-preload.so and the gloo backend.

Then ``onebit.tag(tensor, "name")`` makes every ``dist.all_reduce(tensor)`` of that exact tensor
(float32 or float16, SUM) run onebit's 1-bit compressed, error-compensated allreduce; everything
else is untouched. ``onebit.OnebitAdam`` is the optimizer that drives it, ``onebit.ddp_comm_hook``
its DDP hook. The NCCL front door (libonebit-nccl-preload.so, CUDA tensors) is a third.
"""
import ctypes
import sys

from . import _capi
# installs the "onebit" logger's stderr handler (docs/usage/optimizers.md, "Logging")
from . import _logging  # noqa: F401
from ._errors import OnebitError
# The library and the package's paths (_loader); the private names are used by onebit.run and the tools.
from ._loader import (OnebitNotLoaded, _check_preload_fits_torch, _library, _needed_libraries,  # noqa: F401
                      _torch_bundles_gloo, lib_dir, nccl_net_plugin_path, nccl_preload_path)

__all__ = ["tag", "untag", "stats", "OnebitError", "OnebitNotLoaded", "OnebitAdam", "ZeroOneAdam", "OnebitLamb",
           "ddp_comm_hook", "register_backend", "lib_dir", "nccl_net_plugin_path", "nccl_preload_path"]


def __getattr__(name):  # torch is imported only by those who use the optimizer
    if name == "OnebitAdam":
        from . import onebit_adam
        return onebit_adam.OnebitAdam
    if name == "ddp_comm_hook":
        from . import ddp_hook
        return ddp_hook.ddp_comm_hook
    if name == "ZeroOneAdam":
        from . import zero_one_adam
        return zero_one_adam.ZeroOneAdam
    if name == "OnebitLamb":
        from . import onebit_lamb
        return onebit_lamb.OnebitLamb
    if name == "register_backend":
        from . import backend
        return backend.register_backend
    raise AttributeError(f"module 'onebit' has no attribute {name!r}")


_DTYPES = {"torch.float32": 0, "torch.float16": 1, "torch.bfloat16": 2}
# Tagged tensors, by data pointer: (name, elements, onebit dtype). The C registry is the truth (the
# backend's tagged all_reduce asks it, onebit_tag_find); this mirror serves the Python side's own
# questions (an optimizer's name still tagged, the coalesced note, untagging a freed storage).
_tags: dict = {}


def _tagged_dtype(tensor):
    """The onebit dtype of a tensor tagged exactly as it is, or None."""
    entry = _tags.get(tensor.data_ptr())
    if entry is None or entry[1] != tensor.numel() or entry[2] != _DTYPES.get(str(tensor.dtype)):
        return None
    return entry[2]


def _tag_name(tensor):
    """The name a tensor's address is tagged under, or None."""
    entry = _tags.get(tensor.data_ptr())
    return None if entry is None else entry[0]


def _check(lib, result):
    """Raises OnebitError (its code `result`) with the library's message when a C call failed."""
    if result != 0:
        raise OnebitError(result, lib.onebit_last_error().decode())


def tag(tensor, name):
    """Compress allreduces of exactly this tensor (same storage, same number of elements) under
    `name`. The error-feedback state belongs to the name. Every rank must tag the same names."""
    lib = _library()
    dtype = _DTYPES.get(str(tensor.dtype))
    if dtype is None:
        raise ValueError(f"onebit.tag: {tensor.dtype} is not float32, float16 or bfloat16")
    if not tensor.is_contiguous():
        raise ValueError("onebit.tag: the tensor must be contiguous")
    _check_door_takes(tensor)
    _wait_for_compressed_calls()
    _check(lib, lib.onebit_tag(name.encode(), ctypes.c_void_p(tensor.data_ptr()),
                               ctypes.c_size_t(tensor.numel()), ctypes.c_int(dtype)))
    for ptr, entry in list(_tags.items()):
        if entry[0] == name:  # the name moved to a new buffer (its state kept)
            _tags.pop(ptr, None)  # (a finalizer run by the collector meanwhile may have taken it)
    _tags[tensor.data_ptr()] = (name, tensor.numel(), dtype)
    _untag_when_freed(tensor, name)


def _door():
    """Which of onebit's doors this process has: "gloo" (libonebit-preload.so), "nccl"
    (libonebit-nccl-preload.so) — both preloaded, so seen in the process's own symbols — or
    "library" (libonebit.so, loaded by path: the torch backend, the C API)."""
    lib = _library()
    if not hasattr(ctypes.CDLL(None), "onebit_tag"):
        return "library"
    return "gloo" if hasattr(lib, "_ZN4gloo9allreduceERKNS_16AllreduceOptionsE") else "nccl"


def _check_door_takes(tensor):
    """A tag no door of this process will ever compress is refused, naming the door that would."""
    door, device = _door(), tensor.device.type
    if door == "gloo" and device != "cpu":
        raise ValueError(f"onebit.tag: this process has libonebit-preload.so (the Gloo door), which compresses "
                         f"all_reduce of CPU tensors only; this {device} tensor's all_reduce would go to NCCL "
                         "untouched. For CUDA tensors preload libonebit-nccl-preload.so instead (docs/usage/nccl.md)")
    if door == "nccl" and device != "cuda":
        raise ValueError(f"onebit.tag: this process has libonebit-nccl-preload.so (the NCCL door), which compresses "
                         f"ncclAllReduce of CUDA tensors only; this {device} tensor's all_reduce would go to gloo "
                         "untouched. For CPU tensors: LD_PRELOAD=libonebit-preload.so (Debian's torch) or the onebit "
                         "backend (pip's torch; docs/usage/pytorch.md)")
    if door == "library" and device != "cpu":
        raise ValueError(f"onebit.tag: a {device} tensor is compressed only under LD_PRELOAD=libonebit-nccl-preload.so "
                         "(the NCCL door); this process has libonebit.so, whose torch backend compresses CPU tensors")


def _untag_when_freed(tensor, name):
    """A tagged address lives as long as its tensor's memory: once the storage is freed, the address
    is detached (onebit_tag_detach) before the allocator can hand it to another tensor, which would
    otherwise be compressed as if it were the tagged one. The name keeps its error feedback, so
    tagging it again moves it with its state — whether the collector freed the old memory before
    or after, which may differ between ranks. torch >= 2.0 keeps one Python object per storage,
    alive exactly as long as the memory; older torch has none, so the tagged tensor object stands
    in (a view that outlives it is then no longer compressed — alike on every rank, as the program
    is)."""
    import weakref
    ptr = tensor.data_ptr()
    owner = tensor
    if hasattr(tensor, "untyped_storage"):
        storage = tensor.untyped_storage()
        if storage is tensor.untyped_storage():
            owner = storage
    finalizer = weakref.finalize(owner, _forget_freed, ptr, name)
    finalizer.atexit = False  # at exit nothing can be reused; leave teardown alone


def _forget_freed(ptr, name):
    entry = _tags.get(ptr)
    if entry is None or entry[0] != name:  # untagged already, or the name moved elsewhere
        return
    _tags.pop(ptr, None)
    _library().onebit_tag_detach(ctypes.c_void_p(ptr))  # not tagged any more in C (an optimizer's close): fine


def _wait_for_compressed_calls():
    """Tags change between compressed calls only: an all_reduce issued with async_op=True finds its
    tag by address when it runs, so it must run before a tag changes (onebit.backend)."""
    backend = sys.modules.get(__name__ + ".backend")
    if backend is not None:
        backend.wait_for_compressed_calls()


def untag(tensor):
    """Stop compressing this tensor and free its error-feedback state."""
    lib = _library()
    _wait_for_compressed_calls()
    _check(lib, lib.onebit_untag(ctypes.c_void_p(tensor.data_ptr())))
    _tags.pop(tensor.data_ptr(), None)


def stats():
    """What onebit did in this process, as a dict:

    compressed_calls, bytes_sent, bytes_received, compressed_bytes_sent: the all_reduces onebit took
    and what its transport moved for them (per rank); forwarded_calls, forwarded_bytes: the
    all_reduces passed on to gloo untouched and their buffers' bytes (gloo's ring sends about
    2·(W−1)/W times that); full_precision_*: onebit's own ring, which the front door does not use.
    """
    lib = _library()
    if not hasattr(lib, "onebit_preload_stats"):  # libonebit.so: the onebit backend's counts
        try:
            from .backend import backend_stats
        except ImportError:  # a torch without c10d's Backend class: no onebit backend can exist here
            return dict({name: 0 for name, _ in _capi.Stats._fields_}, forwarded_calls=0, forwarded_bytes=0)
        return backend_stats()
    out = _capi.PreloadStats()
    _check(lib, lib.onebit_preload_stats(ctypes.byref(out)))
    result = {name: getattr(out.onebit, name) for name, _ in _capi.Stats._fields_}
    result["forwarded_calls"] = out.forwarded_calls
    result["forwarded_bytes"] = out.forwarded_bytes
    return result


# Said at import, before init_process_group would crash, when the script imported torch first.
if "torch" in sys.modules:
    _check_preload_fits_torch(ctypes.CDLL(None))
