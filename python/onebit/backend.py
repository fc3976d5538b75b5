"""onebit as a torch.distributed backend: the way in for PyTorch 2.x as pip installs it.

pip wheels bundle their own gloo inside libtorch_cpu.so, so the LD_PRELOAD front door (which
interposes the system libgloo.so.0) cannot reach their calls (docs/design.md, "PyTorch from
PyPI"). A backend registered with torch.distributed needs no interposition:

    import onebit
    onebit.register_backend()                      # once, before init_process_group
    dist.init_process_group("onebit", ...)         # any init_method; CPU tensors

Every collective goes to a gloo process group made on the same store (so untagged calls are
bit-identical to a plain gloo job), except all_reduce of a tagged tensor (onebit.tag; float32,
float16 or bfloat16; SUM), which runs onebit's compressed allreduce over onebit's own TCP
transport (libonebit.so's C API), bootstrapped over the same store: rank 0 serves the bootstrap
at ONEBIT_ROOT (first group), or on a free port of ONEBIT_ROOT's host or MASTER_ADDR (127.0.0.1
when unset), and publishes it in the store with a random identity and secret for the group.

The library is libonebit.so: ONEBIT_LIBRARY names it, else the build tree of the checkout this
package sits in, else the loader's search path. Needs torch >= 2.0 (Backend subclasses).
"""
import atexit
import ctypes
import os
import socket
import threading

import torch
import torch.distributed as dist

from . import _Stats as _CommStats, _check, _library, _tag_name, _tagged_dtype

if not hasattr(torch._C._distributed_c10d, "Backend"):  # the class below derives from it
    raise RuntimeError(f"onebit.register_backend: torch {torch.__version__} has no c10d Backend class "
                       "(torch >= 2.0 needed); with this torch use LD_PRELOAD=libonebit-preload.so")

from ._forward import allreduce_arguments, forward_backend_methods  # noqa: E402 (needs the check above)

__all__ = ["register_backend", "BACKEND_NAME"]

BACKEND_NAME = "onebit"

_ONEBIT_SUM, _ONEBIT_AVG = 0, 1


class _Config(ctypes.Structure):  # onebit_config_t
    _fields_ = [("timeout_ms", ctypes.c_int64), ("sockets_per_peer", ctypes.c_int),
                ("socket_ifname", ctypes.c_char_p), ("auth_key", ctypes.c_char_p),
                ("job_id", ctypes.c_char_p), ("secret", ctypes.c_char_p)]


def _work_done(result):
    future = torch.futures.Future()
    future.set_result(result)
    return torch._C._distributed_c10d._create_work_from_future(future)


