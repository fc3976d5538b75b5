"""onebit's tags from Python (onebit.tag, untag, stats): which tensors' all_reduce onebit compresses,
mirrored from the C registry for the Python side's own questions, untagged when their memory is
freed. The package's face (onebit/__init__.py) re-exports the public names. Private."""
import ctypes
import sys

from . import _capi
from ._errors import OnebitError
from ._loader import _library

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
    backend = sys.modules.get(__name__.rpartition(".")[0] + ".backend")
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
