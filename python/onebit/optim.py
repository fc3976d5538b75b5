"""Deprecated alias, kept so that code written against onebit 0.2 (``from onebit.optim import
OnebitAdam``) keeps working: this module once held OnebitAdam, the optimizers' shared base and the
DDP hook. Import them from ``onebit`` (``onebit.OnebitAdam``, ``onebit.ddp_comm_hook``); the code
lives in onebit_adam.py, _flat_optimizer.py and ddp_hook.py. The warning is a DeprecationWarning,
which Python shows only where warnings are enabled (-W default, pytest), never in a training log.
"""
import warnings

from ._flat_optimizer import _UNDECIDED, _FlatOptimizer, _ptr  # noqa: F401 (names 0.2's importers used)
from .ddp_hook import ddp_comm_hook
from .onebit_adam import OnebitAdam

__all__ = ["OnebitAdam", "ddp_comm_hook"]

warnings.warn("onebit.optim is deprecated: import OnebitAdam and ddp_comm_hook from onebit", DeprecationWarning,
              stacklevel=2)
