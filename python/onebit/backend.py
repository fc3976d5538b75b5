"""onebit as a torch.distributed backend: the way in for PyTorch 2.x as pip installs it.

pip wheels bundle their own gloo inside libtorch_cpu.so, so the LD_PRELOAD front door (which
interposes the system libgloo.so.0) cannot reach their calls (docs/design/doors.md, "PyTorch from
PyPI"). A backend registered with torch.distributed needs no interposition:

    import onebit
    onebit.register_backend()                      # once, before init_process_group
    dist.init_process_group("onebit", ...)         # any init_method; CPU tensors

Every call goes to a gloo backend made on the same store (so untagged calls, and their Work, are
gloo's own), except all_reduce of a tagged tensor (onebit.tag; float32, float16 or bfloat16; SUM or
AVG), which runs onebit's compressed allreduce over onebit's own TCP transport (libonebit.so's C
API): rank 0 listens for the bootstrap at ONEBIT_ROOT (the default group), or on a port the kernel
picks on ONEBIT_ROOT's host or MASTER_ADDR (127.0.0.1 when unset), held open by libonebit
(onebit_root_listen), and sends it to the group's other ranks over the gloo backend, with a random
identity and secret for the group; every rank's answer to whether it reaches it is agreed before
the bootstrap (_invitation, _reached_by_every_rank).

The backend object is the native one (csrc/c10d_backend.cc: the wheel's prebuilt module, or one
built at first use by _native.py): a tagged all_reduce runs in C++ from the call to its Work's
completion. This module sets each group up — the gloo half, the invitation, the root check, the
communicator (make_backend) — and makes the children of split and merge (docs/design/doors.md, "The
native c10d backend").

The library is libonebit.so: ONEBIT_LIBRARY names it, else the build tree of the checkout this
package sits in, else the loader's search path. Needs torch >= 2.0 (c10d Backend classes).
"""
import atexit
import ctypes
import os
import socket

import torch
import torch.distributed as dist

from . import _capi, _check, _library, _tag_name, _tagged_dtype
from ._errors import OnebitError
from ._gloo_threads import returned_by_gloo
from ._logging import logger

if not hasattr(torch._C._distributed_c10d, "Backend"):  # the native backend derives from it
    # An ImportError: the module cannot exist with this torch (onebit.stats() takes it as "no
    # backend here"; onebit.register_backend() shows the reason).
    raise ImportError(f"onebit.register_backend: torch {torch.__version__} has no c10d Backend class "
                       "(torch >= 2.0 needed); with this torch use LD_PRELOAD=libonebit-preload.so")

from ._native import native_module as _native_module  # noqa: E402 (needs the check above)

__all__ = ["register_backend", "BACKEND_NAME"]

BACKEND_NAME = "onebit"



def _listen_for_root(where):
    """Rank 0's bootstrap listener on `where` ("host:0": a port the kernel picks), held open by
    libonebit for the communicator made next (onebit_root_listen): the address returned is
    sent to the group's ranks and served as it is, so no other process can take the port in between."""
    lib = _library()
    root = ctypes.create_string_buffer(128)
    _check(lib, lib.onebit_root_listen(where.encode(), root, ctypes.sizeof(root)))
    return root.value.decode()


