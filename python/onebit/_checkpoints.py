"""_Checkpoints: the checkpoint half of onebit's optimizers, a mixin of _FlatOptimizer. It covers:
state_dict() with every rank's part (consolidate_state_dict() gathers them to the saving rank, what
every rank holds alike kept once), load_state_dict()'s checks, agreed by every rank before
anything changes, the tag's error feedback saved and loaded through the C core, and
adam_state_dict() for a run that goes on with torch's Adam. Private.

It uses what _FlatOptimizer sets up: _lib, _who, _name, _world, _rank, _group, _device, _total,
_m, _v, _slices, _compressed, _consolidated, _warned_rank_state, _every_rank(), _shapes_crc32(),
_params(), _refuse_changed_parameters(), and each optimizer's _onebit_state(),
_schedule_refusal() and _steps_taken.
"""
from __future__ import annotations

import collections
import ctypes
import hashlib
import os
import pickle
import struct
from typing import Any, Callable, Dict, Union

import torch
import torch.distributed as dist

from . import _check
from ._checkpoint_files import read_part, write_job, write_part
from ._core import _ptr
from ._errors import OnebitError
from ._logging import logger

_SENT = "sent"  # _consolidated on a rank whose part went to the saving rank
_ERROR_FEEDBACK = ("worker_error", "server_error")  # a part's own error feedback: never kept once for all
_PER_PARAMETER = ("v", "v_fresh", "u", "params_at_sync", "v_then")  # besides m: a float each parameter


