"""_FlatOptimizer: what onebit's optimizers (OnebitAdam, ZeroOneAdam, OnebitLamb) share, in four
jobs, one module each: the parameters' checks, the step's frame (GradScaler, CUDA graph capture,
torch.compile, parameters changed under the optimizer) and the tag's life, here; the flat buffers
and the parameters' own storage (_flat_buffers.py); the exchanges with the other ranks
(_rank_exchange.py); checkpoints (_checkpoints.py). The C core's addresses and texts are _core.py's.
Private: the public optimizers are onebit.OnebitAdam, onebit.ZeroOneAdam and onebit.OnebitLamb.
"""
from __future__ import annotations

import ctypes
import gc
import importlib
import struct
import weakref
from typing import Any, Callable, Dict, Iterable, Optional, Union

import torch
import torch.distributed as dist

from . import _library, _check, _tags, _wait_for_compressed_calls, tag
from ._checkpoints import _Checkpoints
from ._flat_buffers import _FlatBuffers, _increment_version
from ._rank_exchange import _RankExchange
from ._core import _core_text, _ptr  # noqa: F401 (the optimizers import these from here)
from ._logging import logger

_UNDECIDED = 2**63 - 1  # OnebitAdam's freeze_step while "auto" has not fired: every step is warmup

# What the optimizers take as `params`, as torch.optim.Optimizer does: tensors, or parameter groups
# (dicts with "params" and any of the optimizer's per-group hyper-parameters).
Params = Union[Iterable[torch.Tensor], Iterable[Dict[str, Any]]]


def _run_eagerly(method):
    """`method` as it is, never traced by torch.compile (torch.compiler.disable; torch._dynamo's on
    torch 2.0): dynamo would trace the step's dist.all_reduce of the tagged buffer as a functional
    collective on a copy of it, which no door sees as tagged, so the compression stage would send
    fp32 and not follow the rule. A compiled training step thus breaks its graph at step()."""
    disable = getattr(getattr(torch, "compiler", None), "disable", None)
    if disable is None and hasattr(torch, "compile"):
        disable = importlib.import_module("torch._dynamo").disable
    return disable(method) if disable is not None else method


