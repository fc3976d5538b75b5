"""onebit's optimizers inside the trainers people use: one line each (docs/usage/trainers.md, "Trainers").

    onebit.integrations.init_process_group()          # before the Trainer / Accelerator / Lightning
    Trainer(..., callbacks=[onebit.integrations.OnebitTrainerCallback()])       # HF Trainer
    onebit.integrations.prepare_accelerator(accelerator)    # Accelerate, after accelerator.prepare(...)
    pl.Trainer(..., callbacks=[onebit.integrations.OnebitLightningCallback()])  # Lightning, DDPStrategy

What each does, at the point its framework allows it:
  - the DDP communication hook (onebit.ddp_comm_hook) registered on the DistributedDataParallel
    that wraps the model — seen through torch.compile's OptimizedModule — which none of the three
    registers on CPU ranks themselves: without it DDP averages fp32 gradients in every step of the
    compression stage;
  - before every checkpoint, on every rank: ZeroOneAdam.synchronize() (the replicas are equal in
    what is saved) and consolidate_state_dict(), so that the optimizer state rank 0 saves alone
    resumes every rank;
  - before evaluation and at the end of training: ZeroOneAdam.synchronize().

Nothing here imports a framework until its class is asked for; transformers, accelerate and
lightning are not onebit's dependencies.
"""
from __future__ import annotations

import gc
from typing import Any, List, Optional

import torch
import torch.distributed as dist

from ._flat_optimizer import _FlatOptimizer
from ._logging import logger
from .ddp_hook import ddp_comm_hook

# The two callbacks are made on first use (__getattr__ below), when their framework is imported.
__all__ = ["init_process_group", "onebit_optimizers", "register_comm_hook", "before_checkpoint", "synchronize",  # noqa: F822
           "prepare_accelerator", "OnebitTrainerCallback", "OnebitLightningCallback"]


def init_process_group(**kwargs: Any) -> str:
    """The default process group made with the backend through which this process's onebit door
    compresses — "onebit" (the backend, registered here; pip's torch), "gloo" under
    libonebit-preload.so, "nccl" under libonebit-nccl-preload.so — from torchrun's environment
    unless `kwargs` say otherwise (backend= included). A group that exists already is kept. Call it
    before the framework makes its own: HF's TrainingArguments(ddp_backend=...) and Accelerate's
    InitProcessGroupKwargs refuse "onebit" on CPU, and the plain gloo group they would make
    compresses nothing without the preload. Returns the default group's backend."""
    from . import _door
    if not dist.is_initialized():
        backend = kwargs.pop("backend", None) or {"gloo": "gloo", "nccl": "nccl"}.get(_door(), "onebit")
        if backend == "onebit":
            from .backend import register_backend
            register_backend()
        dist.init_process_group(backend, **kwargs)
    return dist.get_backend()


def onebit_optimizers(*optimizers: Any) -> List[_FlatOptimizer]:
    """The onebit optimizers among `optimizers` (lists of them too), through the wrappers frameworks
    put around them: Accelerate's AcceleratedOptimizer (.optimizer), Lightning's LightningOptimizer
    (._optimizer)."""
    found = []
    for optimizer in optimizers:
        if isinstance(optimizer, (list, tuple)):
            found += onebit_optimizers(*optimizer)
            continue
        # `optimizer`: Accelerate's AcceleratedOptimizer and Lightning's LightningOptimizer (public in
        # accelerate 1.16.0 and lightning 2.6.6, the versions trainers_check.py runs); `_optimizer`,
        # the private attribute behind Lightning's property, is the fallback for a wrapper without it.
        for _ in range(8):  # wrappers of wrappers, never a cycle
            if isinstance(optimizer, _FlatOptimizer) or optimizer is None:
                break
            optimizer = getattr(optimizer, "optimizer", None) or getattr(optimizer, "_optimizer", None)
        if isinstance(optimizer, _FlatOptimizer) and all(optimizer is not f for f in found):
            found.append(optimizer)
    return found


def _unwrap_compiled(module):
    # torch.compile's OptimizedModule keeps the module it compiled in `_orig_mod`, a private
    # attribute with no public accessor; the DDP to hook is found through it (torch.compile(ddp), or
    # a DDP of torch.compile(model)). Checked on torch 2.15.0 (PyPI); Debian's torch 1.13.0a0 has no
    # torch.compile, and the default returns `module`.
    return getattr(module, "_orig_mod", module)


