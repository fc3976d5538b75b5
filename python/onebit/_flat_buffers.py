"""_FlatBuffers: how onebit's optimizers hold the parameters and gradients they step — one flat fp32
buffer of every parameter and one of their gradients, filled from the parameters as they are at
each step and written back after it, or, for an elementwise rule on the CPU, each parameter
updated where it lies (the pieces). A mixin of _FlatOptimizer, which sets up what it reads
(_flatten). Private."""
from __future__ import annotations

from typing import Any, Callable

import torch

from ._core import _ptr
from ._logging import logger


class _FlatBuffers:
    """The flat buffers and the parameters' own storage, as _FlatOptimizer's steps read and write them."""

    # What _FlatOptimizer sets up, declared for type checkers (annotations only: nothing at runtime).
    _who: str
    _world: int
    _device: torch.device
    _total: int
    _flat: torch.Tensor
    _grad: torch.Tensor
    _slices: list
    _ranges: list
    _in_place: bool
    _warned_no_gradient: bool
    _gradients_averaged_by_hook: bool
    param_groups: Any
    _params: Callable[[], list]

    def _zeros(self):
        return torch.zeros(self._total, device=self._device)

    def _in_place_parameters(self):
        """Whether this step can update the parameters where they are: on the CPU, every parameter a
        contiguous float32 CPU tensor of its size, no two sharing memory (tied storage goes through
        the flat buffer, as before: one update, the last copy back wins). Otherwise the flat path,
        which also names a parameter that was moved, cast or resized."""
        if self._device.type != "cpu" or _version_bump() is None:
            return False  # without torch's version bump (torch < 2.1) the copy back is what tells autograd
        spans = []
        for p, (lo, hi) in zip(self._params(), self._slices):
            if (type(p.data) is not torch.Tensor or p.device.type != "cpu" or p.dtype != torch.float32
                    or p.numel() != hi - lo or not p.is_contiguous()):
                return False  # tensor subclasses, other devices and dtypes, strided views: the flat path
            if hi > lo:
                spans.append((p.data_ptr(), p.data_ptr() + 4 * (hi - lo)))
        spans.sort()
        return all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))

    def _pieces(self, group_index):
        """Where group `group_index`'s update runs: (the parameters' memory, its offset in the flat
        buffers, its length, its parameter or None) — the flat buffer's range of the group, or, in
        place, each of its parameters."""
        lo, hi = self._ranges[group_index]
        if not self._in_place:
            return [(_ptr(self._flat[lo:]), lo, hi - lo, None)]
        first = sum(len(g["params"]) for g in self.param_groups[:group_index])
        return [(_ptr(p), at, end - at, p)
                for p, (at, end) in zip(self.param_groups[group_index]["params"], self._slices[first:])]

    def _local_gradient(self, p, lo, hi):
        """This rank's gradient of `p` where it lies, when the C core can read it there; else copied
        into the flat gradient buffer (None: zeros), as _gather_gradients does."""
        g = p.grad
        if (g is not None and g.device.type == "cpu" and g.dtype == torch.float32 and g.is_contiguous()
                and g.numel() == hi - lo):
            return g
        if g is None:
            return self._grad[lo:hi].zero_()
        return self._grad[lo:hi].copy_(g.reshape(-1))

    def _warn_if_no_gradient(self, without_grad):
        if without_grad == len(self._slices) and not self._warned_no_gradient:
            self._warned_no_gradient = True
            logger.warning(f"{self._who}: step() found no gradient on any of its {without_grad} parameters: "
                           "were they replaced after the optimizer was made (load_state_dict(assign=True), a new "
                           "model)? Make the optimizer from the parameters the model trains.")

    def _read_parameters(self, into=None):
        """The parameters as they are now — wherever a framework has put their storage since (a
        .to() copy, swap_tensors) — into the flat buffer (or the flat buffer `into`). A parameter
        moved to another device, cast, or resized is an error naming it."""
        into = self._flat if into is None else into
        for index, (p, (lo, hi)) in enumerate(zip(self._params(), self._slices)):
            moved = p.device.type != self._device.type or (p.device.type == "cuda" and p.device != self._device)
            if moved or p.dtype != torch.float32 or p.numel() != hi - lo:
                raise RuntimeError(f"{self._who}: parameter {index} is now {p.dtype} on {p.device} with {p.numel()} "
                                   f"elements; the optimizer was made for float32 on {self._device} with {hi - lo}: "
                                   "make the optimizer after the model is moved or cast")
            into[lo:hi].copy_(p.reshape(-1))

    def _write_parameters(self):
        for p, (lo, hi) in zip(self._params(), self._slices):
            p.copy_(self._flat[lo:hi].view_as(p))

    def _gather_gradients(self, into=None):
        """This rank's gradients into the flat gradient buffer (or the flat buffer `into`; None:
        zeros); none at all is a warning."""
        into = self._grad if into is None else into
        without_grad = 0
        for p, (lo, hi) in zip(self._params(), self._slices):
            if p.grad is None:
                into[lo:hi].zero_()
                without_grad += 1
            else:
                into[lo:hi].copy_(p.grad.reshape(-1))
        self._warn_if_no_gradient(without_grad)

    def _warn_if_no_local_gradient(self):
        """In place (where step() gathered no gradient): warns if no parameter has one."""
        if self._in_place:
            self._warn_if_no_gradient(sum(p.grad is None for p in self._params()))


def _version_bump():
    """torch's call that bumps a tensor's version counter (torch >= 2.1), or None."""
    return getattr(getattr(torch.autograd, "graph", None), "increment_version", None)


def _increment_version(tensor):
    """Bumps `tensor`'s version counter (written in place by the C core), as an in-place torch
    operation would, so that autograd refuses a graph that saw the old values. Only called where
    torch has the call: without it the step takes the flat path, whose copy back bumps it."""
    _version_bump()(tensor)
