"""_RankExchange: what onebit's optimizers exchange with the other ranks besides the compressed
call itself — the fields every rank must hold alike (judged and worded by the C core), every
rank's row of integers, the full-precision gradient average, the tagged buffer's compressed
average with the step settings it carries, and the warnings about what the group's doors did to
them. A mixin of _FlatOptimizer, which sets up what it reads (_flatten). Private."""
from __future__ import annotations

import ctypes
import zlib
from typing import Any, Callable

import torch
import torch.distributed as dist

from . import _check, stats
from ._errors import OnebitError
from ._gloo_threads import returned_by_gloo
from ._logging import logger

_AGREED_AT_CONSTRUCTION = 0  # onebit_agreed_at_t


class _RankExchange:
    """The exchanges with the other ranks of _FlatOptimizer's process group."""

    # What _FlatOptimizer sets up, declared for type checkers (annotations only: nothing at runtime).
    _lib: Any
    _who: str
    _name: str
    _group: Any
    _world: int
    _rank: int
    _device: torch.device
    _total: int
    _grad: torch.Tensor
    _in_place: bool
    _checked_for_ddp: bool
    _checked_compression: bool
    _gradients_averaged_by_hook: bool
    _compressed: bool
    _settings_keys: Any
    _settings_key_array: Any
    defaults: Any
    param_groups: Any
    _gather_gradients: Callable[..., None]
    _warn_if_no_local_gradient: Callable[[], None]

    def _agree(self, **fields):
        """Every rank's integer `fields` compared in one small exact all_reduce (each rank writes its
        row of a world x fields table), judged and worded by the C core (onebit_ranks_disagreement):
        a difference is an OnebitError (MISMATCH) on every rank naming the field and each rank's
        value — before a disagreement becomes one rank in a compressed all_reduce and another in a
        full-precision one, waiting for each other until the timeout."""
        if self._world == 1:
            return
        # world_size first: torch's rendezvous meets a different WORLD_SIZE first. The shapes' CRC
        # last: ranks whose parameters have the same total in other shapes (other models) differ
        # only there.
        fields = dict(world_size=self._world, **fields, parameter_shapes_crc32=self._shapes_crc32())
        names = list(fields)
        rows = self._every_rank([int(fields[n]) for n in names])
        table = (ctypes.c_int64 * (len(rows) * len(names)))(*[value for row in rows for value in row])
        refusal = self._core_text("onebit_ranks_disagreement", self._who.encode(),
                                  (ctypes.c_char_p * len(names))(*[n.encode() for n in names]), len(names), table,
                                  len(rows), _AGREED_AT_CONSTRUCTION)
        if refusal:
            raise OnebitError(OnebitError.MISMATCH, refusal)

    def _shapes_crc32(self):
        """A CRC-32 of every group's parameters' shapes, in order: the same on every rank that holds
        the same model."""
        shapes = [[tuple(p.shape) for p in group["params"]] for group in self.param_groups]
        return zlib.crc32(repr(shapes).encode())

    def _every_rank(self, values):
        """Every rank's row of integers (`values` is this rank's), in one small exact all_reduce of a
        world x len(values) table in which each rank fills its own row (alone: its row, no call)."""
        if self._world == 1:
            return [list(values)]
        table = torch.zeros(self._world, len(values), dtype=torch.int64)
        table[self._rank] = torch.tensor(values, dtype=torch.int64)
        table = table.to(self._device)
        with returned_by_gloo(table):  # the callers raise on what it shows, and the program may end at once
            dist.all_reduce(table, group=self._group)  # untagged: exact
        return table.cpu().tolist()

    def _step_failure(self, error, step, stage):
        """The error of a failed compressed all_reduce, with the step, its stage, and for NaN or Inf
        the likely causes, in the C core's words (onebit_step_failure_text). An OnebitError (the
        onebit backend's) stays one, with its code; another door's error says NaN or Inf in its text."""
        code = error.code if isinstance(error, OnebitError) else (
            OnebitError.NUMERIC_ERROR if "NaN or Inf" in str(error) else OnebitError.REMOTE_ERROR)
        text = self._core_text("onebit_step_failure_text", self._who.encode(), ctypes.c_int64(step), stage.encode(),
                               code, str(error).encode())
        return OnebitError(error.code, text) if isinstance(error, OnebitError) else RuntimeError(text)

    def _warn_if_averaged_twice(self, local):
        """First full-precision step without the DDP hook: if the gradients came in already equal on
        every rank (after our average, each rank's own equals it), DDP averaged them — without
        onebit.ddp_comm_hook, which then goes on averaging fp32 gradients in the compression stage."""
        self._checked_for_ddp = True
        if self._rank == 0 and torch.allclose(local, self._grad, rtol=1e-6, atol=0) and bool(local.abs().sum() > 0):
            ring = 2 * (self._world - 1) / self._world * 4 * self._total
            logger.warning(f"{self._who}: the gradients arrived already averaged over the ranks: "
                           "DistributedDataParallel without onebit.ddp_comm_hook? Training stays correct, but DDP "
                           f"keeps averaging {ring / 1e6:.1f} MB of fp32 gradients per rank and step in the "
                           "compression stage, which onebit's compression is meant to replace. Register "
                           "model.register_comm_hook(optimizer, onebit.ddp_comm_hook).")

    def _averaged_gradients_gathered(self):
        """For a step that takes averaged gradients: averages them and says where they are. True:
        in the flat gradient buffer (the flat path, or in place when this step averages them
        itself: gathered there first). False: in place, where they lie (DDP's hook or a world of
        one has averaged them)."""
        gathered = not self._in_place or (self._world > 1 and not self._gradients_averaged_by_hook)
        if self._in_place and gathered:
            self._gather_gradients()
        else:
            self._warn_if_no_local_gradient()
        self._average_gradients()
        return gathered

    def _average_gradients(self):
        """For a full-precision step: the gradients averaged over ranks (by DDP's hook, or here)."""
        if self._world > 1 and not self._gradients_averaged_by_hook:
            local = None if self._checked_for_ddp else self._grad.clone()
            dist.all_reduce(self._grad, group=self._group)  # untagged: full precision
            self._grad.div_(self._world)
            if local is not None:
                self._warn_if_averaged_twice(local)

    def _average_tagged(self, buffer, step, stage):
        """The tagged buffer averaged over ranks: one compressed all_reduce (which returns W × the
        average). A failure is raised with the step and stage (_step_failure). The first one also
        checks that onebit took the call (_warn_if_not_compressed)."""
        if self._world > 1:
            before = None if self._checked_compression else stats()["compressed_calls"]
            averages = self._backend_averages(buffer)
            self._share_step_settings(step, stage)
            try:
                if averages:
                    dist.all_reduce(buffer, op=dist.ReduceOp.AVG, group=self._group)
                else:
                    dist.all_reduce(buffer, group=self._group)
            except RuntimeError as error:
                raise self._step_failure(error, step, stage) from error
            if not averages:
                buffer.div_(self._world)
            self._compressed = True
            if before is not None:
                self._warn_if_not_compressed(before, step, buffer)

    def _share_step_settings(self, step, stage):
        """What every rank must share for this compressed all_reduce — each group's numeric
        hyper-parameters (those the optimizer's defaults name: lr, betas, eps, weight decay), the
        step and the stage — handed to the C core with the tag (onebit_tag_set_step_settings),
        which compares them across ranks inside the call, at no extra message: a rank whose
        scheduler stepped alone, or skipped where GradScaler lowered its per-rank scale, fails the
        call on every rank with nothing changed, instead of the replicas drifting apart. Not on the
        device path, which does not compare them."""
        if self._device.type != "cpu":
            return
        keys, values = [], []
        try:
            for g, group in enumerate(self.param_groups):
                for key in sorted(self.defaults):
                    value = group.get(key)
                    items = tuple(value) if isinstance(value, (tuple, list)) else (value,)
                    for i, item in enumerate(items):
                        if isinstance(item, torch.Tensor) and item.numel() == 1:
                            item = item.item()
                        if isinstance(item, (int, float)) and not isinstance(item, bool):
                            keys.append(f"group {g} {key}" + (f"[{i}]" if len(items) > 1 else ""))
                            values.append(float(item))
        except Exception as error:  # noqa: BLE001 — said as this rank's settings, not raised before the collective
            keys, values = [f"settings unreadable: {type(error).__name__}: {error}"], [0.0]
        keys += ["step", f"stage: {stage}"]
        values += [float(step), 0.0]
        if keys != self._settings_keys:
            self._settings_keys = keys
            self._settings_key_array = (ctypes.c_char_p * len(keys))(*(key.encode() for key in keys))
        _check(self._lib, self._lib.onebit_tag_set_step_settings(
            self._name.encode(), self._settings_key_array, (ctypes.c_double * len(values))(*values), len(values)))

    def _backend_averages(self, buffer):
        """Whether this all_reduce can return the average itself (op AVG), saving the pass of div_
        over the buffer: a tagged buffer on the onebit backend (which gives AVG to onebit; gloo, which
        gets untagged buffers there and everything under the preload, has no AVG) with a power-of-two
        world — where the compressed SUM's ±(scale x W) divided by W is exactly AVG's ±scale, so the
        values are bit for bit those of SUM and div_. Asked at every call: a closed optimizer's buffer
        is no longer tagged."""
        if not hasattr(self, "_averaging_backend"):
            self._averaging_backend = (self._world & (self._world - 1) == 0 and self._device.type == "cpu"
                                       and dist.get_backend(self._group) == "onebit")
        import onebit
        return self._averaging_backend and onebit._tagged_dtype(buffer) is not None

    def _warn_if_not_compressed(self, before, step, buffer):
        """The first compressed all_reduce: when onebit's count did not move, the group runs neither
        the onebit backend nor a front door, and every "compressed" step sends fp32 — said once."""
        self._checked_compression = True
        if self._rank == 0 and stats()["compressed_calls"] == before:
            ring = 2 * (self._world - 1) / self._world * buffer.numel() * buffer.element_size()
            logger.warning(f"{self._who}: step {step}'s all_reduce of the tagged buffer was not compressed: "
                           "this process group runs neither the onebit backend nor libonebit-preload.so, so every "
                           f"step of the compression stage sends {ring / 1e6:.1f} MB of fp32 per rank instead of 1 "
                           "bit an element. Use dist.init_process_group(\"onebit\") after onebit.register_backend() "
                           "(pip's torch) or LD_PRELOAD=libonebit-preload.so with the gloo backend "
                           "(docs/usage/pytorch.md).")
