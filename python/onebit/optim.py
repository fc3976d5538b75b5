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
compressed there, and the same update rule runs as torch operations on the device (the C core
works on host memory); the phase decision is still the C core's.

freeze_step="auto" ends the warmup when the variance has settled: every `freeze_window` warmup
steps the relative change of v since the last look, sum|v - v_then| / sum|v|, is measured, its
largest value over ranks taken (an allreduce, so every rank decides alike), and the compression
stage starts after the first measurement under `freeze_threshold` — or at `max_freeze_step`. The
rule is the C core's (onebit_adam_auto_freeze_*, shared with the C++ shim); rank 0 prints one line
when it fires, and `freeze_step` then says the step.

state_dict() holds step, m, v and this rank's error-feedback state (the anchors keep none): save
one per rank, load each into the same rank of a job of the same size, and training continues bit
for bit (docs/usage.md, "Restarting a job").
"""
import ctypes
import sys

import torch
import torch.distributed as dist

from . import _library, _check, tag, untag

__all__ = ["OnebitAdam", "ddp_comm_hook"]


class _AdamConfig(ctypes.Structure):  # onebit_adam_config_t
    _fields_ = [("lr", ctypes.c_float), ("beta1", ctypes.c_float), ("beta2", ctypes.c_float),
                ("eps", ctypes.c_float), ("weight_decay", ctypes.c_float), ("freeze_step", ctypes.c_int64)]


class _AutoFreeze(ctypes.Structure):  # onebit_adam_auto_freeze_t
    _fields_ = [("window", ctypes.c_int64), ("threshold", ctypes.c_double), ("max_step", ctypes.c_int64)]


_UNDECIDED = 2**63 - 1  # freeze_step while "auto" has not fired: every step is warmup


def _ptr(tensor):
    return ctypes.c_void_p(tensor.data_ptr())


class _FlatOptimizer(torch.optim.Optimizer):
    """What onebit's optimizers share: every parameter a view into one flat fp32 buffer (each group
    a contiguous range of it, in param_groups order), a flat gradient buffer, the gradient average
    of the full-precision steps, the tagged buffer's error-feedback state in state_dict(), and the
    DDP hook's question: does the next step want averaged gradients?"""

    def _flatten(self, who, process_group, cuda=True):
        self._who = who
        self._lib = _library()
        self._group = process_group
        self._world = dist.get_world_size(process_group)
        self._rank = dist.get_rank(process_group)
        self._gradients_averaged_by_hook = False  # set by ddp_comm_hook
        devices = {p.device for group in self.param_groups for p in group["params"]}
        allowed = ("cpu", "cuda") if cuda else ("cpu",)
        if len(devices) != 1 or next(iter(devices)).type not in allowed:
            where = "one CPU or CUDA device" if cuda else "the CPU (the C core works on host memory; OnebitAdam also runs on CUDA)"
            raise ValueError(f"{who}: parameters must all be on {where}, not {sorted(map(str, devices))}")
        self._device = next(iter(devices))
        self._ranges, self._slices = [], []  # per group; per parameter
        offset = 0
        for group in self.param_groups:
            start = offset
            for p in group["params"]:
                if p.dtype != torch.float32:
                    raise ValueError(f"{who}: parameters must be float32, not {p.dtype}")
                self._slices.append((offset, offset + p.numel()))
                offset += p.numel()
            self._ranges.append((start, offset))
        self._total = offset
        self._flat = self._zeros()
        self._grad = self._zeros()
        for p, (lo, hi) in zip(self._params(), self._slices):
            self._flat[lo:hi].copy_(p.data.reshape(-1))
            p.data = self._flat[lo:hi].view_as(p)

    def _zeros(self):
        return torch.zeros(self._total, device=self._device)

    def add_param_group(self, param_group):
        if hasattr(self, "_flat"):
            raise RuntimeError(f"{type(self).__name__}: parameter groups are fixed at construction (one flat buffer)")
        super().add_param_group(param_group)

    def _params(self):
        return [p for g in self.param_groups for p in g["params"]]

    def _take_gradients(self, closure):
        """Runs the closure (if any) and gathers this rank's gradients into the flat buffer; the loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._gather_gradients()
        return loss

    def _gather_gradients(self):
        for p, (lo, hi) in zip(self._params(), self._slices):
            if p.grad is None:
                self._grad[lo:hi].zero_()
            else:
                self._grad[lo:hi].copy_(p.grad.reshape(-1))

    def _average_gradients(self):
        """For a full-precision step: the gradients averaged over ranks (by DDP's hook, or here)."""
        if self._world > 1 and not self._gradients_averaged_by_hook:
            dist.all_reduce(self._grad, group=self._group)  # untagged: full precision
            self._grad.div_(self._world)

    def _average_tagged(self, buffer):
        """The tagged buffer averaged over ranks: one compressed all_reduce (which returns W × the average)."""
        if self._world > 1:
            dist.all_reduce(buffer, group=self._group)
            buffer.div_(self._world)

    def _error_state(self, required):
        workers, servers = ctypes.c_size_t(), ctypes.c_size_t()
        name = self._name.encode()
        if self._lib.onebit_tag_state_size(name, ctypes.byref(workers), ctypes.byref(servers)) != 0:
            if required:
                _check(self._lib, 1)  # a compressed call ran: its state must be there
            return torch.zeros(0), torch.zeros(0)  # no compressed call yet: no error feedback
        worker, server = torch.zeros(workers.value), torch.zeros(servers.value)
        _check(self._lib, self._lib.onebit_tag_state_save(name, _ptr(worker), _ptr(server)))
        return worker, server

    def _load_error_state(self, worker, server):
        worker, server = worker.contiguous(), server.contiguous()
        if worker.numel() or server.numel():
            _check(self._lib, self._lib.onebit_tag_state_load(self._name.encode(), _ptr(worker),
                                                             ctypes.c_size_t(worker.numel()), _ptr(server),
                                                             ctypes.c_size_t(server.numel())))

    def _state_dict_with(self, required, **extra):
        """torch's state_dict() plus "onebit": m, v, this rank's error feedback, who saved it, and `extra`."""
        state = torch.optim.Optimizer.state_dict(self)
        worker, server = self._error_state(required)
        state["onebit"] = dict(m=self._m.clone(), v=self._v.clone(), worker_error=worker, server_error=server,
                               world_size=self._world, rank=self._rank, **extra)
        return state

    def _split_state_dict(self, state_dict):
        """(torch's part, onebit's part) of a state_dict(), onebit's checked against this optimizer."""
        state_dict = dict(state_dict)
        saved = state_dict.pop("onebit")
        self._check_saved(saved)
        return state_dict, saved

    def _check_saved(self, saved):
        if saved["world_size"] != self._world or saved["rank"] != self._rank:
            raise ValueError(f"{self._who}.load_state_dict: saved by rank {saved['rank']} of {saved['world_size']}, "
                             f"loading into rank {self._rank} of {self._world}: each rank loads its own")
        if saved["m"].numel() != self._total:
            raise ValueError(f"{self._who}.load_state_dict: the checkpoint has {saved['m'].numel()} parameters, "
                             f"this optimizer {self._total}")

    @property
    def _wants_averaged_gradients(self):
        raise NotImplementedError


class OnebitAdam(_FlatOptimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, freeze_step=100,
                 process_group=None, name="onebit_adam/momentum", freeze_window=10, freeze_threshold=0.1,
                 max_freeze_step=None):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self._flatten("OnebitAdam", process_group)
        self._lib.onebit_adam_freeze_step.restype = ctypes.c_int64
        self._lib.onebit_adam_auto_freeze_decide.restype = ctypes.c_int64
        auto = freeze_step == "auto"
        if not auto and (not isinstance(freeze_step, int) or freeze_step < 0):
            raise ValueError(f"OnebitAdam: freeze_step must be a step (an int >= 0) or 'auto', not {freeze_step!r}")
        # ONEBIT_FREEZE_STEP tunes an existing script without editing it (docs/env.md); set, it
        # overrides "auto" too.
        self._freeze_step = self._lib.onebit_adam_freeze_step(ctypes.c_int64(-1 if auto else freeze_step))
        self._auto = None
        if self._freeze_step < 0:
            self._auto = _AutoFreeze(freeze_window, freeze_threshold, max_freeze_step or 0)
            if self._lib.onebit_adam_auto_freeze_measures(ctypes.byref(self._auto), ctypes.c_int64(0)) < 0:
                _check(self._lib, 1)
            self._freeze_step = _UNDECIDED
        self.variance_changes = []  # "auto": (step, change) of every measurement, the largest over ranks
        self._m = self._zeros()
        self._v = self._zeros()
        self._m_before = self._zeros()  # the momentum before a compressed step, to undo a failed one
        self._v_then = self._zeros() if self._auto is not None else None  # "auto": v at the last measurement
        self._name = name
        tag(self._m, name)
        self._step = 0

    def _config(self, group):
        return _AdamConfig(group["lr"], group["betas"][0], group["betas"][1], group["eps"], group["weight_decay"],
                           self._freeze_step)

    @property
    def _wants_averaged_gradients(self):
        return not self.compressing

    @property
    def compressing(self):
        """Whether the next step (and the backward pass before it) is in the compression stage."""
        answer = self._lib.onebit_adam_compressing(ctypes.byref(self._config(self.param_groups[0])),
                                                   ctypes.c_int64(self._step))
        if answer < 0:
            _check(self._lib, 1)
        return bool(answer)

    @property
    def freeze_step(self):
        """The first step of the compression stage; None while freeze_step="auto" has not fired."""
        return None if self._freeze_step == _UNDECIDED else self._freeze_step

    def _measure_variance(self, taken):
        """freeze_step="auto", after warmup step `taken`: measure, decide, and say so when it fires."""
        lib, step = self._lib, ctypes.c_int64(taken)
        if lib.onebit_adam_auto_freeze_measures(ctypes.byref(self._auto), step) == 1:
            if self._device.type == "cuda":
                moved = (self._v.double() - self._v_then.double()).abs().sum()
                total = self._v.double().abs().sum()
                change = float(moved / total) if total > 0 else (0.0 if moved == 0 else 1.0)
            else:
                value = ctypes.c_double()
                _check(lib, lib.onebit_adam_variance_change(_ptr(self._v), _ptr(self._v_then),
                                                            ctypes.c_size_t(self._v.numel()), ctypes.byref(value)))
                change = value.value
            if self._world > 1:
                largest = torch.tensor([change], dtype=torch.float64, device=self._device)
                dist.all_reduce(largest, op=dist.ReduceOp.MAX, group=self._group)  # untagged: exact
                change = float(largest.item())
            self._v_then.copy_(self._v)
            self.variance_changes.append((taken, change))
        else:
            change = float("inf")
        first = lib.onebit_adam_auto_freeze_decide(ctypes.byref(self._auto), step, ctypes.c_double(change))
        if first == -2:
            _check(lib, 1)
        if first >= 0:
            self._freeze_step = first
            if dist.get_rank(self._group) == 0:
                why = (f"the variance moved {change:.4f} < {self._auto.threshold} over the last {self._auto.window} steps"
                       if change < self._auto.threshold else f"max_freeze_step {self._auto.max_step}")
                print(f"onebit: OnebitAdam: freeze_step='auto' fired after step {taken}: {why}; "
                      f"compression from step {first}", file=sys.stderr, flush=True)

    @torch.no_grad()
    def step(self, closure=None):
        loss = self._take_gradients(closure)
        lib = self._lib
        if not self.compressing:
            self._average_gradients()
            for group, (lo, hi) in zip(self.param_groups, self._ranges):
                if self._device.type == "cuda":
                    _momentum_on_device(group, self._m[lo:hi], self._grad[lo:hi])
                    beta2 = group["betas"][1]
                    self._v[lo:hi].mul_(beta2).addcmul_(self._grad[lo:hi], self._grad[lo:hi], value=1.0 - beta2)
                    _apply_on_device(group, self._flat[lo:hi], self._m[lo:hi], self._v[lo:hi])
                    continue
                _check(lib, lib.onebit_adam_warmup_step(ctypes.byref(self._config(group)), _ptr(self._flat[lo:]),
                                                        _ptr(self._m[lo:]), _ptr(self._v[lo:]), _ptr(self._grad[lo:]),
                                                        ctypes.c_size_t(hi - lo)))
        else:
            self._m_before.copy_(self._m)
            for group, (lo, hi) in zip(self.param_groups, self._ranges):
                if self._device.type == "cuda":
                    _momentum_on_device(group, self._m[lo:hi], self._grad[lo:hi])
                    continue
                _check(lib, lib.onebit_adam_momentum_step(ctypes.byref(self._config(group)), _ptr(self._m[lo:]),
                                                          _ptr(self._grad[lo:]), ctypes.c_size_t(hi - lo)))
            try:
                self._average_tagged(self._m)  # compressed
            except RuntimeError:
                self._m.copy_(self._m_before)  # a failed step changes nothing
                raise
            for group, (lo, hi) in zip(self.param_groups, self._ranges):
                if self._device.type == "cuda":
                    _apply_on_device(group, self._flat[lo:hi], self._m[lo:hi], self._v[lo:hi])
                    continue
                _check(lib, lib.onebit_adam_apply_step(ctypes.byref(self._config(group)), _ptr(self._flat[lo:]),
                                                       _ptr(self._m[lo:]), _ptr(self._v[lo:]),
                                                       ctypes.c_size_t(hi - lo)))
        self._step += 1
        if self._auto is not None and self._freeze_step == _UNDECIDED:
            self._measure_variance(self._step - 1)  # the step is taken; this decides the next one's stage
        return loss

    def state_dict(self):
        return self._state_dict_with(self.compressing and self._step > self._freeze_step, step=self._step,
                                     freeze_step=self._freeze_step,
                                     v_then=None if self._v_then is None else self._v_then.clone(),
                                     variance_changes=list(self.variance_changes))

    def load_state_dict(self, state_dict):
        state_dict, saved = self._split_state_dict(state_dict)
        super().load_state_dict(state_dict)
        self._step = saved["step"]
        self._m.copy_(saved["m"])
        self._v.copy_(saved["v"])
        if (saved.get("v_then") is None) != (self._v_then is None):
            raise ValueError("OnebitAdam.load_state_dict: the checkpoint and this optimizer disagree on "
                             "freeze_step='auto'")
        if "freeze_step" in saved:
            self._freeze_step = saved["freeze_step"]
        if self._v_then is not None:
            self._v_then.copy_(saved["v_then"])
            self.variance_changes = list(saved["variance_changes"])
        self._load_error_state(saved["worker_error"], saved["server_error"])

    def close(self):
        """Untags the momentum (frees its error-feedback state)."""
        untag(self._m)


# The C core's rule (plugin/optim/onebit_adam.cc) as torch operations, for CUDA parameters.
def _momentum_on_device(group, m, g):
    beta1 = group["betas"][0]
    m.mul_(beta1).add_(g, alpha=1.0 - beta1)


def _apply_on_device(group, p, m, v):
    update = m / v.sqrt().add_(group["eps"])
    if group["weight_decay"]:
        update.add_(p, alpha=group["weight_decay"])
    p.add_(update, alpha=-group["lr"])


def ddp_comm_hook(state, bucket):
    """DDP communication hook for onebit's optimizers: register with
    ``model.register_comm_hook(optimizer, onebit.ddp_comm_hook)``.

    Steps that take averaged gradients (OnebitAdam's and OnebitLamb's warmup, ZeroOneAdam's
    variance steps): averages the bucket's gradients over ranks in full precision (as DDP's
    default). Every other step: no gradient allreduce here — the optimizer communicates what its
    rule says (momentum, a compressed gradient, u, or nothing) in its step — so the bucket keeps
    this rank's local gradient.
    """
    optimizer = state
    if not isinstance(optimizer, _FlatOptimizer):
        raise TypeError("onebit.ddp_comm_hook: register it with the optimizer (OnebitAdam, ZeroOneAdam or OnebitLamb) "
                        "as its state")
    optimizer._gradients_averaged_by_hook = True
    buffer = bucket.buffer()
    if not optimizer._wants_averaged_gradients:
        future = torch.futures.Future()
        future.set_result(buffer)
        return future
    world = dist.get_world_size(optimizer._group)
    work = dist.all_reduce(buffer, group=optimizer._group, async_op=True)
    return work.get_future().then(lambda f: f.value()[0].div_(world))
