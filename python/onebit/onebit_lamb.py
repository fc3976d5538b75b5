"""OnebitLamb: 1-bit LAMB (Li et al., 2021) as a torch.optim.Optimizer over onebit, with DeepSpeed's
parameter names and defaults (max_coeff, min_coeff, coeff_beta, factor_max, factor_min,
factor_threshold).

Each parameter tensor is a layer with its own trust ratio. Warmup (steps < freeze_step): LAMB on
gradients averaged over ranks in full precision; each layer's trust ratio is clipped to
[min_coeff, max_coeff] and its running average (coeff_beta) is what the compression stage keeps.
Then the variance is frozen, each layer's momentum is updated from the local gradient and scaled
to even out the layers' magnitudes, one flat tagged buffer is averaged compressed (one
dist.all_reduce per step), and each layer moves with its frozen coefficient times a factor read
from a fresh variance, kept within [factor_min, factor_max] and within factor_threshold of the last
step's. The arithmetic is onebit's C core (onebit_lamb_*; the rule in include/onebit/onebit.h and
docs/design/optimizer-rules.md), which the C++ shim include/onebit/onebit_lamb.hpp uses too.

With DDP, register onebit.ddp_comm_hook. Parameters live on the CPU, or all on one CUDA device
under libonebit-nccl-preload.so: the steps are then the C core's device steps (onebit_lamb_*_device:
the same rule and the same bits, the layers' norms summed in one order on both; all layers' norms
are read back to the host with one synchronization per step). state_dict() holds step, m, v,
v_fresh, every layer's scalars and this rank's error-feedback state: training resumes bit for bit
on the same rank of a job of the same size.
"""
from __future__ import annotations

import ctypes
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from . import _capi, _check
from ._core import _NOT_RECORDED, _core_fields, _core_text
from ._flat_optimizer import Params, _FlatOptimizer, _ptr

__all__ = ["OnebitLamb"]