class _FlatOptimizer(_Checkpoints, _FlatBuffers, _RankExchange, torch.optim.Optimizer):
    """What onebit's optimizers share: one flat fp32 buffer of every parameter (each group a
    contiguous range of it, in param_groups order) and one of their gradients, filled at every step
    from the parameters as they are then and written back after it (the parameters own their
    storage: frameworks that move or swap it, and safetensors, see ordinary tensors) — or, for an
    elementwise rule on the CPU (OnebitAdam), each parameter updated where it lies; the gradient
    average of the full-precision steps; the tagged buffer's error-feedback state in state_dict();
    and the DDP hook's question: does the next step want averaged gradients?"""

    def _flatten(self, who, process_group):
        self._who = who
        self._lib = _library()
        self._group = process_group
        self._world = dist.get_world_size(process_group)
        self._rank = dist.get_rank(process_group)
        self._gradients_averaged_by_hook = False  # set by ddp_comm_hook
        self._checked_for_ddp = False  # _warn_if_averaged_twice ran
        self.dormant_elements = None  # at the freeze: how many elements are dormant (onebit.h)
        devices = {p.device for group in self.param_groups for p in group["params"]}
        if len(devices) != 1 or next(iter(devices)).type not in ("cpu", "cuda"):
            raise ValueError(f"{who}: parameters must all be on the CPU or all on one CUDA device, not "
                             f"{sorted(map(str, devices))}")
        self._device = next(iter(devices))
        if self._device.type == "cuda" and not (hasattr(self._lib, "onebit_device_steps")
                                                and self._lib.onebit_device_steps() == 1):
            raise ValueError(f"{who}: CUDA parameters step with the C core's device steps, which only "
                             "libonebit-nccl-preload.so has (the NCCL door, which also compresses the tagged "
                             "all_reduce); this process has a library built without them: run with "
                             "LD_PRELOAD=$(python -c 'import onebit; print(onebit.nccl_preload_path())') "
                             "(docs/usage/nccl.md, \"NCCL\")")
        # _warn_if_not_compressed ran (on CPU only: the NCCL door counts in its own library)
        self._checked_compression = self._device.type == "cuda"
        self._measure_workspace = None  # on CUDA: the measurements' partial sums (_measure)
        self._ranges, self._slices = [], []  # per group; per parameter
        offset = 0
        for g, group in enumerate(self.param_groups):
            start = offset
            for i, p in enumerate(group["params"]):
                sharded = _sharded_by(p)
                if sharded is not None:
                    raise ValueError(f"{who}: parameter {i} of group {g} (shape {tuple(p.shape)}) is {sharded}: each "
                                     "rank holds another part of the model, and onebit's optimizers average every "
                                     "rank's whole gradient and momentum, which would mix the parts. Wrap the model in "
                                     "DistributedDataParallel (with onebit.ddp_comm_hook) instead "
                                     "(docs/usage/optimizers.md, \"What the optimizers check\")")
                if p.dtype != torch.float32:
                    raise ValueError(f"{who}: parameters must be float32, not {p.dtype} (parameter {i} of group {g}, "
                                     f"shape {tuple(p.shape)}); under torch.autocast keep them float32")
                if not p.requires_grad:
                    raise ValueError(f"{who}: parameter {i} of group {g} (shape {tuple(p.shape)}) does not require "
                                     "grad: pass only trainable parameters, e.g. [p for p in model.parameters() if "
                                     "p.requires_grad] (torch.optim.Adam skips them; in onebit's one flat buffer "
                                     "they would take a zero gradient and still move)")
                self._slices.append((offset, offset + p.numel()))
                offset += p.numel()
            self._ranges.append((start, offset))
        self._total = offset
        self._made_with = [len(group["params"]) for group in self.param_groups]  # _refuse_changed_parameters
        self._note_held_parameters()
        self._said_others = False  # ddp_comm_hook said that the DDP model holds parameters of others
        self._flat = self._zeros()
        self._grad = self._zeros()
        for p, (lo, hi) in zip(self._params(), self._slices):
            self._flat[lo:hi].copy_(p.data.reshape(-1))
        self._warned_no_gradient = False
        # consolidate_state_dict() since the last step: (what every rank holds alike, every rank's
        # part of the rest) on the rank it gathered to, SENT on the others, else None. A step drops
        # it: the parts are of the step before.
        self._consolidated = None
        self._warned_rank_state = False  # _warn_rank_state_only said it
        self._settings_keys = None  # _share_step_settings's last keys, and their C array
        self._compressed = False  # a compressed all_reduce has run: the ranks' error feedback differs

    def _stream(self):
        """The stream the device steps run on: torch's current one on this optimizer's device, the
        stream the tensors' other work (and ProcessGroupNCCL's wait before a collective) is ordered on."""
        return ctypes.c_void_p(torch.cuda.current_stream(self._device).cuda_stream)

    def _core_step(self, name, *args):
        """The C core's step `name` over this optimizer's arrays: on the CPU, or on CUDA its
        `name`_device twin (the same rule, the same bits) on the current stream."""
        if self._device.type == "cuda":
            with torch.cuda.device(self._device):  # the kernels run on the current device: the arrays'
                _check(self._lib, getattr(self._lib, name + "_device")(*args, self._stream()))
        else:
            _check(self._lib, getattr(self._lib, name)(*args))

    def _measure(self, name, *args):
        """The C core's measurement `name` (onebit_dormant_count, onebit_adam_variance_change) over
        this optimizer's arrays, its answer's pointer last: on the CPU, or on CUDA its `name`_device
        twin, which sums in the same order (the same answer, bit for bit) into a workspace kept for
        it and reads the answer back (a synchronization of the current stream)."""
        if self._device.type != "cuda":
            _check(self._lib, getattr(self._lib, name)(*args))
            return
        if self._measure_workspace is None:
            size = self._lib.onebit_measure_workspace_size(ctypes.c_size_t(self._total))
            self._measure_workspace = torch.empty(size, dtype=torch.uint8, device=self._device)
        workspace = self._measure_workspace
        with torch.cuda.device(self._device):
            _check(self._lib, getattr(self._lib, name + "_device")(
                *args[:-1], _ptr(workspace), ctypes.c_size_t(workspace.numel()), args[-1],
                self._stream()))

    def _own_tag(self, buffer, name):
        """Tags `buffer` for as long as this optimizer lives: close() or the optimizer's collection
        untags it (before the buffer's memory is freed: a weakref callback runs before the
        instance's attributes are released), so that no later tensor at that address is taken as
        tagged and no later optimizer under `name` inherits this one's error feedback.

        A name still tagged by a live buffer is refused. gc.collect() first lets an optimizer
        dropped in a reference cycle go on every rank alike: otherwise a rank whose collector had
        run would start the name afresh and one whose had not would move it, keeping its call
        sequence, and the ranks' first compressed calls would not match."""
        gc.collect()
        holder = next((entry for entry in _tags.values() if entry[0] == name), None)
        if holder is not None:
            raise ValueError(f"{self._who}: the name {name!r} is tagged by another live buffer ({holder[1]} elements; "
                             "another optimizer not closed?): close() it first, or pass name=...")
        tag(buffer, name)
        self._tag_release = weakref.finalize(self, _untag_address, buffer.data_ptr())

    def _drop_tag(self):
        self._tag_release()  # once; later calls do nothing

    def _core_text(self, name, *args):
        return _core_text(self._lib, name, *args)

    def _report_freeze(self, step, variance):
        """Rank 0's one line when the variance freezes: how many elements are dormant (sqrt(v) <= eps,
        onebit.h "Dormant elements": they take no momentum step from now on), in which groups."""
        counts = []
        for group, (lo, hi) in zip(self.param_groups, self._ranges):
            count = ctypes.c_size_t()
            self._measure("onebit_dormant_count", _ptr(variance[lo:]), ctypes.c_size_t(hi - lo),
                          ctypes.c_float(self._config(group).eps), ctypes.byref(count))
            counts.append(count.value)
        self.dormant_elements = sum(counts)
        if self._rank != 0:
            return
        groups = len(counts)
        logger.info(self._core_text("onebit_freeze_report", self._who.encode(), ctypes.c_int64(step),
                                    (ctypes.c_size_t * groups)(*counts),
                                    (ctypes.c_size_t * groups)(*(hi - lo for lo, hi in self._ranges)),
                                    ctypes.c_size_t(groups)))

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        if hasattr(self, "_flat"):
            raise RuntimeError(f"{type(self).__name__}: parameter groups are fixed at construction (one flat buffer)")
        super().add_param_group(param_group)

    def _params(self):
        return [p for g in self.param_groups for p in g["params"]]

    @_run_eagerly
    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        """One step of the optimizer's rule (its class docstring says what each stage does). A
        collective whenever the step communicates: every rank calls it. `closure` (optional)
        re-evaluates the model and returns the loss, as for torch.optim; the loss is returned.

        On the way: the parameters' values and this rank's gradients into the flat buffers (on the
        CPU OnebitAdam reads and writes each parameter where it lies instead), the rule over them
        (_flat_step), the parameters written back."""
        self._refuse_graph_capture()
        self._refuse_changed_parameters()
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._skipped_for_loss_scaling():
            return loss
        self._consolidated = None
        self._in_place = self._steps_in_place and self._in_place_parameters()
        if not self._in_place:
            self._read_parameters()
            self._gather_gradients()
        self._flat_step()
        self._unscaled_gradients = None  # the step is taken: the next one's gradients are new
        if self._in_place:
            for p in self._params():
                _increment_version(p)  # as the copy back would have: autograd sees the parameter changed
        else:
            self._write_parameters()
        return loss

    # torch.amp.GradScaler (torch >= 2.0) calls step() itself on every step, with grad_scale and
    # found_inf set on the optimizer, instead of skipping it on a rank whose gradients overflowed
    # (_skipped_for_loss_scaling). Older GradScalers would pass a grad_scaler argument instead: not
    # taken, they skip per rank as before (docs/usage/optimizers.md, "A step fails on NaN or Inf").
    _step_supports_amp_scaling = int(torch.__version__.split(".")[0]) >= 2
    _scales_may_differ = False  # a step was skipped for an overflow on some ranks only
    _unscaled_gradients = None  # the gradients a step that then failed unscaled, and their versions

    def _skipped_for_loss_scaling(self):
        """Under torch.amp.GradScaler: whether this step is skipped, on every rank alike; if not,
        the gradients are unscaled here, as GradScaler.unscale_ would (by the fp32 reciprocal of
        the scale; grad_scale None: scaler.unscale_ has done it).

        GradScaler alone decides per rank, from that rank's gradients. In the compression stage
        they are the rank's own, not averaged: a rank that overflowed would skip step() while the
        others wait for it in the compressed all_reduce until the timeout. So the ranks agree in one
        small all_reduce: a step any rank found non-finite is skipped by all. The scalers then back
        off on the ranks that overflowed only, and their scales differ, which is harmless while
        each rank's gradients are its own (each unscales by its own scale) but not on a step whose
        gradients DDP averaged while scaled: such a step is refused (_refuse_differing_scales)."""
        found_inf = getattr(self, "found_inf", None)
        if found_inf is None:
            return False
        scale = getattr(self, "grad_scale", None)
        rows = self._every_rank([int(float(found_inf) > 0), _float_bits(scale)])
        overflowed = [r[0] for r in rows]
        if any(overflowed):
            self._scales_may_differ = self._scales_may_differ or not all(overflowed)
            return True
        if self._world > 1 and self._gradients_averaged_by_hook and self._wants_averaged_gradients:
            self._refuse_differing_scales(scale, [r[1] for r in rows])
        if scale is not None and not self._unscaled_already():
            inverse = scale.double().reciprocal().float().to(self._device)
            for p in self._params():
                if p.grad is not None:
                    p.grad.mul_(inverse)
            # Kept until the step is taken: a step that fails after this, retried by GradScaler on
            # the same gradients (it sets grad_scale again), must not unscale them twice.
            self._unscaled_gradients = [None if p.grad is None else (weakref.ref(p.grad), p.grad._version)
                                        for p in self._params()]
        return False

    def _unscaled_already(self):
        """Whether every parameter's gradient is the very tensor, at the same version, that this
        optimizer unscaled in a step that then failed: a gradient replaced or changed in place (a
        backward pass, zero_grad) no longer is. Weak references: a gradient dropped since is not
        kept alive, and a dead reference is not the same tensor."""
        kept = self._unscaled_gradients
        params = list(self._params())
        return kept is not None and len(kept) == len(params) and all(
            (p.grad is None) if k is None else (p.grad is k[0]() and p.grad._version == k[1])
            for p, k in zip(params, kept))

    def _refuse_differing_scales(self, scale, scale_bits):
        """On a step whose gradients DDP averaged while scaled (ZeroOneAdam's variance steps, which
        come back after steps of local gradients): refused if the ranks' scales differ, or may
        (scaler.unscale_ has hidden them, and some ranks alone overflowed since they last agreed),
        since no rank can unscale such an average. GradScaler's attributes are dropped first, as
        its step() would have after ours."""
        if scale is not None and len(set(scale_bits)) == 1:
            self._scales_may_differ = False  # compared: the same again
            return
        if scale is None and not self._scales_may_differ:
            return
        said = (", ".join(f"rank {r}: {_bits_float(b):g}" for r, b in enumerate(scale_bits)) if scale is not None else
                "unscaled already by scaler.unscale_; some ranks alone overflowed since their scales last agreed")
        for name in ("grad_scale", "found_inf"):
            self.__dict__.pop(name, None)
        raise RuntimeError(f"{self._who}: the ranks' GradScaler scales differ ({said}) on a step whose gradients DDP "
                           "averaged while scaled, so no rank can unscale the average: the scalers diverged after "
                           "gradients overflowed on some ranks only in a step of local gradients (0/1 Adam's "
                           "compressed steps before var_freeze_step). Use bf16 autocast, without GradScaler, for this "
                           "optimizer under onebit.ddp_comm_hook (docs/usage/optimizers.md, \"A step fails on NaN "
                           "or Inf\")")

    def _refuse_graph_capture(self, call="step()"):
        """A step (or ZeroOneAdam's synchronize()) inside CUDA graph capture is refused, before it
        touches anything, as torch.optim refuses a step of an optimizer that is not capturable. The
        step count, the stage, the freeze decision and the learning rates live on the host and go
        into a step's kernels as arguments: a captured step would bake them in, and every replay
        would repeat this one step (never freezing, the schedule stopped) while looking like
        training. (The step is never traced by torch.compile: _run_eagerly.)"""
        if not _capturing(self._device):
            return
        raise RuntimeError(f"{type(self).__name__}.{call} was called during CUDA graph capture: its step count, stage "
                           "and learning rates live on the host, so every replay would repeat this one step. Capture "
                           f"the forward and backward passes only and call {call} outside the graph "
                           "(docs/usage/optimizers.md, \"What the optimizers check\"); nothing was changed")

    def _refuse_changed_parameters(self, call="step()"):
        """A step is refused, before it touches anything, if the parameters are no longer those the
        optimizer was made with: a group or a parameter added to or removed from param_groups
        (add_param_group itself is refused), or a parameter that no longer requires grad. The flat
        buffers' layout is fixed at construction: an added parameter would never train, a removed
        one would shift its successors onto its moments, and a frozen one would not hold still —
        its gradient taken as zero, it still takes the momentum's steps, and in the compression
        stage the compressed momentum gives each of its elements about ±scale every step, so it
        keeps moving as fast as the parameters that train. (A parameter replaced by another of its
        size, as frameworks do when they move a model, takes its place: _read_parameters; and the set
        of parameters the optimizer holds, which ddp_comm_hook reads, is taken anew here.)"""
        counts = [len(group["params"]) for group in self.param_groups]
        if counts != self._made_with:
            raise RuntimeError(f"{self._who}.{call}: param_groups changed since the optimizer was made (parameters "
                               f"per group: {counts}, made with {self._made_with}): the parameters are fixed at "
                               "construction (one flat buffer), so an added one would never train and a removed one "
                               "would shift the others' moments. Make a new optimizer of the parameters that train "
                               "now; nothing was changed")
        self._note_held_parameters()
        for g, group in enumerate(self.param_groups):
            for i, p in enumerate(group["params"]):
                if not p.requires_grad:
                    raise RuntimeError(
                        f"{self._who}.{call}: parameter {i} of group {g} (shape {tuple(p.shape)}) no longer requires "
                        "grad. A parameter frozen after the optimizer was made would not hold still: its gradient "
                        "taken as zero, it still takes the momentum's steps, and in the compression stage 1-bit "
                        "compression gives each of its elements about +-scale every step. To freeze or unfreeze "
                        "parameters, make a new optimizer of those that train now (docs/usage/optimizers.md, "
                        "\"What the optimizers check\"); nothing was changed")

    def _note_held_parameters(self):
        """Which parameters this optimizer holds now (replaced ones included), for ddp_comm_hook,
        which averages the others (and calls this again, at most once between two steps, before it
        takes one for another's)."""
        self._owned = {id(p) for p in self._params()}
        self._held_looked_up = False

    # An optimizer whose rule is elementwise (OnebitAdam) sets this: on the CPU it then updates each
    # parameter where it lies and reads each gradient where it lies (_in_place_parameters,
    # _pieces, _local_gradient), with the same arithmetic as over the flat copies — the rule is
    # elementwise, so the values are bit for bit those of the copy, step and copy back — and none of
    # the three passes over every parameter that the copies cost.
    _steps_in_place = False
    _in_place = False

    @property
    def _wants_averaged_gradients(self):
        raise NotImplementedError

    @property
    def _averaging_settled(self):
        """Whether _wants_averaged_gradients can no longer change: from then on the DDP hook gives
        the same answer at every step, and a backward pass through it may be captured in a graph."""
        raise NotImplementedError


