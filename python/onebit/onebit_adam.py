"""OnebitAdam: 1-bit Adam (Tang et al., 2021) as a torch.optim.Optimizer over onebit.

Warmup (steps < freeze_step): Adam on gradients averaged over ranks in full precision. Then the
variance is frozen, the momentum is updated from the *local* gradient, allreduced compressed (one
flattened, tagged buffer for every parameter group: one dist.all_reduce per step, taken by
libonebit-preload.so) and used with the frozen variance. The phase logic and arithmetic are onebit's
C core (onebit_adam_*), which the C++ shim (include/onebit/onebit_adam.hpp) uses too.

With DDP, register the hook so DDP's gradient allreduce does the warmup averaging and is skipped
in the compression stage:

    model = DistributedDataParallel(model)
    optimizer = onebit.OnebitAdam(model.parameters(), ...)
    model.register_comm_hook(optimizer, onebit.ddp_comm_hook)

Without DDP the optimizer averages the gradients itself during warmup.

Parameters on a CUDA device (all on one) work the same way under libonebit-nccl-preload.so: the
flat buffers live on that device, the tagged momentum's all_reduce goes through NCCL and is
compressed there, and the steps are the C core's device steps (onebit_adam_*_step_device: the
same rule, the same bits as on the CPU) on torch's current stream; the automatic freeze's
measurement and the dormant count go through their device twins (the same answers as on the CPU).

freeze_step="auto" ends the warmup when the variance has settled: every `freeze_window` warmup
steps the relative change of v since the last look, sum|v - v_then| / sum|v|, is measured, every
rank's gathered exactly, and the compression stage starts after the first measurement whose
largest is under `freeze_threshold` — or at `max_freeze_step`. The rule, across ranks too, is the
C core's (onebit_adam_auto_freeze_decide_ranks, the C++ shim's as well); rank 0 logs one line
when it fires (INFO, to the "onebit" logger: stderr by default), and `freeze_step` then says the step.

The compression stage follows the frozen-variance rules of onebit.h: an element whose frozen
variance is at most eps**2 ("dormant") takes no momentum step, only weight decay, and every step
m / (sqrt(v) + eps) is clipped to the largest Adam itself can take; rank 0 logs one line at the
freeze naming the dormant elements. The constructor and load_state_dict() check that every rank
has the same schedule; a failed compressed step names the step and the likely causes.
deepspeed_schedule=True runs DeepSpeed's schedule call for call (docs/deepspeed.md).

state_dict() holds step, m, v and this rank's error-feedback state — every rank's, on rank 0, after
consolidate_state_dict() on every rank (what the trainers need: they save from rank 0; see
onebit.integrations). Loaded into a job of the same size, training continues bit for bit
(docs/usage/restarting.md, "Restarting a job"). bias_correction=True gives torch.optim.Adam's corrected
steps (off by default, as in the paper and DeepSpeed).
"""
from __future__ import annotations

import ctypes
import struct
from typing import Any, Dict, List, Literal, Optional, Tuple, Union

import torch.distributed as dist

from . import _capi, _check
from ._flat_optimizer import _UNDECIDED, Params, _FlatOptimizer, _ptr
from ._logging import logger

__all__ = ["OnebitAdam"]


def _bits(value):
    """A float64's bits as an int64: floats compared exactly in _agree's integer table."""
    return struct.unpack("<q", struct.pack("<d", float(value)))[0]


def _bits_double(bits):
    return struct.unpack("<d", struct.pack("<q", bits))[0]