def _ddp_wrapping(model):
    """The DistributedDataParallel that is `model` or wraps it (either seen through torch.compile),
    else None. HF Trainer's callbacks see only the unwrapped model: its DDP is found among the live
    objects, once, at the start of training."""
    DDP = torch.nn.parallel.DistributedDataParallel
    inner = _unwrap_compiled(model)
    if isinstance(inner, DDP):
        return inner
    for candidate in gc.get_objects():
        if isinstance(candidate, DDP) and _unwrap_compiled(candidate.module) in (model, inner):
            return candidate
    return None


def register_comm_hook(model: torch.nn.Module, optimizer: Any) -> Optional[torch.nn.parallel.DistributedDataParallel]:
    """onebit.ddp_comm_hook registered, with `optimizer` (a onebit optimizer, or a framework's wrapper
    of one), on the DistributedDataParallel that is or wraps `model`. Returns that DDP, or None where
    the model is not wrapped (the optimizer then averages the gradients itself). Registering twice
    for the same optimizer does nothing; a second optimizer on one DDP is a ValueError (DDP has one
    hook)."""
    found = onebit_optimizers(optimizer)
    if not found:
        raise TypeError(f"onebit.integrations.register_comm_hook: {type(optimizer).__name__} is not a onebit "
                        "optimizer (OnebitAdam, ZeroOneAdam, OnebitLamb) nor a wrapper of one")
    ddp = _ddp_wrapping(model)
    if ddp is None:
        return None
    hooked = getattr(ddp, "_onebit_optimizer", None)
    if hooked is found[0]:
        return ddp
    if hooked is not None:
        raise ValueError("onebit.integrations.register_comm_hook: this DistributedDataParallel already has the hook "
                         f"of another onebit optimizer ({type(hooked).__name__}); DDP takes one hook")
    ddp.register_comm_hook(found[0], ddp_comm_hook)
    ddp._onebit_optimizer = found[0]
    return ddp


def _optimizer_for(model, optimizers):
    """Of `optimizers`, the one that holds `model`'s parameters (each model its own hook), else None."""
    ids = {id(p) for p in _unwrap_compiled(model).parameters()}
    return next((o for o in optimizers if any(id(p) in ids for p in o._params())), None)


def synchronize(*optimizers: Any) -> bool:
    """Every ZeroOneAdam among `optimizers` synchronized (equal replicas; a collective when its
    replicas differ). Returns whether any parameter changed."""
    from .zero_one_adam import ZeroOneAdam
    changed = False
    for optimizer in onebit_optimizers(*optimizers):
        if isinstance(optimizer, ZeroOneAdam):
            changed = optimizer.synchronize() or changed
    return changed


def before_checkpoint(*optimizers: Any) -> bool:
    """On every rank, before a checkpoint that one rank saves: synchronize() and each optimizer's
    consolidate_state_dict(). Returns whether any parameter changed (the model's state must then be
    taken afresh)."""
    changed = synchronize(*optimizers)
    for optimizer in onebit_optimizers(*optimizers):
        optimizer.consolidate_state_dict()
    return changed


def prepare_accelerator(accelerator: Any) -> List[_FlatOptimizer]:
    """Accelerate, after accelerator.prepare(model, optimizer, ...): the DDP hook on each prepared model
    with the prepared onebit optimizer, and a save_state pre-hook that runs before_checkpoint (and
    takes the model's weights afresh when a ZeroOneAdam synchronized). Evaluate after
    onebit.integrations.synchronize(optimizer) with ZeroOneAdam. Returns the onebit optimizers."""
    # Accelerate has no public list of what prepare() returned: `_optimizers` and `_models` are its
    # private attributes (checked on accelerate 1.16.0, trainers_check.py's).
    optimizers = onebit_optimizers(list(accelerator._optimizers))
    if not optimizers:
        raise TypeError("onebit.integrations.prepare_accelerator: no onebit optimizer among the accelerator's prepared "
                        "optimizers: call it after accelerator.prepare(model, optimizer, ...)")
    for model in accelerator._models:
        optimizer = _optimizer_for(model, optimizers)
        if optimizer is not None:
            register_comm_hook(model, optimizer)

    def consolidate(models, weights, output_dir):
        if before_checkpoint(optimizers):
            for i, model in enumerate(models[:len(weights)]):
                weights[i] = accelerator.get_state_dict(model, unwrap=False)

    accelerator.register_save_state_pre_hook(consolidate)
    return optimizers