class _Checkpoints:
    """The checkpoint methods of _FlatOptimizer (the module docstring says what they need of it)."""

    # What _FlatOptimizer sets up, declared for type checkers (annotations only: nothing at runtime).
    _lib: Any
    _who: str
    _name: str
    _world: int
    _rank: int
    _group: Any
    _device: torch.device
    _total: int
    _m: torch.Tensor
    _v: torch.Tensor
    _slices: list
    _compressed: bool
    _consolidated: Any  # (shared, parts) on the saving rank, _SENT on the others, else None
    _warned_rank_state: bool
    _every_rank: Callable[[list], list]
    _shapes_crc32: Callable[[], int]
    _params: Callable[[], list]
    _refuse_changed_parameters: Callable[..., None]
    load_state_dict: Callable[..., None]

    def _error_state(self, required):
        workers, servers = ctypes.c_size_t(), ctypes.c_size_t()
        name = self._name.encode()
        result = self._lib.onebit_tag_state_size(name, ctypes.byref(workers), ctypes.byref(servers))
        if result != 0:
            if required:
                _check(self._lib, result)  # a compressed call ran: its state must be there
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

    def _rank_state(self, required, **extra):
        """This rank's part of a checkpoint: m, v, its error feedback, who it is, and `extra`."""
        worker, server = self._error_state(required)
        return dict(m=self._m.clone(), v=self._v.clone(), worker_error=worker, server_error=server,
                    world_size=self._world, rank=self._rank, compressed=self._compressed, **extra)

    def _onebit_state(self):
        """This rank's part (_rank_state with what the optimizer keeps besides m and v)."""
        raise NotImplementedError

    def _same_on_every_rank(self, part):
        """Whether every rank's part is this one: true until the first compressed all_reduce (every
        step before it took averaged gradients; the error feedback is all zeros)."""
        return not part["compressed"]

    def consolidate_state_dict(self, to: int = 0) -> None:
        """Every rank's part of the checkpoint (its error feedback above all, which is its own) gathered
        to rank `to` of the optimizer's group, so that the state_dict() rank `to` takes before the
        next step resumes every rank — what HF Trainer, Accelerate and Lightning need, which save the
        optimizer from rank 0 only. A collective: every rank calls it (torch's
        ZeroRedundancyOptimizer has the same call); onebit.integrations call it before each save.

        What every rank holds bit for bit alike (m, v, the counters: every rank applies the same
        averaged update) is kept once, rank `to`'s: the ranks compare each field's digest in one
        small all_reduce, and each sends rank `to` only its error feedback and the fields that
        differ on some rank (ZeroOneAdam's m and u between syncs). The parts travel one at a time,
        rank by rank to `to`, their tensors sent as they are into tensors of their own (CPU tensors
        once there; under NCCL through this optimizer's device): rank `to` holds its own part and
        the others' error feedback, what the file holds, and no copy on the way."""
        shared, own = self._shared_and_own()
        if self._rank != to:
            self._send_part(own, to)
            self._consolidated = _SENT
            return
        self._consolidated = (shared, [own if r == to else self._receive_part(r) for r in range(self._world)])

    def _shared_and_own(self):
        """(what every rank holds alike, what is this rank's own) of this rank's part, on the CPU: the
        fields whose digests all ranks share, and the error feedback with the fields that differ on
        some rank. A collective (one small all_reduce of the digests)."""
        part = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in self._onebit_state().items()}
        keys = sorted(part)  # the same on every rank: the optimizer's settings are agreed at construction
        rows = self._every_rank([bits for k in keys for bits in _digest(part[k])])
        differing = {k for j, k in enumerate(keys) if len({(row[2 * j], row[2 * j + 1]) for row in rows}) > 1}
        own = {k: v for k, v in part.items() if k in differing or k in _ERROR_FEEDBACK}
        return {k: v for k, v in part.items() if k not in own}, own

    def _global_rank(self, rank):
        return rank if self._group is None else dist.get_global_rank(self._group, rank)

    def _send_part(self, part, to):
        """`part` to rank `to` of the group: its other fields pickled with each tensor's shape and
        dtype in their place, then each tensor as it is (point to point on the group's own backend,
        on this optimizer's device; torch 1.13 has no send_object_list)."""
        tensors = [v for v in part.values() if isinstance(v, torch.Tensor)]
        self._send_object({k: _TensorOf(v.shape, v.dtype) if isinstance(v, torch.Tensor) else v
                           for k, v in part.items()}, to)
        for tensor in tensors:
            if tensor.numel():  # gloo sends no empty tensor; the receiver makes it from its shape
                dist.send(tensor.contiguous().to(self._device), self._global_rank(to), group=self._group)

    def _receive_part(self, rank, buffers=None):
        """Rank `rank`'s part, as _send_part sent it: its tensors received into tensors of their own,
        or, given `buffers` (a dict, kept by the caller from rank to rank), into the same memory
        for every rank — the job file's save holds one received part, whatever the allocator keeps."""
        part = self._receive_object(rank)
        for key, value in part.items():
            if isinstance(value, _TensorOf):
                tensor = _buffer(buffers, key, value, self._device)
                if tensor.numel():
                    dist.recv(tensor, self._global_rank(rank), group=self._group)
                part[key] = tensor if tensor.device.type == "cpu" else _buffer(buffers, key + "@cpu", value,
                                                                               "cpu").copy_(tensor)
        return part

    def _send_object(self, value, to):
        """`value` pickled to rank `to` of the group: its length, then its bytes."""
        data = torch.frombuffer(bytearray(pickle.dumps(value)), dtype=torch.uint8)
        dist.send(torch.tensor([data.numel()], dtype=torch.int64, device=self._device), self._global_rank(to),
                  group=self._group)
        dist.send(data.to(self._device), self._global_rank(to), group=self._group)

    def _receive_object(self, rank):
        size = torch.zeros(1, dtype=torch.int64, device=self._device)
        dist.recv(size, self._global_rank(rank), group=self._group)
        data = torch.empty(int(size.item()), dtype=torch.uint8, device=self._device)
        dist.recv(data, self._global_rank(rank), group=self._group)
        return pickle.loads(data.cpu().numpy().tobytes())

    def state_dict(self) -> Dict[str, Any]:
        """torch's state_dict() plus "onebit": the parts of the ranks this state dict can resume —
        every rank's after consolidate_state_dict() (on the rank it gathered to, until the next
        step; what every rank holds alike under "shared", once, and each rank's part the rest: its
        error feedback), the one every rank shares before the first compressed all_reduce, else
        this rank's own (then each rank saves and loads its own file; said once, as a rank-0-only
        save of it cannot resume the other ranks)."""
        state = torch.optim.Optimizer.state_dict(self)
        consolidated: Dict[str, Any] = {}
        if isinstance(self._consolidated, tuple):
            shared, parts = self._consolidated
            parts, consolidated = dict(enumerate(parts)), dict(shared=shared)
        else:
            part = self._onebit_state()
            if self._world == 1 or self._same_on_every_rank(part):
                parts = {"every": part}
            else:
                parts = {self._rank: part}
                if self._consolidated is not _SENT:  # a rank that sent its part to the saving rank is not warned
                    self._warn_rank_state_only()
        state["onebit"] = dict(world_size=self._world, local_size=self._layout()[1], saved_by=self._rank, parts=parts,
                               optimizer=self._who, parameter_shapes_crc32=self._shapes_crc32(), **consolidated)
        return state

    def save_file(self, path: Union[str, "os.PathLike[str]"], consolidated: bool = False) -> None:
        """This rank's checkpoint as a file (onebit.h, "Checkpoint files"), in the format the C++
        shims' save_file() writes: each rank saves its own (its error feedback is its own), and
        load_file() — here or in C++ — resumes it bit for bit. Not collective.

        `consolidated`: the job's one file instead, written by rank 0 (a collective: every rank
        calls it with the same path). What every rank holds alike (m, v, the counters) is in it
        once, and each rank's own part (its error feedback) as it arrives, rank by rank, streamed
        to the file: rank 0 holds its own part and one other rank's at a time, however many ranks
        there are. Every rank's load_file(path) reads its own part of it. A failed write fails
        every rank's call, the path as it was. (A failure while a part is being received — the
        network, memory — is that rank's and rank 0's error; the others' collective calls end at
        the process group's timeout, as after any broken collective.)"""
        self._refuse_changed_parameters("save_file()")
        path = os.fspath(path)
        world, local = self._layout()
        header = dict(optimizer=self._who, world_size=world, local_size=local)
        if not consolidated:
            write_part(self._lib, path, self._onebit_state(), dict(header, rank=self._rank))
            return
        shared, own = self._shared_and_own()
        failure = None
        if self._rank != 0:
            self._send_part(own, 0)
        else:
            buffers: Dict[str, torch.Tensor] = {}
            parts = (own if r == 0 else self._receive_part(r, buffers) for r in range(world))
            failure = write_job(self._lib, path, dict(header, **shared), parts)
        failed = [r for r, row in enumerate(self._every_rank([int(failure is not None)])) if row[0]]
        if failure is not None:
            raise OnebitError(failure.code, f"{self._who}.save_file: {failure}") from failure
        if failed:
            raise OnebitError(OnebitError.REMOTE_ERROR,
                              f"{self._who}.save_file: rank {failed[0]} could not write {path} (its error says why)")

    def load_file(self, path: Union[str, "os.PathLike[str]"], reset_error_feedback: bool = False) -> None:
        """Resumes from a file save_file() wrote, in either language (a collective, as
        load_state_dict(), whose checks and reset_error_feedback it shares)."""
        path = os.fspath(path)
        try:
            header, part = read_part(self._lib, path, self._rank)
        except Exception as error:  # noqa: BLE001 — missing, damaged, malformed: every rank refuses with it
            self._every_rank([1, 0])  # load_state_dict's agreement, which the other ranks are in
            raise ValueError(f"{self._who}.load_file: {error}; nothing was loaded") from error
        # C++ does not record whether a compressed call had run: it had where the part holds error feedback.
        part.setdefault("compressed", _holds_error_feedback(part))
        onebit = dict(world_size=header["world_size"], local_size=header["local_size"], saved_by=header["rank"],
                      parts={header["rank"]: part}, optimizer=header["optimizer"])
        groups = torch.optim.Optimizer.state_dict(self)["param_groups"]
        self.load_state_dict(dict(state={}, param_groups=groups, onebit=onebit),
                             reset_error_feedback=reset_error_feedback)

    def _layout(self):
        """(ranks, ranks per host) of this optimizer's compressed calls: the chunks each rank's error
        feedback belongs to. Ranks per host as the C core takes them from the environment (1: flat;
        the device path compresses flat)."""
        if self._device.type == "cuda" or self._world == 1:
            return self._world, 1
        local = ctypes.c_int()
        _check(self._lib, self._lib.onebit_local_size_from_env(self._rank, self._world, ctypes.byref(local)))
        return self._world, local.value

    def adam_state_dict(self) -> Dict[str, Any]:
        """This rank's moments as torch.optim.Adam's state_dict(): the param_groups, and for each
        parameter its step, exp_avg and exp_avg_sq (copies of m and v), for a run that goes on with
        torch's Adam or AdamW (the same names) from them — without the error feedback, which only
        the compression stage has. A onebit state_dict() keeps m and v under "onebit" alone: torch's
        Adam loads it as a fresh optimizer's. Not in state_dict() itself: copies would hold m and v
        twice in every checkpoint, and views of the flat buffers would each pickle the whole buffer."""
        self._refuse_changed_parameters("adam_state_dict()")
        state = torch.optim.Optimizer.state_dict(self)
        steps = float(self._steps_taken)
        v = self._current_variance
        state["state"] = {index: dict(step=torch.tensor(steps), exp_avg=self._m[lo:hi].clone().view(p.shape),
                                      exp_avg_sq=v[lo:hi].clone().view(p.shape))
                          for index, (p, (lo, hi)) in enumerate(zip(self._params(), self._slices))}
        return state

    @property
    def _steps_taken(self):
        """The updates made so far: torch Adam's `step`."""
        raise NotImplementedError

    @property
    def _current_variance(self):
        """The running average of squared gradients as of now, for adam_state_dict(): v (frozen in
        the compression stage, as the steps use it)."""
        return self._v

    def _warn_rank_state_only(self):
        if self._warned_rank_state:
            return
        self._warned_rank_state = True
        logger.warning(f"{self._who}: this state_dict() holds rank {self._rank}'s error feedback only (the "
                       f"compression stage has begun; each of the {self._world} ranks has its own): it resumes rank "
                       f"{self._rank} alone. If every rank saves its own state_dict(), that is right; if one rank "
                       "saves for all (HF Trainer, Accelerate, Lightning), call optimizer.consolidate_state_dict() "
                       "on every rank first — onebit.integrations do (docs/usage/restarting.md, \"Restarting a "
                       "job\")")

    def _split_state_dict(self, state_dict, reset_error_feedback=False):
        """(torch's part, this rank's onebit part) of a state_dict(), checked against this optimizer,
        nothing changed yet. Collective: whether every rank can load its part is agreed first, so a
        checkpoint one rank refuses (each rank may load its own file) or that lacks one rank's part
        is an error on every rank — not one rank's error and the others' wait in the next
        collective. `reset_error_feedback`: the parts' error feedback dropped first (any layout
        then loads; a rank the checkpoint has no part of takes the lowest rank's)."""
        state_dict = dict(state_dict)
        saved = state_dict.pop("onebit", None)
        state_dict["state"] = {}  # torch's per-parameter state, if any (adam_state_dict()'s): the part is onebit's
        if saved is not None and "parts" not in saved:  # a checkpoint of onebit 0.2: one rank's part
            saved = dict(world_size=saved["world_size"], saved_by=saved["rank"], parts={saved["rank"]: saved})
        if saved is not None and "shared" in saved:  # consolidated: what every rank holds alike is kept once
            saved = dict(saved, parts={key: dict(saved["shared"], **part) for key, part in saved["parts"].items()})
        dropped = (saved is not None and reset_error_feedback
                   and any(map(_holds_error_feedback, saved["parts"].values())))
        if saved is not None and reset_error_feedback:
            saved = self._without_error_feedback(saved)
        part = None if saved is None else self._part_for_this_rank(saved, any_rank=reset_error_feedback)
        refusal = self._refusal_of(saved, part)
        rows = self._every_rank([int(refusal is not None), int(refusal is None and part is None)])
        if refusal is not None:
            raise ValueError(f"{self._who}.load_state_dict: {refusal}; nothing was loaded")
        refused = [r for r, row in enumerate(rows) if row[0]]
        if refused:
            raise ValueError(f"{self._who}.load_state_dict: rank {', '.join(map(str, refused))} refused its checkpoint "
                             "(its error says why); nothing was loaded")
        missing = [r for r, row in enumerate(rows) if row[1]]
        if missing:
            held = ", ".join(str(r) for r in sorted(saved["parts"], key=str))
            raise ValueError(f"{self._who}.load_state_dict: this checkpoint holds the part of rank {held} of "
                             f"{self._world}, not that of rank {', '.join(map(str, missing))}: it was saved by rank "
                             f"{saved['saved_by']} alone in the compression stage without consolidate_state_dict(). "
                             "Load each rank's own file, or save with optimizer.consolidate_state_dict() on every "
                             "rank first (onebit.integrations do)")
        if dropped and self._rank == 0:
            logger.warning(f"{self._who}.load_state_dict(reset_error_feedback=True): the checkpoint's error feedback "
                           f"(saved by a job of {saved['world_size']} ranks) is dropped; the compressed steps that "
                           "follow do not repay the compression error it held, a small one-off perturbation of the "
                           "momentum (docs/usage/restarting.md, \"Restarting a job\")")
        return state_dict, part

    def _without_error_feedback(self, saved):
        """`saved` with every part's error feedback dropped (load_state_dict(reset_error_feedback=True));
        a rank it holds no part of then takes the lowest rank's (_part_for_this_rank)."""
        # Zeros of the tag's count, as a save before the first compressed call holds: a fresh state,
        # which a tag that has already run refuses (onebit_tag_state_check) — its own feedback would
        # stay, not be dropped.
        fresh = dict(worker_error=torch.zeros(self._total), server_error=torch.zeros(0), compressed=False)
        return dict(saved, parts={key: dict(p, **fresh) for key, p in saved["parts"].items()})

    def _part_for_this_rank(self, saved, any_rank=False):
        """This rank's part of `saved`, the one every rank shares, or — from a checkpoint without
        error feedback (saved before the first compressed call, or its feedback dropped) loaded
        into a job of another size, or with `any_rank` — the lowest rank's: m, v and the schedule
        are every rank's. None: none fits (a rank-0-only save of the compression stage)."""
        parts = saved["parts"]
        part = parts.get(self._rank, parts.get("every"))
        if part is None and parts and (any_rank or saved["world_size"] != self._world) and not any(
                map(_holds_error_feedback, parts.values())):
            part = parts[min(parts, key=lambda key: (not isinstance(key, int), key))]
        return part

    def _refusal_of(self, saved, part):
        """Why this optimizer cannot load the "onebit" entry `saved` of a state_dict (this rank's
        `part` of it, None if it has none), or None."""
        if saved is None:
            return ("not a onebit optimizer's state_dict (it has no \"onebit\" entry: torch.optim.Adam's, or another "
                    "optimizer's?). A onebit optimizer resumes only from its own kind's state_dict(); to start from "
                    "another optimizer's run, make this one fresh (its warmup rebuilds m and v)")
        kind = saved.get("optimizer", self._who)  # older checkpoints do not say
        if kind != self._who:
            return (f"the checkpoint is {kind}'s, this optimizer is {self._who}: their states differ; make the "
                    "optimizer the run was made with")
        crc, mine = saved.get("parameter_shapes_crc32"), self._shapes_crc32()
        if crc is not None and crc != mine:
            return (f"the checkpoint's parameters have other shapes (CRC-32 of the shapes {crc}, this optimizer's "
                    f"{mine}): saved for another model, or with the parameters in another order")
        if any(map(_holds_error_feedback, saved["parts"].values())):
            try:
                layout = self._layout()
            except OnebitError as error:  # ONEBIT_LOCAL_SIZE that does not fit this rank: said on every rank
                return str(error)
            if self._lib.onebit_tag_state_check_layout(saved["world_size"], saved.get("local_size", 0), *layout):
                return self._lib.onebit_last_error().decode()
        if part is None:
            return None
        if part["m"].numel() != self._total:
            return f"the checkpoint has {part['m'].numel()} parameters, this optimizer {self._total}"
        unfit = [f"{key} {value.numel()}" for key, value in part.items()
                 if key in _PER_PARAMETER and isinstance(value, torch.Tensor) and value.numel() != self._total]
        if unfit:  # a damaged or hand-made checkpoint: refused here, before the load writes m and v
            return f"the checkpoint's {', '.join(unfit)} floats do not match its {self._total} parameters"
        worker, server = part["worker_error"].numel(), part["server_error"].numel()
        # None at all (a checkpoint of onebit 0.2 saved before the first compressed call) loads anywhere.
        if (worker or server) and self._lib.onebit_tag_state_check(self._name.encode(), ctypes.c_size_t(worker)):
            return self._lib.onebit_last_error().decode()
        return self._schedule_refusal(part)

    def _schedule_refusal(self, part):
        """Why this optimizer cannot go on with the schedule of the checkpoint part `part` — a
        setting that decides when collectives happen, or which rule runs, that differs where the
        checkpoint's stage would contradict it — or None. Part of the agreed refusal of
        _split_state_dict, so every rank learns it."""
        raise NotImplementedError

    def _loaded(self, part):
        """After a load_state_dict() that succeeded: what the part says of the error feedback."""
        self._consolidated = None
        self._compressed = part.get("compressed", True)


