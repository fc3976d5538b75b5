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
from ._core import _NOT_RECORDED, _AdamDriver
from ._errors import OnebitError
from ._flat_optimizer import Params, _FlatOptimizer, _ptr
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
            grad, a bad freeze_step or schedule (the "auto" knobs out of range, deepspeed_schedule
            with "auto" or bias_correction: the C core's driver names it), a name another live
            optimizer holds.
        OnebitError: the ranks disagree on the schedule or the parameters (named, with each
            rank's value; code MISMATCH, a RuntimeError).
    """

    _steps_in_place = True  # its rule is elementwise: on the CPU each parameter is updated where it lies

    def __init__(self, params: Params, lr: float = 1e-3, betas: Tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, freeze_step: Union[int, Literal["auto"]] = 100,
                 process_group: Optional[dist.ProcessGroup] = None, name: str = "onebit_adam/momentum",
                 freeze_window: int = 10, freeze_threshold: float = 0.1, max_freeze_step: Optional[int] = None,
                 deepspeed_schedule: bool = False, bias_correction: bool = False) -> None:
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self._flatten("OnebitAdam", process_group)
        auto = freeze_step == "auto"
        if not auto and (not isinstance(freeze_step, int) or isinstance(freeze_step, bool) or freeze_step < 0):
            raise ValueError(f"OnebitAdam: freeze_step must be a step (an int >= 0) or 'auto', not {freeze_step!r}")
        # The schedule — the stages, DeepSpeed's counting call, the automatic freeze, bias correction,
        # ONEBIT_FREEZE_STEP's override — is the C core's driver, the C++ shim's too.
        schedule = _capi.AdamSchedule(-1 if auto else freeze_step,
                                      _capi.AdamAutoFreeze(freeze_window, freeze_threshold, max_freeze_step or 0),
                                      bool(deepspeed_schedule), bool(bias_correction))
        try:
            self._driver = _AdamDriver(self._lib, "OnebitAdam", schedule, self._total, len(self.param_groups))
        except OnebitError as error:
            raise ValueError(str(error)) from error  # a setting that cannot run, as torch's optimizers refuse them
        self._m = self._zeros()
        self._v = self._zeros()
        self._m_before = self._zeros()  # the momentum before a compressed step, to undo a failed one
        # the automatic freeze's v at its last measurement
        self._v_then = self._zeros() if self._driver.state().automatic else None
        self._name = name
        self._agree(**self._driver.agreed_fields())  # before tagging: a refused optimizer leaves no tag behind
        self._own_tag(self._m, name)

    def _config(self, group):
        """The C core's config of `group` for the next step (the driver folds in bias correction)."""
        return self._driver.config(group)

    @property
    def _step(self):
        return self._driver.status().step

    @property
    def _steps_taken(self):
        return self._driver.status().steps_taken

    @property
    def _wants_averaged_gradients(self):
        return not self.compressing

    @property
    def _averaging_settled(self):
        return self.compressing  # the compression stage never ends

    @property
    def compressing(self) -> bool:
        """Whether the next step (and the backward pass before it) is in the compression stage."""
        return self._driver.status().next == _AdamDriver.COMPRESSED

    @property
    def freeze_step(self) -> Optional[int]:
        """The first step of the compression stage; None while freeze_step="auto" has not fired."""
        freeze = self._driver.status().freeze_step
        return None if freeze < 0 else freeze

    @property
    def variance_changes(self) -> List[Tuple[int, float]]:
        """freeze_step="auto": (step, change) of every measurement, the largest over ranks."""
        return self._driver.changes()

    def _taken(self):
        """The step is taken: the driver counts it, and with freeze_step="auto" decides the next
        one's stage on every rank's measured variance change; rank 0 logs what it decided."""
        if self._driver.taken():
            value = ctypes.c_double()
            self._measure("onebit_adam_variance_change", _ptr(self._v), _ptr(self._v_then),
                          ctypes.c_size_t(self._v.numel()), ctypes.byref(value))
            self._driver.decide([_bits_double(row[0]) for row in self._every_rank([_bits(value.value)])])
            self._v_then.copy_(self._v)
        news = self._driver.news()
        if news and self._rank == 0:
            logger.info(news)

    def _flat_step(self):
        now = self._driver.status()
        if now.next == _AdamDriver.COUNTING:  # DeepSpeed's initialising call: counted, nothing moves
            self._taken()
            return
        # On the CPU the C core runs over _pieces(): the flat copies, or each parameter in place.
        if now.next == _AdamDriver.WARMUP:
            self._warmup_step()
        else:
            self._compressed_step(now)
        self._taken()

    def _warmup_step(self):
        gathered = self._averaged_gradients_gathered()
        for index, (group, (lo, hi)) in enumerate(zip(self.param_groups, self._ranges)):
            config = ctypes.byref(self._config(group))
            if self._device.type == "cuda":
                self._core_step("onebit_adam_warmup_step", config, _ptr(self._flat[lo:]), _ptr(self._m[lo:]),
                                _ptr(self._v[lo:]), _ptr(self._grad[lo:]), ctypes.c_size_t(hi - lo))
                continue
            for params, at, n, p in self._pieces(index):
                grad = self._grad[at:] if gathered else self._local_gradient(p, at, at + n)
                _check(self._lib, self._lib.onebit_adam_warmup_step(config, params, _ptr(self._m[at:]),
                                                                    _ptr(self._v[at:]), _ptr(grad),
                                                                    ctypes.c_size_t(n)))

    def _compressed_step(self, now):
        lib = self._lib
        if now.freezes_now:
            self._report_freeze(now.step, self._v)
        self._warn_if_no_local_gradient()
        for index, (group, (lo, hi)) in enumerate(zip(self.param_groups, self._ranges)):
            config = ctypes.byref(self._config(group))
            if self._device.type == "cuda":  # the momentum as it was kept in the same pass, as below
                self._core_step("onebit_adam_momentum_step", config, _ptr(self._m[lo:]), _ptr(self._m_before[lo:]),
                                _ptr(self._grad[lo:]), ctypes.c_size_t(hi - lo))
                continue
            for _, at, n, p in self._pieces(index):
                grad = self._grad[at:] if p is None else self._local_gradient(p, at, at + n)
                _check(lib, lib.onebit_adam_momentum_step_keeping(config, _ptr(self._m[at:]), _ptr(self._m_before[at:]),
                                                                  _ptr(grad), ctypes.c_size_t(n)))
        try:
            self._average_tagged(self._m, now.step, f"compression stage since step {now.freeze_step}")
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

    def _onebit_state(self):
        state, now = self._driver.state(), self._driver.status()
        return self._rank_state(self.compressing and now.step > now.freeze_step, step=state.step,
                                freeze_step=state.freeze_step,
                                v_then=None if self._v_then is None else self._v_then.clone(),
                                variance_changes=self.variance_changes,
                                bias_correction=bool(state.bias_correction),
                                deepspeed_schedule=bool(state.deepspeed_schedule))

    @staticmethod
    def _saved_schedule(part):
        """A checkpoint part's schedule as the driver reads it (a field it lacks: not recorded)."""
        def recorded(key):
            value = part.get(key)
            return _NOT_RECORDED if value is None else int(value)
        return _capi.AdamDriverState(int(part["step"]), recorded("freeze_step"), int(part.get("v_then") is not None),
                                     recorded("bias_correction"), recorded("deepspeed_schedule"))

    def _schedule_refusal(self, part):
        return self._driver.resume_refusal(self._saved_schedule(part))

    def load_state_dict(self, state_dict: Dict[str, Any], reset_error_feedback: bool = False) -> None:
        """Resumes from a state_dict() (a collective: every rank loads). The checkpoint must hold
        this rank's part (every rank's after consolidate_state_dict(), or the one all share before
        the first compressed step); its schedule and bias_correction must match this optimizer's,
        checked on every rank before anything changes. Error feedback loads only into the layout
        (ranks, ranks per host) it was made in; reset_error_feedback=True drops it, so that a job
        resized or laid out anew goes on (rank 0 warns once)."""
        state_dict, saved = self._split_state_dict(state_dict, reset_error_feedback)
        schedule = self._saved_schedule(saved)  # _schedule_refusal has refused one that cannot go on
        self._agree(**self._driver.agreed_fields(schedule))
        super().load_state_dict(state_dict)
        self._driver.resume(schedule, list(saved.get("variance_changes", ())))
        self._m.copy_(saved["m"])
        self._v.copy_(saved["v"])
        if self._v_then is not None:
            self._v_then.copy_(saved["v_then"])
        self._load_error_state(saved["worker_error"], saved["server_error"])
        self._loaded(saved)

    def close(self) -> None:
        """Untags the momentum (frees its error-feedback state) and frees its name for another
        optimizer. Dropping the optimizer does the same; calling it twice does nothing."""
        self._drop_tag()