class OnebitAdam(_FlatOptimizer):
    """1-bit Adam (Tang et al., 2021): Adam whose momentum, once the variance has settled, is
    averaged over the ranks 1-bit compressed with error feedback — one compressed all_reduce per
    step for every parameter group. A torch.optim.Optimizer; docs/usage/optimizers.md, "OnebitAdam".

    What step() does in each stage:

    - warmup (steps before ``freeze_step``): Adam on the gradients averaged over the ranks in full
      precision — by onebit.ddp_comm_hook under DDP, else by one all_reduce in step() itself —
      updating the momentum m and the variance v;
    - compression stage (from ``freeze_step`` on): v is frozen; m is updated from this rank's own
      gradient, then averaged over the ranks in one compressed, error-compensated all_reduce of
      one flat tagged buffer (under DDP the hook sends no gradients), and applied with the frozen
      v. Elements whose frozen v is at most eps**2 ("dormant") take only weight decay, and every
      step is clipped to the largest Adam itself can take (docs/usage/optimizers.md, "Steps under a frozen
      variance"). A step that fails (NaN or Inf in some rank's momentum) raises and changes
      nothing.

    Rank 0 logs one line at the freeze (and when ``freeze_step="auto"`` fires) to the "onebit"
    logger. ``compressing`` says the next step's stage, ``freeze_step`` its first step,
    ``dormant_elements`` the count at the freeze. state_dict() carries m, v, the schedule and the
    error feedback (every rank's after consolidate_state_dict()): loaded into a job of the same
    size, training continues bit for bit.

    Args:
        params: the parameters to optimize, or parameter groups (dicts; each may set its own lr,
            betas, eps and weight_decay). float32, all on the CPU or all on one CUDA device, all
            requiring grad; the groups are fixed at construction (one flat buffer).
        lr: the learning rate (default 1e-3). Without bias correction the first steps are larger
            than torch.optim.Adam's (3.2x at step 1): use a learning-rate warmup. Lower it if the loss diverges
            once compression starts: the compressed momentum carries error Adam's does not.
        betas: Adam's (beta1, beta2) for m and v (default (0.9, 0.999)). beta2 also sets how fast
            v settles, and so when ``"auto"`` freezes it.
        eps: Adam's epsilon in m / (sqrt(v) + eps) (default 1e-8); also the dormant bound: an
            element with sqrt(v) <= eps at the freeze is dormant.
        weight_decay: decoupled weight decay, lr * weight_decay * p added to each step, as
            DeepSpeed's 1-bit Adam (default 0.0).
        freeze_step: the first step of the compression stage, an int >= 0, or ``"auto"`` to let
            the variance choose (default 100). DeepSpeed's guidance: 15-25 % of the steps. The
            environment variable ONEBIT_FREEZE_STEP, when set, overrides it (``"auto"`` too).
        process_group: the ranks to average over (default None: the default process group). Its
            backend must be "onebit" (pip's torch), or gloo under libonebit-preload.so, or NCCL
            under libonebit-nccl-preload.so (CUDA parameters), for the momentum to be compressed.
        name: the tag of the momentum buffer, which keys its error feedback (default
            "onebit_adam/momentum"). The same on every rank; give each optimizer that lives at the
            same time its own (a second live one of a name is refused).
        freeze_window: with ``"auto"``, the warmup steps between two measurements of v's relative
            change (default 10). Raise it to freeze later and more surely.
        freeze_threshold: with ``"auto"``, the relative change of v over a window under which the
            compression stage starts (default 0.1). Lower it to freeze later.
        max_freeze_step: with ``"auto"``, the latest first step of the compression stage (default
            None: no bound). Set it to bound the warmup of a long run.
        deepspeed_schedule: run DeepSpeed's schedule call for call (default False): the first
            call only counts, so freeze_step F gives F - 1 full-precision updates, as DeepSpeed's
            does. For runs compared with DeepSpeed's (docs/deepspeed.md); needs a fixed
            freeze_step and no bias correction.
        bias_correction: torch.optim.Adam's bias-corrected steps, m / (1 - beta1^t) and
            v / (1 - beta2^t), with v's correction frozen at the freeze (default False, as in the
            paper and DeepSpeed). On, warmup steps equal torch.optim.Adam's.

    Raises:
        ValueError: parameters of another dtype or on mixed devices, parameters that require no
            grad, a bad freeze_step, a name another live optimizer holds.
        RuntimeError: the ranks disagree on the schedule or the parameters (named, with each
            rank's value).
        OnebitError: the C core refuses a hyper-parameter (e.g. the "auto" knobs out of range).
    """

    _steps_in_place = True  # its rule is elementwise: on the CPU each parameter is updated where it lies

    def __init__(self, params: Params, lr: float = 1e-3, betas: Tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, freeze_step: Union[int, Literal["auto"]] = 100,
                 process_group: Optional[dist.ProcessGroup] = None, name: str = "onebit_adam/momentum",
                 freeze_window: int = 10, freeze_threshold: float = 0.1, max_freeze_step: Optional[int] = None,
                 deepspeed_schedule: bool = False, bias_correction: bool = False) -> None:
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self._flatten("OnebitAdam", process_group)
        if deepspeed_schedule and freeze_step == "auto":
            raise ValueError("OnebitAdam: deepspeed_schedule=True takes a fixed freeze_step (DeepSpeed has no 'auto')")
        if deepspeed_schedule and bias_correction:
            raise ValueError("OnebitAdam: deepspeed_schedule=True runs DeepSpeed's rule, which has no bias correction: "
                             "leave bias_correction=False")
        # bias_correction=True: torch.optim.Adam's m / (1 - beta1^t) and v / (1 - beta2^t) — with the
        # variance frozen, 1 - beta2^freeze_step from then on. Off by default, as in the paper and
        # DeepSpeed's 1-bit Adam (parity with their runs); on, warmup steps equal torch Adam's.
        self._bias_correction = bool(bias_correction)
        # DeepSpeed's schedule (docs/deepspeed.md): the first step() call only counts — no update,
        # its gradient dropped, as DeepSpeed's initialising call — so freeze_step F gives F - 1
        # full-precision updates and compression from the (F+1)-th call, as in DeepSpeed.
        self._deepspeed_schedule = bool(deepspeed_schedule)
        auto = freeze_step == "auto"
        if not auto and (not isinstance(freeze_step, int) or freeze_step < 0):
            raise ValueError(f"OnebitAdam: freeze_step must be a step (an int >= 0) or 'auto', not {freeze_step!r}")
        # ONEBIT_FREEZE_STEP tunes an existing script without editing it (docs/env.md); set, it
        # overrides "auto" too.
        self._freeze_step = self._lib.onebit_adam_freeze_step(ctypes.c_int64(-1 if auto else int(freeze_step)))
        self._auto = None
        if self._freeze_step < 0:
            self._auto = _capi.AdamAutoFreeze(freeze_window, freeze_threshold, max_freeze_step or 0)
            if self._lib.onebit_adam_auto_freeze_measures(ctypes.byref(self._auto), ctypes.c_int64(0)) < 0:
                _check(self._lib, 1)
            self._freeze_step = _UNDECIDED
        if self._deepspeed_schedule:
            # DeepSpeed's freeze check skips its initialising call: F <= 2 all compress from call 3.
            self._freeze_step = max(self._freeze_step, 2)
        # "auto": (step, change) of every measurement, the largest over ranks
        self.variance_changes: List[Tuple[int, float]] = []
        self._m = self._zeros()
        self._v = self._zeros()
        self._m_before = self._zeros()  # the momentum before a compressed step, to undo a failed one
        self._v_then = self._zeros() if self._auto is not None else None  # "auto": v at the last measurement
        self._name = name
        self._step = 0
        self._agree_on_schedule()  # before tagging: a refused optimizer leaves no tag behind
        self._own_tag(self._m, name)

    def _agree_on_schedule(self, step=None, freeze_step=None):
        """The ranks agree on what decides when collectives happen (step, freeze_step — or "auto"'s
        window, threshold and limit — and deepspeed_schedule) and on the parameters."""
        auto = self._auto or _capi.AdamAutoFreeze(0, 0.0, 0)
        self._agree(parameters=self._total, groups=len(self.param_groups),
                    step=self._step if step is None else step,
                    freeze_step=self._freeze_step if freeze_step is None else freeze_step,
                    freeze_window=auto.window, freeze_threshold_bits=_bits(auto.threshold),
                    max_freeze_step=auto.max_step, deepspeed_schedule=self._deepspeed_schedule,
                    bias_correction=self._bias_correction)

    def _config(self, group):
        """The C core's config for the next step. With bias correction, Adam's corrected rule
        lr m̂ / (sqrt(v̂) + eps) + lr wd p written in the core's uncorrected one: lr sqrt(c2)/c1,
        eps sqrt(c2) and wd c1/sqrt(c2), where c1 = 1 - beta1^t and c2 = 1 - beta2^t (t the updates
        so far, this one included; in the compression stage c2 stays at the freeze's). The dormant
        test sqrt(v) <= eps is then sqrt(v̂) <= eps, and the clip bounds the corrected direction
        in proportion."""
        lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
        if self._bias_correction:
            beta1, beta2 = group["betas"]
            updates = self._step + 1
            c1 = 1.0 - beta1 ** updates
            c2 = 1.0 - beta2 ** min(updates, max(self._freeze_step, 1))  # freeze_step 0: v is 0, all dormant
            lr, eps, weight_decay = lr * c2 ** 0.5 / c1, eps * c2 ** 0.5, weight_decay * c1 / c2 ** 0.5
        return _capi.AdamConfig(lr, group["betas"][0], group["betas"][1], eps, weight_decay, self._freeze_step)

    @property
    def _steps_taken(self):
        # The updates made: under deepspeed_schedule the first call made none.
        return max(self._step - self._deepspeed_schedule, 0)

    @property
    def _wants_averaged_gradients(self):
        return not self.compressing

    @property
    def _averaging_settled(self):
        return self.compressing  # the compression stage never ends

    @property
    def compressing(self) -> bool:
        """Whether the next step (and the backward pass before it) is in the compression stage."""
        answer = self._lib.onebit_adam_compressing(ctypes.byref(self._config(self.param_groups[0])),
                                                   ctypes.c_int64(self._step))
        if answer < 0:
            _check(self._lib, 1)
        return bool(answer)

    @property
    def freeze_step(self) -> Optional[int]:
        """The first step of the compression stage; None while freeze_step="auto" has not fired."""
        return None if self._freeze_step == _UNDECIDED else self._freeze_step

    def _measure_variance(self, taken):
        """freeze_step="auto", after warmup step `taken`: measure, decide, and say so when it fires."""
        lib, step = self._lib, ctypes.c_int64(taken)
        measures = lib.onebit_adam_auto_freeze_measures(ctypes.byref(self._auto), step) == 1
        changes = []  # every rank's
        if measures:
            value = ctypes.c_double()
            self._measure("onebit_adam_variance_change", _ptr(self._v), _ptr(self._v_then),
                          ctypes.c_size_t(self._v.numel()), ctypes.byref(value))
            changes = [_bits_double(row[0]) for row in self._every_rank([_bits(value.value)])]
            self._v_then.copy_(self._v)
        decided = ctypes.c_double()
        first = lib.onebit_adam_auto_freeze_decide_ranks(ctypes.byref(self._auto), step,
                                                         (ctypes.c_double * max(len(changes), 1))(*changes),
                                                         ctypes.c_size_t(len(changes)), ctypes.byref(decided))
        if first == -2:
            _check(lib, 1)
        change = decided.value
        if measures:
            self.variance_changes.append((taken, change))
        if first >= 0:
            self._freeze_step = first
            if dist.get_rank(self._group) == 0:
                why = (f"the variance moved {change:.4f} < {self._auto.threshold} over the last "
                       f"{self._auto.window} steps"
                       if change < self._auto.threshold else f"max_freeze_step {self._auto.max_step}")
                logger.info(f"OnebitAdam: freeze_step='auto' fired after step {taken}: {why}; "
                            f"compression from step {first}")

    def _flat_step(self):
        lib = self._lib
        if self._deepspeed_schedule and self._step == 0:
            self._step = 1  # DeepSpeed's initialising call: counted, nothing moves
            return
        # On the CPU the C core runs over _pieces(): the flat copies, or each parameter in place.
        if not self.compressing:
            gathered = self._averaged_gradients_gathered()
            for index, (group, (lo, hi)) in enumerate(zip(self.param_groups, self._ranges)):
                config = ctypes.byref(self._config(group))
                if self._device.type == "cuda":
                    self._core_step("onebit_adam_warmup_step", config, _ptr(self._flat[lo:]), _ptr(self._m[lo:]),
                                    _ptr(self._v[lo:]), _ptr(self._grad[lo:]), ctypes.c_size_t(hi - lo))
                    continue
                for params, at, n, p in self._pieces(index):
                    grad = self._grad[at:] if gathered else self._local_gradient(p, at, at + n)
                    _check(lib, lib.onebit_adam_warmup_step(config, params, _ptr(self._m[at:]), _ptr(self._v[at:]),
                                                            _ptr(grad), ctypes.c_size_t(n)))
        else:
            if self._step == self._freeze_step:
                self._report_freeze(self._step, self._v)
            self._warn_if_no_local_gradient()
            for index, (group, (lo, hi)) in enumerate(zip(self.param_groups, self._ranges)):
                config = ctypes.byref(self._config(group))
                if self._device.type == "cuda":  # the momentum as it was kept in the same pass, as below
                    self._core_step("onebit_adam_momentum_step", config, _ptr(self._m[lo:]), _ptr(self._m_before[lo:]),
                                    _ptr(self._grad[lo:]), ctypes.c_size_t(hi - lo))
                    continue
                for _, at, n, p in self._pieces(index):
                    grad = self._grad[at:] if p is None else self._local_gradient(p, at, at + n)
                    _check(lib, lib.onebit_adam_momentum_step_keeping(config, _ptr(self._m[at:]),
                                                                      _ptr(self._m_before[at:]), _ptr(grad),
                                                                      ctypes.c_size_t(n)))
            try:
                self._average_tagged(self._m, self._step, f"compression stage since step {self._freeze_step}")
            except RuntimeError:
                self._m.copy_(self._m_before)  # a failed step changes nothing
                raise
            for index, (group, (lo, hi)) in enumerate(zip(self.param_groups, self._ranges)):
                config = ctypes.byref(self._config(group))
                if self._device.type == "cuda":
                    self._core_step("onebit_adam_apply_step", config, _ptr(self._flat[lo:]), _ptr(self._m[lo:]),
                                    _ptr(self._v[lo:]), ctypes.c_size_t(hi - lo))
                    continue
                for params, at, n, _ in self._pieces(index):
                    _check(lib, lib.onebit_adam_apply_step(config, params, _ptr(self._m[at:]), _ptr(self._v[at:]),
                                                           ctypes.c_size_t(n)))
        self._step += 1
        if self._auto is not None and self._freeze_step == _UNDECIDED:
            self._measure_variance(self._step - 1)  # the step is taken; this decides the next one's stage

    def _onebit_state(self):
        return self._rank_state(self.compressing and self._step > self._freeze_step, step=self._step,
                                     freeze_step=self._freeze_step,
                                     v_then=None if self._v_then is None else self._v_then.clone(),
                                     variance_changes=list(self.variance_changes),
                                     bias_correction=self._bias_correction,
                                     deepspeed_schedule=self._deepspeed_schedule)

    def _schedule_refusal(self, part):
        if (part.get("v_then") is None) != (self._v_then is None):
            return "the checkpoint and this optimizer disagree on freeze_step='auto'"
        if part.get("bias_correction", False) != self._bias_correction:
            return (f"the checkpoint was saved with bias_correction={part.get('bias_correction', False)}, this "
                    f"optimizer has {self._bias_correction}: the steps would change size on resume; make the "
                    "optimizer as the run was made")
        recorded = part.get("deepspeed_schedule")  # None: a checkpoint from before it was recorded
        if recorded is not None and recorded != self._deepspeed_schedule:
            return (f"the checkpoint was saved with deepspeed_schedule={recorded}, this optimizer has "
                    f"{self._deepspeed_schedule}: the steps would count from another origin on resume (the freeze one "
                    "step off, the bias correction changed); make the optimizer as the run was made")
        return None if self._v_then is not None else self._freeze_step_refusal(part["step"], part.get("freeze_step"))

    def load_state_dict(self, state_dict: Dict[str, Any], reset_error_feedback: bool = False) -> None:
        """Resumes from a state_dict() (a collective: every rank loads). The checkpoint must hold
        this rank's part (every rank's after consolidate_state_dict(), or the one all share before
        the first compressed step); its schedule and bias_correction must match this optimizer's,
        checked on every rank before anything changes. Error feedback loads only into the layout
        (ranks, ranks per host) it was made in; reset_error_feedback=True drops it, so that a job
        resized or laid out anew goes on (rank 0 warns once)."""
        state_dict, saved = self._split_state_dict(state_dict, reset_error_feedback)
        # "auto": the checkpoint's decision (or its undecided state) goes on; a fixed one is this
        # optimizer's (_schedule_refusal has refused one the checkpoint's stage contradicts).
        freeze_step = saved.get("freeze_step", self._freeze_step) if self._v_then is not None else self._freeze_step
        self._agree_on_schedule(step=saved["step"], freeze_step=freeze_step)
        super().load_state_dict(state_dict)
        self._step = saved["step"]
        self._m.copy_(saved["m"])
        self._v.copy_(saved["v"])
        self._freeze_step = freeze_step
        if self._v_then is not None:
            self._v_then.copy_(saved["v_then"])
            self.variance_changes = list(saved["variance_changes"])
        self._load_error_state(saved["worker_error"], saved["server_error"])
        self._loaded(saved)

    def close(self) -> None:
        """Untags the momentum (frees its error-feedback state) and frees its name for another
        optimizer. Dropping the optimizer does the same; calling it twice does nothing."""
        self._drop_tag()