class OnebitLamb(_FlatOptimizer):
    """1-bit LAMB (Li et al., 2021) with DeepSpeed's parameter names and defaults: LAMB (each
    parameter tensor a layer with its own trust ratio) with 1-bit Adam's two stages. A
    torch.optim.Optimizer over float32 parameters on the CPU or one CUDA device; docs/usage/optimizers.md,
    "ZeroOneAdam and OnebitLamb".

    What step() does in each stage:

    - warmup (steps before ``freeze_step``): LAMB on the gradients averaged over the ranks in full
      precision (by onebit.ddp_comm_hook under DDP); each layer's trust ratio clipped to
      [min_coeff, max_coeff], and its running average (coeff_beta) kept;
    - compression stage (from ``freeze_step`` on): the variance and the averaged trust ratios
      frozen; each layer's momentum updated from this rank's gradient and scaled so that the
      layers' magnitudes match, averaged in one compressed all_reduce of one flat tagged buffer;
      each layer moves with its frozen coefficient times a factor read off a fresh variance, kept
      within [factor_min, factor_max] and within factor_threshold of the last step's.

    ``lamb_coeffs`` lists the last step's coefficients (DeepSpeed's get_lamb_coeffs()).
    state_dict() carries every buffer, each layer's scalars and the error feedback; loaded into a
    job of the same size, training continues bit for bit.

    Args:
        params: the parameters to optimize, or parameter groups (dicts; each may set its own lr,
            betas, eps, weight_decay, max_coeff and min_coeff). float32, all on the CPU or all on
            one CUDA device (under libonebit-nccl-preload.so), all requiring grad; the groups are
            fixed at construction.
        lr: the learning rate (default 1e-3).
        freeze_step: the first step of the compression stage, an int >= 0 (default 100000,
            DeepSpeed's: scale it down for short runs). ONEBIT_FREEZE_STEP, when set, overrides it.
        betas: (beta1, beta2) for the momentum and the variance (default (0.9, 0.999)).
        eps: epsilon in the update's denominator (default 1e-8).
        weight_decay: weight decay added to the update before the trust ratio (default 0.0).
        max_coeff: the largest warmup trust ratio (default 10.0).
        min_coeff: the smallest warmup trust ratio (default 0.01).
        coeff_beta: the running average's coefficient for the trust ratio frozen at freeze_step
            (default 0.9). Higher: a smoother, slower average.
        factor_max: the largest compression-stage factor on a layer's frozen coefficient
            (default 4.0).
        factor_min: the smallest such factor (default 0.5).
        factor_threshold: the largest relative change of the factor from one step to the next
            (default 0.1). Lower: steadier steps, slower to follow the fresh variance.
        process_group: the ranks to average over (default None: the default process group); its
            backend must be "onebit", or gloo under libonebit-preload.so, or NCCL under
            libonebit-nccl-preload.so (CUDA parameters), for compression.
        name: the tag of the momentum buffer, which keys its error feedback (default
            "onebit_lamb/momentum"). The same on every rank; one per live optimizer.

    Raises:
        ValueError: parameters not float32, on mixed devices, on CUDA without the NCCL door's
            device steps, or requiring no grad; a bad freeze_step; a name another live optimizer
            holds.
        RuntimeError: the ranks disagree on the schedule or the parameters.
        OnebitError: the C core refuses a hyper-parameter (code INVALID_ARGUMENT).
    """

    def __init__(self, params: Params, lr: float = 1e-3, freeze_step: int = 100000,
                 betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                 max_coeff: float = 10.0, min_coeff: float = 0.01, coeff_beta: float = 0.9, factor_max: float = 4.0,
                 factor_min: float = 0.5, factor_threshold: float = 0.1,
                 process_group: Optional[dist.ProcessGroup] = None, name: str = "onebit_lamb/momentum") -> None:
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, max_coeff=max_coeff,
                                      min_coeff=min_coeff))
        self._flatten("OnebitLamb", process_group)
        if not isinstance(freeze_step, int) or freeze_step < 0:
            raise ValueError(f"OnebitLamb: freeze_step must be an int >= 0, not {freeze_step!r}")
        # ONEBIT_FREEZE_STEP, when set, overrides it (as for OnebitAdam; docs/env.md).
        self._freeze_step = self._lib.onebit_adam_freeze_step(ctypes.c_int64(freeze_step))
        self._factors = (coeff_beta, factor_max, factor_min, factor_threshold)
        for group in self.param_groups:
            if self._lib.onebit_lamb_compressing(ctypes.byref(self._config(group)), ctypes.c_int64(0)) < 0:
                _check(self._lib, 1)
        self._layer_groups = [group for group in self.param_groups for _ in group["params"]]
        self._layers = (_capi.LambLayer * len(self._slices))()
        for layer in self._layers:
            _check(self._lib, self._lib.onebit_lamb_layer_init(ctypes.byref(layer)))
        self._counts = (ctypes.c_size_t * len(self._slices))(*[hi - lo for lo, hi in self._slices])
        self._workspace = None  # on CUDA: the device steps' partial sums of every layer
        if self._device.type == "cuda":
            size = self._lib.onebit_lamb_workspace_size(self._counts, ctypes.c_size_t(len(self._counts)))
            self._workspace = torch.empty(size, dtype=torch.uint8, device=self._device)
        self._m = self._zeros()
        self._v = self._zeros()
        self._v_fresh = self._zeros()
        self._m_last = self._zeros()
        self._name = name
        self._step = 0
        self._agree_on_schedule()  # before tagging: a refused optimizer leaves no tag behind
        self._own_tag(self._m, name)

    def _agree_on_schedule(self, step=None):
        """The ranks agree on the fields the C core names (onebit_lamb_agreed_fields): at a load,
        with the checkpoint's `step`."""
        config = ctypes.byref(self._config(self.param_groups[0]))
        at = ctypes.c_int64(self._step if step is None else step)
        self._agree(**_core_fields(self._lib, "onebit_lamb_agreed_fields", config, at, self._total, len(self._layers)))

    def _config(self, group):
        coeff_beta, factor_max, factor_min, factor_threshold = self._factors
        return _capi.LambConfig(group["lr"], group["betas"][0], group["betas"][1], group["eps"], group["weight_decay"],
                       self._freeze_step, group["max_coeff"], group["min_coeff"], coeff_beta, factor_max, factor_min,
                       factor_threshold)

    @property
    def compressing(self) -> bool:
        """Whether the next step (and the backward pass before it) is in the compression stage."""
        return self._step >= self._freeze_step

    @property
    def freeze_step(self) -> int:
        """The first step of the compression stage."""
        return self._freeze_step

    @property
    def _steps_taken(self):
        return self._step

    @property
    def _current_variance(self):
        # After the warmup v is frozen and v_fresh (v at the freeze, then updated from the gradient
        # the averaged momentum implies) goes on tracking the gradients: the one torch Adam wants.
        return self._v_fresh if self._step >= self._freeze_step else self._v

    @property
    def _wants_averaged_gradients(self):
        return not self.compressing

    @property
    def _averaging_settled(self):
        return self.compressing  # the compression stage never ends

    @property
    def lamb_coeffs(self) -> List[float]:
        """Each layer's coefficient in the last step (DeepSpeed's get_lamb_coeffs())."""
        return [layer.lamb_coeff for layer in self._layers]

    # A layer is one parameter, so on the CPU each layer steps where its parameter lies (_FlatOptimizer's
    # in-place steps): the same operations over the same values as over the flat copy, bit for bit.
    _steps_in_place = True

    def _each_layer(self, gathered=True):
        """Each layer's config, state, offset in the flat buffers and length, where its parameters
        are (the parameter itself in place, else its range of the flat buffer) and its gradient (the
        flat buffer's when `gathered` there, else the parameter's own where the C core can read it)."""
        for j, (p, (lo, hi), group) in enumerate(zip(self._params(), self._slices, self._layer_groups)):
            params = _ptr(p) if self._in_place else _ptr(self._flat[lo:])
            grad = self._grad[lo:] if gathered else self._local_gradient(p, lo, hi)
            yield (ctypes.byref(self._config(group)), ctypes.byref(self._layers[j]), lo, ctypes.c_size_t(hi - lo),
                   params, _ptr(grad))

    def _all_layers(self, name, *arrays, step=None):
        """On CUDA, a step that needs the layers' norms (warmup, apply) over every layer at once: its
        _device form reads all the layers' sums back with one synchronization of the stream."""
        configs = (_capi.LambConfig * len(self._layers))(*[self._config(group) for group in self._layer_groups])
        before = () if step is None else (ctypes.c_int64(step),)
        self._core_step(name, configs, self._layers, self._counts, ctypes.c_size_t(len(self._layers)), *before,
                        *arrays, *self._workspace_args())

    def _workspace_args(self):
        """The workspace the _device steps that sum take (its address and bytes); none on the CPU."""
        if self._workspace is None:
            return ()
        return _ptr(self._workspace), ctypes.c_size_t(self._workspace.numel())

    def _flat_step(self):
        cuda = self._device.type == "cuda"
        if not self.compressing:
            gathered = self._averaged_gradients_gathered()
            if cuda:
                self._all_layers("onebit_lamb_warmup_steps", _ptr(self._flat), _ptr(self._m), _ptr(self._v),
                                 _ptr(self._v_fresh), _ptr(self._grad), step=self._step)
            else:
                for config, layer, lo, n, params, grad in self._each_layer(gathered):
                    self._core_step("onebit_lamb_warmup_step", config, layer, ctypes.c_int64(self._step), params,
                                    _ptr(self._m[lo:]), _ptr(self._v[lo:]), _ptr(self._v_fresh[lo:]), grad, n)
        else:
            layers_before = bytes(self._layers)
            if len(self._layers) and self._layers[0].scaling_coeff == 0:  # the first compression step
                self._report_freeze(self._step, self._v)
                self._core_step("onebit_lamb_scaling_coeffs", _ptr(self._m), self._counts,
                                ctypes.c_size_t(len(self._layers)), self._layers, *self._workspace_args())
            self._warn_if_no_local_gradient()
            for config, layer, lo, n, _, grad in self._each_layer(gathered=not self._in_place):
                self._core_step("onebit_lamb_momentum_step", config, layer, _ptr(self._m[lo:]),
                                _ptr(self._m_last[lo:]), grad, n)
            try:
                self._average_tagged(self._m, self._step, f"compression stage since step {self._freeze_step}")
            except RuntimeError:
                self._m.copy_(self._m_last)  # a failed step changes nothing
                ctypes.memmove(self._layers, layers_before, len(layers_before))
                raise
            if cuda:
                self._all_layers("onebit_lamb_apply_steps", _ptr(self._flat), _ptr(self._m), _ptr(self._m_last),
                                 _ptr(self._v), _ptr(self._v_fresh))
            else:
                for config, layer, lo, n, params, _ in self._each_layer():
                    self._core_step("onebit_lamb_apply_step", config, layer, params, _ptr(self._m[lo:]),
                                    _ptr(self._m_last[lo:]), _ptr(self._v[lo:]), _ptr(self._v_fresh[lo:]), n)
        self._step += 1

    def _onebit_state(self):
        return self._rank_state(self._step > self._freeze_step, step=self._step, freeze_step=self._freeze_step,
                                v_fresh=self._v_fresh.clone(),
                                layers=[{name: getattr(layer, name) for name, _ in _capi.LambLayer._fields_}
                                        for layer in self._layers])

    def _schedule_refusal(self, part):
        if len(part["layers"]) != len(self._layers):
            return f"the checkpoint has {len(part['layers'])} layers, this optimizer {len(self._layers)}"
        saved = part.get("freeze_step")  # None: not recorded, this optimizer's
        saved = ctypes.c_int64(_NOT_RECORDED if saved is None else saved)
        return _core_text(self._lib, "onebit_lamb_resume_refusal", ctypes.byref(self._config(self.param_groups[0])),
                          ctypes.c_int64(part["step"]), saved) or None

    def load_state_dict(self, state_dict: Dict[str, Any], reset_error_feedback: bool = False) -> None:
        """Resumes from a state_dict() (a collective: every rank loads), checked on every rank
        before anything changes. Error feedback loads only into the layout (ranks, ranks per host)
        it was made in; reset_error_feedback=True drops it (rank 0 warns once)."""
        state_dict, saved = self._split_state_dict(state_dict, reset_error_feedback)
        self._agree_on_schedule(step=saved["step"])  # before anything changes
        super().load_state_dict(state_dict)
        self._load_error_state(saved["worker_error"], saved["server_error"])
        self._step = saved["step"]
        self._m.copy_(saved["m"])  # in place: the tag holds its address
        self._v.copy_(saved["v"])
        self._v_fresh.copy_(saved["v_fresh"])
        for layer, values in zip(self._layers, saved["layers"]):
            for name, value in values.items():
                setattr(layer, name, value)
        self._loaded(saved)

    def close(self) -> None:
        """Untags the momentum (frees its error-feedback state) and frees its name for another
        optimizer. Dropping the optimizer does the same; calling it twice does nothing."""
        self._drop_tag()