def _holds_error_feedback(part):
    """Whether a checkpoint's part holds error feedback: a server error, or a worker error not all
    zeros (a tag saved before its first compressed call has zeros, as a fresh one starts from)."""
    server, worker = part.get("server_error"), part.get("worker_error")
    return (server is not None and server.numel() > 0) or (worker is not None and bool(worker.any()))


def _digest(value):
    """A checkpoint field's digest as two int64s, for the ranks to compare in an integer all_reduce: of
    a tensor's dtype, shape and bytes, of any other value's pickle. 128 bits of SHA-1 (the fastest
    of hashlib's here): fields that differ are not taken for the same by chance."""
    if isinstance(value, torch.Tensor):
        digest = hashlib.sha1(repr((value.dtype, tuple(value.shape))).encode(), usedforsecurity=False)
        digest.update(value.detach().contiguous().reshape(-1).view(torch.uint8).numpy())
    else:
        digest = hashlib.sha1(pickle.dumps(value, protocol=4), usedforsecurity=False)
    return struct.unpack("<2q", digest.digest()[:16])


_TensorOf = collections.namedtuple("_TensorOf", "shape dtype")  # a tensor _send_part sends after the pickle


def _buffer(buffers, key, spec, device):
    """A tensor of `spec`'s shape and dtype on `device`: a new one, or (`buffers` given) a view of
    buffers[key], made or grown on first need and reused after."""
    if buffers is None:
        return torch.empty(spec.shape, dtype=spec.dtype, device=device)
    count = int(torch.Size(spec.shape).numel())
    held = buffers.get(key)
    if held is None or held.numel() < count or held.dtype != spec.dtype:
        held = buffers[key] = torch.empty(count, dtype=spec.dtype, device=device)
    return held[:count].view(spec.shape)
