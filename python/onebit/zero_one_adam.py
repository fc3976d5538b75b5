"""ZeroOneAdam: 0/1 Adam (Lu et al., 2022) as a torch.optim.Optimizer over onebit, with DeepSpeed's
parameter names and defaults (var_freeze_step, var_update_scaler, local_step_scaler,
local_step_clipper).

The schedule and arithmetic are onebit's C core (onebit_zero_one_adam_*; the rule is written out
in include/onebit/onebit.h and docs/design/optimizer-rules.md), which the C++ shim include/onebit/zero_one_adam.hpp
uses too. Step t (from 0) is one of four kinds:

- variance step (t <= var_freeze_step and (t+1) % var_interval == 0): gradients averaged over
  ranks in full precision, then Adam with the variance updated;
- compressed step (the other steps up to var_freeze_step): the gradients averaged 1-bit
  compressed (one flat tagged buffer, error feedback), the variance kept; var_interval doubles
  after every var_update_scaler variance steps;
- local step (t > var_freeze_step): no communication at all; the update accumulates in u;
- sync step (a local step with (t+1) % local_step_interval == 0): u, scaled by the frozen
  sqrt(v)+eps, averaged compressed in the same tagged buffer; the momentum is rebuilt from it and
  every replica lands on the same parameters. local_step_interval doubles after every
  local_step_scaler steps, up to local_step_clipper.

With DDP, register onebit.ddp_comm_hook: it averages only for variance steps. Parameters live on
the CPU, or all on one CUDA device under libonebit-nccl-preload.so (the steps are then the C
core's device steps, onebit_zero_one_adam_*_device: the same rule, the same bits, on torch's
current stream; the tagged buffer's all_reduce is compressed by the NCCL door). state_dict() holds the
schedule, m, v, u, the parameters at the last sync, the lr sums and this rank's error-feedback
state (every rank's after consolidate_state_dict(), as OnebitAdam's): loaded into a job of the
same size, training continues bit for bit. synchronize() makes the replicas equal before a save
or an evaluation; onebit.integrations call it.
"""
from __future__ import annotations

import ctypes
from typing import Any, Dict, Optional, Tuple

import torch
import torch.distributed as dist

from . import _capi, _check, tag, untag
from ._core import _core_fields, _core_text
from ._flat_optimizer import Params, _FlatOptimizer, _ptr, _run_eagerly

__all__ = ["ZeroOneAdam"]

VARIANCE_STEP, COMPRESSED_STEP, LOCAL_STEP, SYNC_STEP = 0, 1, 2, 3  # onebit_zero_one_adam_step_t