def _warn_not_onebit(where, optimizer):
    if not dist.is_initialized() or dist.get_rank() == 0:
        logger.warning(f"{where}: the trainer's optimizer is {type(optimizer).__name__}, not a onebit optimizer "
                       "(OnebitAdam, ZeroOneAdam, OnebitLamb): this callback does nothing")


def _trainer_callback_class():
    from transformers import TrainerCallback

    class OnebitTrainerCallback(TrainerCallback):
        """HF Trainer: Trainer(..., callbacks=[OnebitTrainerCallback()]) — with the optimizer passed as
        optimizers=(OnebitAdam(...), None) or optimizer_cls_and_kwargs. At the start of training the
        DDP hook; before each checkpoint (the steps where the Trainer will save, known after its
        flow callback ran) before_checkpoint(); before each evaluation and at the end, synchronize()."""

        def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
            self._optimizers = onebit_optimizers(optimizer)
            if not self._optimizers:
                _warn_not_onebit("OnebitTrainerCallback", optimizer)
                return
            register_comm_hook(model, _optimizer_for(model, self._optimizers) or self._optimizers[0])

        def _before_save_or_evaluate(self, args, control):
            if not getattr(self, "_optimizers", None):
                return
            best = str(getattr(args, "save_strategy", "")).lower().endswith("best")
            if control.should_save or (best and control.should_evaluate):
                before_checkpoint(self._optimizers)
            elif control.should_evaluate:
                synchronize(self._optimizers)

        def on_step_end(self, args, state, control, **kwargs):
            self._before_save_or_evaluate(args, control)

        def on_epoch_end(self, args, state, control, **kwargs):
            self._before_save_or_evaluate(args, control)

        def on_train_end(self, args, state, control, **kwargs):
            if getattr(self, "_optimizers", None):
                synchronize(self._optimizers)

    return OnebitTrainerCallback


def _lightning_callback_class():
    try:
        from lightning.pytorch import Callback
    except ImportError:
        from pytorch_lightning import Callback

    class OnebitLightningCallback(Callback):
        """Lightning (DDPStrategy): pl.Trainer(..., callbacks=[OnebitLightningCallback()]). At fit start
        the DDP hook (Lightning registers ddp_comm_hook on CUDA only); Lightning itself calls
        consolidate_state_dict() on every rank before saving; this callback synchronizes a
        ZeroOneAdam before each checkpoint (taking the model's state afresh), before validation
        and at the end of training."""

        def on_fit_start(self, trainer, pl_module):
            self._optimizers = onebit_optimizers(list(trainer.optimizers))
            if not self._optimizers:
                _warn_not_onebit("OnebitLightningCallback", trainer.optimizers)
                return
            model = trainer.strategy.model
            register_comm_hook(model, _optimizer_for(model, self._optimizers) or self._optimizers[0])

        def on_validation_start(self, trainer, pl_module):
            if getattr(self, "_optimizers", None) and trainer.state.fn == "fit":
                synchronize(self._optimizers)

        def on_save_checkpoint(self, trainer, pl_module, checkpoint):
            if not getattr(self, "_optimizers", None) or not synchronize(self._optimizers):
                return
            checkpoint["state_dict"] = trainer.strategy.lightning_module_state_dict()
            states = checkpoint.get("optimizer_states")
            for i, optimizer in enumerate(trainer.optimizers):
                if states is not None and onebit_optimizers(optimizer):
                    states[i] = trainer.strategy.optimizer_state(optimizer)

        def on_train_end(self, trainer, pl_module):
            if getattr(self, "_optimizers", None):
                synchronize(self._optimizers)

    return OnebitLightningCallback


_FRAMEWORK_CLASSES = {"OnebitTrainerCallback": _trainer_callback_class,
                      "OnebitLightningCallback": _lightning_callback_class}


def __getattr__(name):  # a framework's class is made (and the framework imported) when first asked for
    if name in _FRAMEWORK_CLASSES:
        cls = _FRAMEWORK_CLASSES[name]()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module 'onebit.integrations' has no attribute {name!r}")