def _free_port_on(host):
    # Closed again before the bootstrap binds it, so another process could take it in between (then
    # the bootstrap fails, naming the address): set ONEBIT_ROOT where ports are contended.
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def _address_toward(host):
    """This host's address on the route to `host`: a UDP connect only asks the kernel for the
    route, nothing is sent."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((host, 9))
        return probe.getsockname()[0]


_root_taken = False  # ONEBIT_ROOT's port serves this process's first onebit group only


def _invitation(store, rank):
    """Where the bootstrap root is, and the communicator's identity and secret: drawn at random by
    rank 0 and published through this group's store (c10d gives each group its own prefix), so
    that only this group's ranks can join (transport/tcp/bootstrap.h) — not another job, group or
    attempt on the same host, nor a stranger that never saw the store. The same on every rank."""
    global _root_taken
    if rank == 0:
        configured = os.environ.get("ONEBIT_ROOT")
        if configured and not _root_taken:
            root = configured
        else:
            # The first group's rank 0 runs on MASTER_ADDR's host (torchrun's rule). A later group
            # (a subgroup) takes a free port of its own rank 0, on that host's address on the route
            # to ONEBIT_ROOT's or MASTER_ADDR's, so that two groups never wait at one address.
            host = configured.rsplit(":", 1)[0].strip("[]") if configured else (os.environ.get("MASTER_ADDR") or "127.0.0.1")
            if _root_taken:
                host = _address_toward(host)
            root = f"[{host}]:{_free_port_on(host)}" if ":" in host else f"{host}:{_free_port_on(host)}"
        store.set("onebit/root", root)
        store.set("onebit/identity", f"torch process group {os.urandom(8).hex()}")
        store.set("onebit/secret", os.urandom(32).hex())
    _root_taken = True
    return tuple(store.get(key).decode() for key in ("onebit/root", "onebit/identity", "onebit/secret"))


class OnebitBackend(torch._C._distributed_c10d.Backend):
    """A c10d backend: gloo for everything, onebit's compressed allreduce for tagged tensors."""

    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)
        self._lib = _library()
        self._rank, self._size = rank, size
        self._gloo_group = dist.ProcessGroupGloo(dist.PrefixStore("onebit/gloo", store), rank, size, timeout)
        self._comm = ctypes.c_void_p()
        root, identity, secret = _invitation(store, rank)
        config = _Config(int(timeout.total_seconds() * 1000), 0, None, None, identity.encode(), secret.encode())
        _check(self._lib, self._lib.onebit_comm_init_config(ctypes.byref(self._comm), rank, size, root.encode(),
                                                            ctypes.byref(config)))
        self._lock = threading.Lock()  # forwarded-call counters
        self.forwarded_calls = 0
        self.forwarded_bytes = 0
        self._final_stats = None  # stats() once released
        _backends.append(self)

    @property
    def _gloo(self):
        if self._gloo_group is None:
            raise RuntimeError("onebit backend: this process group was destroyed (destroy_process_group)")
        return self._gloo_group

    def shutdown(self):
        """Called by destroy_process_group: releases onebit's communicator and the inner gloo group
        now, their threads joined while Python is whole — not at interpreter teardown, where a
        gloo thread meeting a half-finalized interpreter ended finished jobs with SIGABRT
        ("terminate called without an active exception")."""
        self._release()

    def _release(self):
        with _release_lock:
            if self._comm is None:
                return
            self._final_stats = self.stats()
            comm, self._comm = self._comm, None
            self._lib.onebit_comm_destroy(comm)
            gloo, self._gloo_group = self._gloo_group, None
            if hasattr(gloo, "shutdown"):
                gloo.shutdown()
            del gloo

    def getBackendName(self):
        return BACKEND_NAME

    def _compressible(self, tensors, opts):
        if len(tensors) != 1:
            return None
        t = tensors[0]
        if t.layout != torch.strided:  # a sparse tensor has no data pointer to look a tag up by (gloo's)
            return None
        dtype = _tagged_dtype(t)
        if dtype is None or t.device.type != "cpu":
            return None
        if not t.is_contiguous():
            # Same address and element count as a tagged tensor, other elements (a strided view):
            # compressing it as the tagged buffer would reduce memory it does not cover.
            raise ValueError(f"onebit backend: all_reduce of a non-contiguous tensor (shape {tuple(t.shape)}, strides "
                             f"{t.stride()}) at the address of the tagged tensor '{_tag_name(t)}': pass the tagged "
                             "tensor itself, or a contiguous copy (untagged calls go to gloo)")
        if opts.reduceOp == dist.ReduceOp.SUM:
            return dtype, _ONEBIT_SUM
        if opts.reduceOp == dist.ReduceOp.AVG:
            return dtype, _ONEBIT_AVG
        return None

    def allreduce(self, *args, **kwargs):
        # Every form gloo's binding accepts (a tensor or a list; opts, or op and timeout): torch
        # calls (tensors, opts), code holding the backend object any of them.
        tensors, opts = allreduce_arguments(*args, **kwargs)
        verdict = self._compressible(tensors, opts)
        if verdict is None:
            with self._lock:
                self.forwarded_calls += 1
                self.forwarded_bytes += sum(t.numel() * t.element_size() for t in tensors)
            return self._gloo.allreduce(*args, **kwargs)
        dtype, op = verdict
        t = tensors[0]
        if self._comm is None:
            raise RuntimeError("onebit backend: this process group was destroyed (destroy_process_group)")
        # Synchronous: the tensor is complete (or untouched, with the error raised) on return.
        _check(self._lib, self._lib.onebit_allreduce(self._comm, ctypes.c_void_p(t.data_ptr()),
                                                     ctypes.c_size_t(t.numel()), dtype, op))
        return _work_done(tensors)

    # Everything else is gloo's, forwarded by _forward.forward_backend_methods below (generated from
    # the installed torch's Backend method table, docs/design.md "Forwarding by construction").
    # barrier stays spelled out, as gloo's: it is where this backend's own calls in flight would be
    # waited for.
    def barrier(self, *args, **kwargs):
        return self._gloo.barrier(*args, **kwargs)

    def _forward_target(self):
        return self._gloo

    @property
    def supports_splitting(self):
        return True  # split() below: a child group is an onebit backend too

    def split(self, store, ranks, opts):
        """The backend of a group split from this one (dist.split_group): an onebit backend over
        `store` for the members of `ranks` (ranks of this group, in the child's order), as
        new_group would make; None on a rank outside `ranks`."""
        ranks = list(ranks)
        if self._rank not in ranks:
            return None
        return OnebitBackend(store, ranks.index(self._rank), len(ranks), opts._timeout)

    def merge(self, store, opts, rank, size):
        """The backend of a group merged from this one's ranks and others (c10d's merge): an
        onebit backend over `store`."""
        return OnebitBackend(store, rank, size, opts._timeout)

    def stats(self):
        if self._comm is None:
            return dict(self._final_stats)
        out = _CommStats()
        _check(self._lib, self._lib.onebit_comm_stats(self._comm, ctypes.byref(out)))
        return {name: getattr(out, name) for name, _ in _CommStats._fields_}


FORWARDED = forward_backend_methods(OnebitBackend)  # the names this torch's Backend has and gloo answers

_backends = []  # every OnebitBackend of this process, for onebit.stats() (released ones keep their counts)
_release_lock = threading.Lock()
_registered = False


@atexit.register
def _release_all():
    """At interpreter exit, before its teardown: every backend not destroyed by then releases its
    communicator and gloo group (see OnebitBackend.shutdown)."""
    for backend in list(_backends):
        backend._release()


def register_backend():
    """Registers the "onebit" backend with torch.distributed (idempotent)."""
    global _registered
    if _registered:
        return
    dist.Backend.register_backend(BACKEND_NAME, lambda store, rank, size, timeout: OnebitBackend(store, rank, size, timeout),
                                  devices=["cpu"])
    _registered = True


def backend_stats():
    """What every onebit backend of this process did, as onebit.stats() reports it."""
    total = {name: 0 for name, _ in _CommStats._fields_}
    total.update(forwarded_calls=0, forwarded_bytes=0)
    for backend in _backends:
        for name, value in backend.stats().items():
            total[name] += value
        total["forwarded_calls"] += backend.forwarded_calls
        total["forwarded_bytes"] += backend.forwarded_bytes
    return total
