"""OnebitAdam: 1-bit Adam (Tang et al., 2021) as a torch.optim.Optimizer over onebit.

Warmup (steps < freeze_step): Adam on gradients averaged over ranks in full precision. Then the
variance is frozen, the momentum is updated from the *local* gradient, allreduced compressed (one
flattened, tagged buffer: one dist.all_reduce per step, taken by libonebit-preload.so) and used with
the frozen variance. The arithmetic is onebit's C core (onebit_adam_*), shared with C++ trainers.

First version: all parameters share the first param group's hyper-parameters; float32 CPU tensors;
no DDP comm hook yet. state_dict() holds step, m, v and this rank's error-feedback state (onebit's
anchors keep none): save one per rank, load each into the same rank of a job of the same size, and
training continues bit for bit.
"""
import ctypes
import os

import torch
import torch.distributed as dist

from . import _library, _check, tag, untag

__all__ = ["OnebitAdam"]


class _AdamConfig(ctypes.Structure):
    _fields_ = [("lr", ctypes.c_float), ("beta1", ctypes.c_float), ("beta2", ctypes.c_float),
                ("eps", ctypes.c_float), ("weight_decay", ctypes.c_float), ("freeze_step", ctypes.c_int64)]


def _ptr(tensor):
    return ctypes.c_void_p(tensor.data_ptr())


class OnebitAdam(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, freeze_step=100,
                 process_group=None, name="onebit_adam/momentum", average_gradients=True):
        # ONEBIT_FREEZE_STEP tunes an existing script without editing it.
        override = int(os.environ.get("ONEBIT_FREEZE_STEP", "-1"))  # documented in docs/env.md
        freeze_step = override if override >= 0 else freeze_step
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self._lib = _library()
        self._group = process_group
        self._world = dist.get_world_size(process_group)
        self._freeze_step = freeze_step
        self._average_gradients = average_gradients
        self._params = [p for g in self.param_groups for p in g["params"]]
        for p in self._params:
            if p.dtype != torch.float32 or p.device.type != "cpu":
                raise ValueError(f"OnebitAdam: parameters must be float32 CPU tensors, not {p.dtype} on {p.device}")
        total = sum(p.numel() for p in self._params)
        # One flat buffer each for parameters, gradients, momentum and variance; the parameters
        # become views into theirs, so the C core updates them in place.
        self._flat = torch.zeros(total)
        self._grad = torch.zeros(total)
        self._m = torch.zeros(total)
        self._v = torch.zeros(total)
        offset = 0
        for p in self._params:
            n = p.numel()
            self._flat[offset:offset + n].copy_(p.data.reshape(-1))
            p.data = self._flat[offset:offset + n].view_as(p)
            offset += n
        self._name = name
        tag(self._m, name)
        self._step = 0

    def _config(self):
        g = self.param_groups[0]
        return _AdamConfig(g["lr"], g["betas"][0], g["betas"][1], g["eps"], g["weight_decay"], self._freeze_step)

    @property
    def compressing(self):
        return self._step >= self._freeze_step

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        offset = 0
        for p in self._params:
            n = p.numel()
            if p.grad is None:
                self._grad[offset:offset + n].zero_()
            else:
                self._grad[offset:offset + n].copy_(p.grad.reshape(-1))
            offset += n
        config = self._config()
        n = ctypes.c_size_t(self._flat.numel())
        if not self.compressing:
            if self._average_gradients and self._world > 1:
                dist.all_reduce(self._grad, group=self._group)  # untagged: full precision
                self._grad.div_(self._world)
            _check(self._lib, self._lib.onebit_adam_warmup_step(ctypes.byref(config), _ptr(self._flat), _ptr(self._m),
                                                               _ptr(self._v), _ptr(self._grad), n))
        else:
            _check(self._lib, self._lib.onebit_adam_momentum_step(ctypes.byref(config), _ptr(self._m),
                                                                 _ptr(self._grad), n))
            if self._world > 1:
                dist.all_reduce(self._m, group=self._group)  # tagged: compressed, W x the average
                self._m.div_(self._world)
            _check(self._lib, self._lib.onebit_adam_apply_step(ctypes.byref(config), _ptr(self._flat), _ptr(self._m),
                                                              _ptr(self._v), n))
        self._step += 1
        return loss

    def state_dict(self):
        state = super().state_dict()
        worker, server = self._error_state()
        state["onebit"] = {"step": self._step, "m": self._m.clone(), "v": self._v.clone(),
                           "worker_error": worker, "server_error": server,
                           "world_size": self._world, "rank": dist.get_rank(self._group)}
        return state

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        saved = state_dict.pop("onebit")
        if saved["world_size"] != self._world or saved["rank"] != dist.get_rank(self._group):
            raise ValueError(f"OnebitAdam.load_state_dict: saved by rank {saved['rank']} of {saved['world_size']}, "
                             f"loading into rank {dist.get_rank(self._group)} of {self._world}: each rank loads its own")
        super().load_state_dict(state_dict)
        self._step = saved["step"]
        self._m.copy_(saved["m"])
        self._v.copy_(saved["v"])
        worker, server = saved["worker_error"].contiguous(), saved["server_error"].contiguous()
        _check(self._lib, self._lib.onebit_tag_state_load(self._name.encode(), _ptr(worker),
                                                         ctypes.c_size_t(worker.numel()), _ptr(server),
                                                         ctypes.c_size_t(server.numel())))

    def _error_state(self):
        workers, servers = ctypes.c_size_t(), ctypes.c_size_t()
        name = self._name.encode()
        _check(self._lib, self._lib.onebit_tag_state_size(name, ctypes.byref(workers), ctypes.byref(servers)))
        worker, server = torch.zeros(workers.value), torch.zeros(servers.value)
        _check(self._lib, self._lib.onebit_tag_state_save(name, _ptr(worker), _ptr(server)))
        return worker, server

    def close(self):
        """Untags the momentum (frees its error-feedback state)."""
        untag(self._m)