def _float_bits(value):
    """A float32's bits as an int (0 for None): to compare scales exactly in an integer all_reduce."""
    return 0 if value is None else struct.unpack("<i", struct.pack("<f", float(value)))[0]


def _bits_float(bits):
    return struct.unpack("<f", struct.pack("<i", bits))[0]


def _sharded_by(p):
    """What shards `p` across ranks, or None: a DTensor (FSDP2's fully_shard, tensor parallelism),
    or FSDP1's flat parameter and the views of it that use_orig_params exposes, which FSDP marks
    _fsdp_flattened. Such a parameter is another part of the model on each rank."""
    if any(cls.__name__ == "DTensor" for cls in type(p).__mro__):
        return "a DTensor (FSDP2's fully_shard or tensor parallelism)"
    if getattr(p, "_fsdp_flattened", False):
        return "flattened by FullyShardedDataParallel (and sharded, unless NO_SHARD)"
    return None


def _capturing(device):
    """Whether the current stream of `device` (the parameters'; for CPU parameters the current
    device's) is capturing a CUDA graph. Never while torch.compile traces. Creates no CUDA context:
    without one, torch answers False."""
    if _is_compiling() or not torch.cuda.is_available():
        return False
    if device.type != "cuda":
        return torch.cuda.is_current_stream_capturing()
    with torch.cuda.device(device):
        return torch.cuda.is_current_stream_capturing()


def _is_compiling():
    """Whether torch.compile is tracing this call: torch.compiler.is_compiling (torch >= 2.3), else
    torch._utils.is_compiling (2.1, 2.2), else never (older torch)."""
    for owner, name in ((getattr(torch, "compiler", None), "is_compiling"), (torch._utils, "is_compiling")):
        is_compiling = getattr(owner, name, None)
        if is_compiling is not None:
            return bool(is_compiling())
    return False


def _untag_address(address):
    """Untags whatever is tagged at `address` (an optimizer's buffer, at its close or collection)."""
    lib = _library()
    _wait_for_compressed_calls()
    lib.onebit_untag(ctypes.c_void_p(address))  # an address no longer tagged is not an error worth raising here
    _tags.pop(address, None)

