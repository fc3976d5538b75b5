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

# installs the "onebit" logger's stderr handler (docs/usage/optimizers.md, "Logging")
from . import _logging  # noqa: F401
from ._errors import OnebitError
# The library and the package's paths (_loader); the private names are used by onebit.run and the tools.
from ._loader import (OnebitNotLoaded, _check_preload_fits_torch, _library, _needed_libraries,  # noqa: F401
                      _torch_bundles_gloo, lib_dir, nccl_net_plugin_path, nccl_preload_path)
# Tagging (_tagging); the private names are the other modules' (`from . import _check, tag`).
from ._tagging import (_check, _door, _tag_name, _tagged_dtype, _tags, _wait_for_compressed_calls,  # noqa: F401
                       stats, tag, untag)

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


# Said at import, before init_process_group would crash, when the script imported torch first.
if "torch" in sys.modules:
    _check_preload_fits_torch(ctypes.CDLL(None))