def _address_toward(host):
    """This host's address on the route to `host`: a UDP connect only asks the kernel for the
    route, nothing is sent."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((host, 9))
        return probe.getsockname()[0]


def _gloo_half(store, rank, size, timeout):
    """The gloo backend an onebit group forwards to, made on the group's store under "onebit/gloo".

    Once every rank has it, each rank deletes the keys gloo published its address under (one per
    device: ProcessGroupGloo's prefix is the device's index, gloo's key the rank): torchrun keeps one
    store across restarts (static rendezvous, and c10d's since mid-2024: pytorch issue 135712),
    and gloo reads a peer's key as soon as it exists, so the next attempt's ranks would dial this
    attempt's dead addresses and fail, or wait out their timeout. Not under TORCH_GLOO_LAZY_INIT,
    where gloo connects later through those keys; nor on a store that cannot delete (one written in
    Python); nor, of course, for an attempt that died before this."""
    gloo_store = dist.PrefixStore("onebit/gloo", store)
    gloo = dist.ProcessGroupGloo(gloo_store, rank, size, timeout)
    if os.environ.get("TORCH_GLOO_LAZY_INIT", "0").lower() not in ("1", "y", "yes", "t", "true"):  # torch's "on"
        gloo.barrier(dist.BarrierOptions()).wait()  # every rank has read every rank's keys
        device = 0
        try:
            while gloo_store.check([f"{device}/{rank}"]):
                gloo_store.delete_key(f"{device}/{rank}")
                device += 1
        except (RuntimeError, NotImplementedError):  # a store that cannot delete: the keys stay
            pass
    return gloo


def _invitation(gloo, rank):
    """Where the bootstrap root is, and the communicator's identity and secret: drawn at random by
    rank 0 and broadcast over this group's gloo half, connected by now, so that only this group's
    ranks can join (transport/tcp/bootstrap.h) — not another job, group or attempt on the same
    host, nor a stranger outside the group. The same on every rank.

    Not through the store: a store outlives the ranks that wrote to it. torchrun keeps one across
    restarts (_gloo_half), so a rank of the next attempt could read the dead attempt's root before
    rank 0 wrote the new one, and retry it until the group's timeout, silent. What came over the
    group came from this attempt. Rank 0 listens before it sends the address; one that cannot says
    why to every rank."""
    invitation = torch.zeros(_INVITATION_BYTES, dtype=torch.uint8)
    failure = None
    if rank == 0:
        try:
            words = (_root_address(), f"torch process group {os.urandom(8).hex()}", os.urandom(32).hex())
        except Exception as error:  # sent on, so that the other ranks fail now, not at the timeout
            failure, words = error, ("", "rank 0 could not serve the bootstrap root", str(error))
        _write_bytes(invitation, "\n".join(words))
    with returned_by_gloo(invitation):  # rank 0 raises its failure right after (_gloo_threads)
        gloo.broadcast([invitation], dist.BroadcastOptions()).wait()  # from rank 0 (rootRank's default)
    if failure is not None:
        raise failure
    root, identity, secret = bytes(invitation.tolist()).rstrip(b"\0").decode(errors="replace").split("\n", 2)
    if not root:
        raise OnebitError(OnebitError.REMOTE_ERROR, f"onebit backend: rank {rank}: {identity}: {secret}")
    return root, identity, secret


def _reached_by_every_rank(gloo, rank, size, root):
    """Every rank's answer to whether it reaches rank 0's root (onebit_root_check: a connection,
    closed at once, from every rank of the group; rank 0's listener answers them), agreed over the gloo half before the
    bootstrap: a rank that cannot — a loopback address sent to another host, a firewall — fails
    every rank now with its reason, instead of failing itself at the timeout while rank 0 waits.
    Each rank writes its answer into its own row; a SUM (gloo has no allgather into one tensor on
    every torch) gives every rank every row."""
    lib = _library()
    answers = torch.zeros(size, _ANSWER_BYTES, dtype=torch.uint8)
    if rank != 0 and lib.onebit_root_check(rank, size, root.encode(), 0) != 0:
        _write_bytes(answers[rank], lib.onebit_last_error().decode(errors="replace"))
    options = dist.AllreduceOptions()
    options.reduceOp = dist.ReduceOp.SUM
    with returned_by_gloo(answers):
        gloo.allreduce([answers], options).wait()
    texts = [bytes(row.tolist()).rstrip(b"\0").decode(errors="replace") for row in answers]
    failed = [r for r, text in enumerate(texts) if text]
    if failed:
        named = ", ".join(map(str, failed[:16])) + (", ..." if len(failed) > 16 else "")
        raise OnebitError(OnebitError.SYSTEM_ERROR, f"onebit backend: rank {rank}: no bootstrap for these {size} "
                          f"ranks: rank(s) {named} ({len(failed)} of {size}) cannot reach the root; rank "
                          f"{failed[0]}'s reason: {texts[failed[0]]}")


def _write_bytes(tensor, text):
    written = text.encode()[:tensor.numel()]  # only an error's message can be longer
    tensor[:len(written)] = torch.frombuffer(bytearray(written), dtype=torch.uint8)


_INVITATION_BYTES = 512  # root address (under 128: onebit_root_listen's buffer), identity, secret
_ANSWER_BYTES = 512  # onebit_root_check's message: the address, the reason, a hint


def _root_address():
    """Rank 0's bootstrap root, listening before its address is sent (_listen_for_root):
    ONEBIT_ROOT for the default process group (the job's whole world, made while none is
    initialized), else a port the kernel picks — on ONEBIT_ROOT's or MASTER_ADDR's host for the
    default group, whose rank 0 runs there (torchrun's rule), and for a subgroup, whose rank 0 may
    run anywhere, on this host's address on the route there. Two groups never compete for one
    address."""
    configured = os.environ.get("ONEBIT_ROOT")
    if configured and len(configured) > 256:
        raise ValueError(f"ONEBIT_ROOT is {len(configured)} characters long: host:port expected")
    default_group = not dist.is_initialized()
    if configured and default_group:
        return _listen_for_root(configured)
    host = configured.rsplit(":", 1)[0].strip("[]") if configured else (os.environ.get("MASTER_ADDR") or "127.0.0.1")
    if not default_group:
        host = _address_toward(host)
    return _listen_for_root(f"[{host}]:0" if ":" in host else f"{host}:0")


def _connect(gloo, rank, size, timeout):
    """The group's onebit communicator (an onebit_comm_t's address): the invitation from rank 0,
    every rank's answer to whether it reaches the root, then the bootstrap. Rank 0's listener is
    closed if no communicator took it."""
    lib = _library()
    comm = ctypes.c_void_p()
    root, identity, secret = _invitation(gloo, rank)
    config = _capi.Config(int(timeout.total_seconds() * 1000), 0, None, None, identity.encode(), secret.encode())
    try:
        _reached_by_every_rank(gloo, rank, size, root)
        _check(lib, lib.onebit_comm_init_config(ctypes.byref(comm), rank, size, root.encode(), ctypes.byref(config)))
    except BaseException:
        if rank == 0:  # rank 0's listener, if no communicator took it, would hold the port until exit
            lib.onebit_root_close(root.encode())
        raise
    return comm.value


class _GroupSetup:
    """What the native backend asks Python for, none of it on a tagged all_reduce's path: the
    children of split and merge (made by make_backend, whose set-up is Python's), and the note
    that a coalesced all_reduce of a tagged tensor is gloo's."""

    def __init__(self, rank):
        self._rank = rank  # split() finds its place among the child's ranks

    def note_coalesced(self, tensors):
        """all_reduce_coalesced (and a coalescing manager's all_reduces, which end in it) is gloo's,
        tagged members included — exact fp32 sums, not compressed: said once per tag, so that a
        tag meant to be compressed is not silently sent in full."""
        for t in tensors:
            if t.layout == torch.strided and t.device.type == "cpu" and _tagged_dtype(t) is not None:
                name = _tag_name(t)
                if name not in _coalesced_said:
                    _coalesced_said.add(name)
                    logger.warning("all_reduce_coalesced of the tagged tensor '%s' runs uncompressed, as gloo's (exact "
                                   "fp32 sums): onebit compresses an all_reduce of the tagged tensor alone", name)

    def split(self, store, ranks, opts):
        """The backend of a group split from this one (dist.split_group): an onebit backend over
        `store` for the members of `ranks` (ranks of this group, in the child's order), as
        new_group would make; None on a rank outside `ranks`."""
        ranks = list(ranks)
        if self._rank not in ranks:
            return None
        return make_backend(store, ranks.index(self._rank), len(ranks), opts._timeout)

    def merge(self, store, opts, rank, size):
        """The backend of a group merged from this one's ranks and others (c10d's merge): an
        onebit backend over `store`."""
        return make_backend(store, rank, size, opts._timeout)


_backends: list = []  # every onebit backend of this process, for onebit.stats() and _release_all
_coalesced_said: set = set()  # the tags note_coalesced has warned about


def make_backend(store, rank, size, timeout):
    """The onebit backend of one group: the native one (csrc/c10d_backend.cc) over a gloo backend
    on the same store and the group's onebit communicator."""
    module = _native_module()
    gloo = _gloo_half(store, rank, size, timeout)
    comm = _connect(gloo, rank, size, timeout)
    try:
        backend = module.OnebitBackend(gloo, comm, _library()._handle, _GroupSetup(rank))
    except BaseException:
        _library().onebit_comm_destroy(ctypes.c_void_p(comm))
        raise
    _backends.append(backend)  # shut down at exit if torch has not; counted by onebit.stats()
    return backend


def wait_for_compressed_calls():
    """Returns once every backend's queued compressed calls have run: what onebit.tag and
    onebit.untag call before they change a tag, since a queued call finds its tag by address when
    it runs, and must find on every rank what the program had tagged when it issued the call."""
    for backend in list(_backends):
        backend.drain()


_registered = False


@atexit.register
def _release_all():
    """At interpreter exit, before its teardown: every group not destroyed by then runs its queued
    calls, releases its communicator and shuts its gloo backend down (csrc/c10d_backend.cc's
    close(), which shutdown() runs on a torch that has it; a second one does nothing)."""
    for backend in _backends:
        try:
            backend.close()
        except Exception as failure:  # the others are still released
            logger.warning("releasing an onebit group at exit failed: %s", failure)


def register_backend(native=None):
    """Registers the "onebit" backend with torch.distributed (idempotent). The wheel declares it as
    a torch.distributed.backends entry point too, so that init_process_group("onebit") finds it
    without an import on a torch that reads those (docs/usage/pytorch.md, "Which torch").

    `native` chose between the native backend and a Python one before 0.3; the backend is native
    only now, and a value other than None is said once and otherwise ignored."""
    global _registered
    if native is not None:
        logger.warning("onebit.register_backend(native=%r): the argument is no longer used; the backend is the "
                       "native one (docs/usage/pytorch.md, \"Which torch\")", native)
    if _registered:
        return
    dist.Backend.register_backend(BACKEND_NAME, make_backend, devices=["cpu"])
    _registered = True


def backend_stats():
    """What every onebit backend of this process did, as onebit.stats() reports it."""
    total = {name: 0 for name, _ in _capi.Stats._fields_}
    total.update(forwarded_calls=0, forwarded_bytes=0)
    for backend in _backends:
        for name, value in backend.stats().items():
            total[name] += value
    return total