class ZeroOneAdam(_FlatOptimizer):
    """0/1 Adam (Lu et al., 2022) with DeepSpeed's parameter names and defaults: Adam whose variance
    is updated on ever sparser steps, whose gradients are averaged 1-bit compressed in between,
    and whose ranks, once the variance is frozen, take local steps and synchronise ever more
    rarely. A torch.optim.Optimizer over float32 parameters on the CPU or one CUDA device;
    docs/usage/optimizers.md, "ZeroOneAdam and OnebitLamb".

    What step() does, by the kind of step (``next_step_kind()`` says the next one's):

    - VARIANCE_STEP (up to ``var_freeze_step``, on exponentially spaced steps): the gradients
      averaged over the ranks in full precision (by onebit.ddp_comm_hook under DDP), then Adam
      with the variance updated;
    - COMPRESSED_STEP (the other steps up to ``var_freeze_step``): the gradients averaged 1-bit
      compressed (one flat tagged buffer, error feedback), Adam with the variance kept;
    - LOCAL_STEP (after ``var_freeze_step``): no communication; the update accumulates;
    - SYNC_STEP (every local_step_interval-th local step): the accumulated update averaged
      compressed in the same buffer, and every replica lands on the same parameters.

    Between syncs the replicas legitimately differ: synchronize() (every rank) makes them equal
    before a save or an evaluation; onebit.integrations call it. state_dict() carries the schedule
    and every buffer; loaded into a job of the same size, training continues bit for bit.

    Args:
        params: the parameters to optimize, or parameter groups (dicts; each may set its own lr,
            betas, eps and weight_decay). float32, all on the CPU or all on one CUDA device (under
            libonebit-nccl-preload.so), all requiring grad; the groups are fixed at construction.
        lr: the learning rate (default 1e-3).
        betas: Adam's (beta1, beta2) (default (0.9, 0.999)).
        eps: Adam's epsilon (default 1e-8); also the dormant bound after the freeze.
        weight_decay: decoupled weight decay, lr * weight_decay * p per step (default 0.0).
        var_freeze_step: the last step that may update the variance; local steps follow (default
            100000, DeepSpeed's: suits runs of hundreds of thousands of steps). DeepSpeed sets it
            at the end of the learning-rate warmup; scale it down for short runs (the demo: 15 %
            of the steps).
        var_update_scaler: variance updates after which the interval between them doubles
            (default 16). Lower: fewer full-precision steps, a staler variance.
        local_step_scaler: local steps after which the interval between syncs doubles (default
            32678, DeepSpeed's number). Scale it down for short runs (the demo: a tenth of the
            steps).
        local_step_clipper: the largest interval between syncs, in steps (default 16). Higher:
            less communication, replicas further apart between syncs.
        process_group: the ranks to average over (default None: the default process group); its
            backend must be "onebit", or gloo under libonebit-preload.so, for compression.
        name: the tag of the compressed buffer, which keys its error feedback (default
            "zero_one_adam/buffer"). The same on every rank; one per live optimizer.

    Raises:
        ValueError: parameters not float32, on mixed devices, on CUDA without the NCCL door's
            device steps, or requiring no grad; a name another live optimizer holds.
        RuntimeError: the ranks disagree on the schedule or the parameters.
        OnebitError: the C core refuses a hyper-parameter (a scaler or the clipper < 1,
            var_freeze_step < 0): code INVALID_ARGUMENT.
    """

    def __init__(self, params: Params, lr: float = 1e-3, betas: Tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, var_freeze_step: int = 100000,
                 var_update_scaler: int = 16, local_step_scaler: int = 32678, local_step_clipper: int = 16,
                 process_group: Optional[dist.ProcessGroup] = None, name: str = "zero_one_adam/buffer") -> None:
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self._flatten("ZeroOneAdam", process_group)
        self._schedule_config = (var_freeze_step, var_update_scaler, local_step_scaler, local_step_clipper)
        self._schedule = _capi.ZeroOneAdamSchedule()
        _check(self._lib, self._lib.onebit_zero_one_adam_schedule_init(ctypes.byref(self._schedule)))
        for group in self.param_groups:
            self.next_step_kind(group)  # validates every group's hyper-parameters
        self._m = self._zeros()
        self._v = self._zeros()
        self._u = self._zeros()  # the tagged buffer: the gradient, then the accumulated update
        self._p_sync = self._zeros()  # the parameters at the last sync
        self._lrs = [ctypes.c_float(0.0) for _ in self.param_groups]
        self._sync_snapshot = None  # _sync's copies of m and u, to undo a failed sync
        self._name = name
        self._agree_on_schedule()  # before tagging: a refused optimizer leaves no tag behind
        self._own_tag(self._u, name)

    def _agree_on_schedule(self, schedule=None):
        """The ranks agree on the schedule's settings and on its state (this optimizer's, or the
        `schedule` a load is about to take), the fields the C core names."""
        state = self._schedule if schedule is None else schedule
        self._agree(**_core_fields(self._lib, "onebit_zero_one_adam_agreed_fields",
                                   ctypes.byref(self._config(self.param_groups[0])), ctypes.byref(state),
                                   self._total, len(self.param_groups)))

    def _config(self, group):
        return _capi.ZeroOneAdamConfig(group["lr"], group["betas"][0], group["betas"][1], group["eps"],
                                       group["weight_decay"], *self._schedule_config)

    def next_step_kind(self, group: Optional[Dict[str, Any]] = None) -> int:
        """The kind of the next step: VARIANCE_STEP, COMPRESSED_STEP, LOCAL_STEP or SYNC_STEP."""
        kind = ctypes.c_int()
        config = self._config(group or self.param_groups[0])
        _check(self._lib, self._lib.onebit_zero_one_adam_next(ctypes.byref(config), ctypes.byref(self._schedule),
                                                             ctypes.byref(kind)))
        return kind.value

    @property
    def _steps_taken(self):
        return self._schedule.step

    @property
    def _wants_averaged_gradients(self):
        return self.next_step_kind() == VARIANCE_STEP

    @property
    def _averaging_settled(self):
        # Variance steps come only while step <= var_freeze_step (the C core's schedule).
        return self._schedule.step > self._config(self.param_groups[0]).var_freeze_step

    @property
    def schedule(self) -> Dict[str, int]:
        """The schedule's counters: step, var_interval, var_counter, local_step_interval, local_step_counter."""
        return {field[0]: getattr(self._schedule, field[0]) for field in _capi.ZeroOneAdamSchedule._fields_}

    # Every step's rule is elementwise: on the CPU each parameter is updated where it lies, and each
    # gradient read where it lies (_FlatOptimizer's in-place steps), bit for bit as over the flat copy.
    _steps_in_place = True

    def _each_piece(self, gradients):
        """(group index, config, where the parameters are, offset in the flat buffers, length,
        gradient) of every piece of every group — each parameter in place, else each group's range
        of the flat buffer (_pieces) — the gradient from the flat buffer `gradients`, or with None
        the parameter's own where the C core can read it."""
        for index, group in enumerate(self.param_groups):
            config = ctypes.byref(self._config(group))
            for params, at, n, p in self._pieces(index):
                grad = gradients[at:] if gradients is not None else self._local_gradient(p, at, at + n)
                yield index, config, params, at, ctypes.c_size_t(n), _ptr(grad)

    def _local_steps(self):
        """Every group's local step. Each adds the group's lr to its lr sum once: the group's first
        piece adds it, the others add to a scratch sum (a group without parameters still counts it)."""
        counted = set()
        for index, config, params, at, n, grad in self._each_piece(None if self._in_place else self._grad):
            lrs = self._lrs[index] if index not in counted else ctypes.c_float(0.0)
            counted.add(index)
            self._core_step("onebit_zero_one_adam_local_step", config, params, _ptr(self._m[at:]), _ptr(self._v[at:]),
                            _ptr(self._u[at:]), ctypes.byref(lrs), grad, n)
        for index in range(len(self.param_groups)):
            if index not in counted:
                self._core_step("onebit_zero_one_adam_local_step", ctypes.byref(self._config(self.param_groups[index])),
                                _ptr(self._flat), _ptr(self._m), _ptr(self._v), _ptr(self._u),
                                ctypes.byref(self._lrs[index]), _ptr(self._grad), ctypes.c_size_t(0))

    def _flat_step(self):
        lib = self._lib
        kind = self.next_step_kind()
        if kind in (VARIANCE_STEP, COMPRESSED_STEP):
            if kind == VARIANCE_STEP:
                gathered = self._averaged_gradients_gathered()
                averaged = self._grad if gathered else None
            else:
                if self._in_place:
                    self._gather_gradients(into=self._u)
                else:
                    self._u.copy_(self._grad)
                # compressed; a failure has changed nothing else
                self._average_tagged(self._u, self._schedule.step, "a compressed-gradient step of the variance stage")
                averaged = self._u
            for _, config, params, at, n, grad in self._each_piece(averaged):
                self._core_step("onebit_zero_one_adam_gradient_step", config, params, _ptr(self._m[at:]),
                                _ptr(self._v[at:]), grad, n, ctypes.c_int(kind == VARIANCE_STEP))
        else:
            self._warn_if_no_local_gradient()
            if kind == LOCAL_STEP:
                self._local_steps()
            else:
                self._sync(self._local_steps, "a sync step of the local-step stage")
        entering_local_stage = self._schedule.step == self._schedule_config[0]
        _check(lib, lib.onebit_zero_one_adam_advance(ctypes.byref(self._config(self.param_groups[0])),
                                                     ctypes.byref(self._schedule)))
        if entering_local_stage:
            self._report_freeze(self._schedule.step, self._v)
            # The tagged buffer carries u from now on: zero, with its error feedback started afresh.
            untag(self._u)
            self._u.zero_()
            tag(self._u, self._name)
            if self._in_place:
                self._read_parameters(into=self._p_sync)
            else:
                self._p_sync.copy_(self._flat)

    def _sync(self, local_steps, stage):
        """A sync: `local_steps()` (the sync step's own local step, or nothing), u scaled, averaged
        compressed, the parameters rebuilt from the last sync's. A failure changes nothing. The
        parameters come back from the flat buffer: in place, it is their snapshot, taken here (the
        flat buffer is unused then); on the flat path, they are read back from the parameters (both
        callers read them in just before, and write them only after). m and u come back from a
        snapshot kept in buffers reused by every sync (2 flat buffers, made at the first sync: fresh
        copies at every sync cost page faults)."""
        if self._sync_snapshot is None:
            self._sync_snapshot = (torch.empty_like(self._m), torch.empty_like(self._u))
        m_before, u_before = self._sync_snapshot
        if self._in_place:
            self._read_parameters()
        m_before.copy_(self._m)
        u_before.copy_(self._u)
        lrs_before = [lrs.value for lrs in self._lrs]
        try:
            local_steps()
            self._refuse_zero_learning_rates()
            for index, (group, (lo, hi)) in enumerate(zip(self.param_groups, self._ranges)):
                self._core_step("onebit_zero_one_adam_sync_begin", ctypes.byref(self._config(group)),
                                _ptr(self._u[lo:]), _ptr(self._v[lo:]), self._lrs[index], ctypes.c_size_t(hi - lo))
            self._average_tagged(self._u, self._schedule.step, stage)
        except RuntimeError:
            if self._in_place:
                self._write_parameters()
            else:
                self._read_parameters()
            self._m.copy_(m_before)
            self._u.copy_(u_before)
            for lrs, value in zip(self._lrs, lrs_before):
                lrs.value = value
            raise
        # Each piece divides by its group's lr sum, which the C core zeroes after: each takes a copy.
        for index, config, params, at, n, _ in self._each_piece(self._grad):
            lrs = ctypes.c_float(self._lrs[index].value)
            self._core_step("onebit_zero_one_adam_sync_end", config, params, _ptr(self._p_sync[at:]),
                            _ptr(self._m[at:]), _ptr(self._u[at:]), _ptr(self._v[at:]), ctypes.byref(lrs), n)
        for lrs in self._lrs:
            lrs.value = 0.0

    def _refuse_zero_learning_rates(self):
        """A sync divides each group's u by the group's learning-rate sum since the last sync: a group
        whose lr was 0 at every one of those steps cannot sync (the C core's rule and words). The
        sums are each rank's own (its param_groups' lr), so whether to refuse is agreed first: a rank
        that refused alone would leave the others waiting in the sync's all_reduce."""
        sums = (ctypes.c_float * len(self._lrs))(*(lrs.value for lrs in self._lrs))
        refusal = _core_text(self._lib, "onebit_zero_one_adam_sync_refusal", sums, ctypes.c_size_t(len(self._lrs)),
                             ctypes.c_int64(self._schedule.step))
        refused = [r for r, row in enumerate(self._every_rank([int(bool(refusal))])) if row[0]]
        if refusal:
            raise RuntimeError(f"ZeroOneAdam: {refusal}; nothing was changed")
        if refused:
            raise RuntimeError(f"ZeroOneAdam: rank {', '.join(map(str, refused))} refused the sync at schedule step "
                               f"{self._schedule.step} (its error says why: a group's lr was 0 there); nothing was "
                               "changed")

    @_run_eagerly
    @torch.no_grad()
    def synchronize(self) -> bool:
        """Every rank's parameters made equal now — before saving or evaluating mid local-step stage,
        where the replicas legitimately differ between syncs. It is a sync out of schedule: u
        averaged 1-bit compressed, the parameters rebuilt from the last sync's (the schedule does
        not move; the next sync averages what accumulates from here). A collective: every rank
        calls it. Where the replicas are equal already (the variance stage, right after a sync:
        every lr sum 0, the same on every rank) it does nothing and sends nothing. Returns whether
        it moved the parameters."""
        self._refuse_graph_capture("synchronize()")
        self._refuse_changed_parameters("synchronize()")
        if all(lrs.value == 0 for lrs in self._lrs):
            return False
        self._in_place = False  # out of step(): the flat path (the parameters read in, synced, written back)
        self._read_parameters()
        self._sync(lambda: None, "synchronize()")
        self._write_parameters()
        self._consolidated = None  # gathered before this sync: stale
        return True

    def _same_on_every_rank(self, part):
        """As for every onebit optimizer, and the replicas equal (every lr sum 0: no local step since a sync)."""
        return super()._same_on_every_rank(part) and not any(part["lrs"])

    _SCHEDULE_KNOBS = ("var_freeze_step", "var_update_scaler", "local_step_scaler", "local_step_clipper")

    def _onebit_state(self):
        return self._rank_state(False, schedule=self.schedule, u=self._u.clone(),
                                params_at_sync=self._p_sync.clone(), lrs=[total.value for total in self._lrs],
                                schedule_config=dict(zip(self._SCHEDULE_KNOBS, self._schedule_config)))

    def _schedule_refusal(self, part):
        """A checkpoint's schedule goes on only under the knobs that made it, and only from a state
        the schedule can reach: the C core's rule and words (onebit_zero_one_adam_resume_refusal,
        docs/usage/restarting.md). What cannot even be read as a schedule is refused here."""
        if len(part["lrs"]) != len(self._lrs):
            return f"the checkpoint has {len(part['lrs'])} parameter groups, this optimizer {len(self._lrs)}"
        saved = part.get("schedule_config")  # None: a checkpoint from before it was recorded
        try:
            schedule = _capi.ZeroOneAdamSchedule(**part["schedule"])
            knobs = None if saved is None else _capi.ZeroOneAdamConfig(
                0, 0, 0, 0, 0, *(int(saved[k]) for k in self._SCHEDULE_KNOBS))
        except (TypeError, KeyError, ValueError) as error:  # refused here, on every rank alike
            return f"the checkpoint's schedule cannot be read ({type(error).__name__}: {error})"
        return _core_text(self._lib, "onebit_zero_one_adam_resume_refusal",
                          ctypes.byref(self._config(self.param_groups[0])), ctypes.byref(schedule),
                          None if knobs is None else ctypes.byref(knobs)) or None

    def _loaded_schedule(self, part):
        """The schedule state of checkpoint part `part`, checked by the C core (OnebitError if out of range)."""
        schedule = _capi.ZeroOneAdamSchedule(**part["schedule"])
        kind = ctypes.c_int()
        _check(self._lib, self._lib.onebit_zero_one_adam_next(ctypes.byref(self._config(self.param_groups[0])),
                                                             ctypes.byref(schedule), ctypes.byref(kind)))
        return schedule

    def load_state_dict(self, state_dict: Dict[str, Any], reset_error_feedback: bool = False) -> None:
        """Resumes from a state_dict() (a collective: every rank loads): schedule, buffers and error
        feedback, checked on every rank before anything changes. Error feedback loads only into the
        layout (ranks, ranks per host) it was made in; reset_error_feedback=True drops it (rank 0
        warns once)."""
        state_dict, saved = self._split_state_dict(state_dict, reset_error_feedback)
        schedule = self._loaded_schedule(saved)
        self._agree_on_schedule(schedule)  # before anything changes
        super().load_state_dict(state_dict)
        self._load_error_state(saved["worker_error"], saved["server_error"])
        self._schedule = schedule
        self._m.copy_(saved["m"])
        self._v.copy_(saved["v"])
        self._u.copy_(saved["u"])  # in place: the tag holds its address
        self._p_sync.copy_(saved["params_at_sync"])
        for lrs, value in zip(self._lrs, saved["lrs"]):
            lrs.value = value
        self._loaded(saved)

    def close(self) -> None:
        """Untags the buffer (frees its error-feedback state) and frees its name for another
        optimizer. Dropping the optimizer does the same; calling it twice does nothing."""
        self._drop_tag()
