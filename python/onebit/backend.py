"""onebit as a torch.distributed backend: the way in for PyTorch 2.x as pip installs it.

pip wheels bundle their own gloo inside libtorch_cpu.so, so the LD_PRELOAD front door (which
interposes the system libgloo.so.0) cannot reach their calls (docs/design.md, "PyTorch from
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

The backend object is the native one (csrc/c10d_backend.cc, built at first use by _native.py)
around this module's _Compression, or where that cannot be built the Python OnebitBackend below
(docs/design.md, "The native c10d backend").

The library is libonebit.so: ONEBIT_LIBRARY names it, else the build tree of the checkout this
package sits in, else the loader's search path. Needs torch >= 2.0 (c10d Backend classes).
"""
import atexit
import collections
import ctypes
import os
import socket
import threading

import torch
import torch.distributed as dist

from . import _capi, _check, _library, _tag_name, _tagged_dtype
from ._errors import OnebitError
from ._gloo_threads import returned_by_gloo
from ._logging import logger

if not hasattr(torch._C._distributed_c10d, "Backend"):  # the class below derives from it
    # An ImportError: the module cannot exist with this torch (onebit.stats() takes it as "no
    # backend here"; onebit.register_backend() shows the reason).
    raise ImportError(f"onebit.register_backend: torch {torch.__version__} has no c10d Backend class "
                       "(torch >= 2.0 needed); with this torch use LD_PRELOAD=libonebit-preload.so")

from ._forward import allreduce_arguments, forward_backend_methods  # noqa: E402 (needs the check above)
from ._native import native_module as _native_module  # noqa: E402

__all__ = ["register_backend", "BACKEND_NAME"]

BACKEND_NAME = "onebit"

_ONEBIT_SUM, _ONEBIT_AVG = 0, 1


class _CompressedWork(torch._C._distributed_c10d.Work):
    """The Work of one tagged all_reduce, completed by its backend's _CompressedCallQueue.

    wait() blocks until the call ran and raises its error (RuntimeError naming the rank, the tag
    and the call) — every time it is called; get_future() is completed with the list of tensors,
    as gloo's allreduce future is, or set to the error, so that .then(...) chains (DDP comm hooks)
    see either.

    A Python subclass of c10d's Work (torch._C, not a public torch API) rather than
    _create_work_from_future: that Work's wait() returns True when its future holds an error, so
    a failed call would pass unnoticed. Checked on torch 2.15.0 (the pip venv); Debian's torch
    1.13 has no c10d Backend class, so register_backend refuses it and this class is never used
    there. The native backend wraps it in a C++ Work whose every answer is one of the methods
    below; the Python backend's is wrapped by torch's PyWorkHolder, which forwards wait() and
    get_future() only (docs/usage.md, "Which torch")."""

    def __init__(self, tensors, what):
        super().__init__()
        self._tensors = tensors
        self._what = what  # names the call in a timeout
        self._done = threading.Event()
        self._error = None
        # The future's error must be a real c10::ivalue::Future error (torch.futures.Future's
        # set_exception stores the exception as the value, which C++ consumers take as success):
        # a callback that raises is how Python sets one.
        self._outcome = torch.futures.Future()
        self._future = self._outcome.then(self._tensors_or_raise)

    def _tensors_or_raise(self, _):
        if self._error is not None:
            raise RuntimeError(self._error)
        return self._tensors

    def _finish(self, error=None):
        """Called once by the queue: the call ran, `error` (the message) if it failed. The future
        first (its .then callbacks run here, on the queue's thread), so that after wait() the
        future is done too."""
        self._error = error
        try:
            self._outcome.set_result(None)
        finally:
            self._done.set()

    def wait(self, timeout=None):
        seconds = timeout.total_seconds() if timeout is not None else 0
        if not self._done.wait(seconds if seconds > 0 else None):
            raise RuntimeError(f"onebit backend: {self._what} not completed within {seconds:g} s (wait timeout)")
        if self._error is not None:
            raise RuntimeError(self._error)
        return True

    def is_completed(self):
        return self._done.is_set()

    def is_success(self):
        return self._done.is_set() and self._error is None

    def result(self):
        self.wait()
        return self._tensors

    def get_future(self):
        return self._future


class _CompressedCallQueue:
    """A backend's compressed allreduces in call order: they must be issued in the same order on
    every rank, since each rank's calls pair with its peers' in sequence over onebit's
    connections. Asynchronous calls run on one worker thread per backend (started with the first
    one), one at a time, in submission order; the GIL is released during the C call (ctypes
    releases it around every CDLL function). A synchronous call runs on the caller's thread when
    nothing is queued, else waits its turn in the queue, so it never overtakes an earlier
    asynchronous call. One C call on the communicator at a time (`_calling`), whichever thread
    makes it.

    Untagged calls go to gloo over gloo's own connections, ordered among themselves by gloo on
    every rank; the two streams never wait on each other, so a gloo call made after a queued
    compressed one cannot deadlock it — it may finish first, as two gloo calls in flight may."""

    def __init__(self):
        self._lock = threading.Condition()
        self._jobs = collections.deque()
        self._submitted = 0  # calls submitted to the worker
        self._finished = 0  # of those, the ones that ran
        self._thread = None
        self._closed = False
        self._calling = threading.Lock()

    def _on_worker(self):
        return threading.current_thread() is self._thread

    def run(self, call):
        """Runs `call()` now, after every call submitted before it; raises its error."""
        with self._lock:
            queued = self._submitted != self._finished and not self._on_worker()
        if not queued:  # the worker's own callers (a future's callbacks) run between two jobs: in order
            with self._calling:
                return call()
        work = _CompressedWork([], "a synchronous compressed all_reduce")
        self._submit(call, work)
        work.wait()

    def submit(self, call, tensors, what):
        """Queues `call()` (it raises on failure) and returns its _CompressedWork."""
        work = _CompressedWork(tensors, what)
        self._submit(call, work)
        return work

    def _submit(self, call, work):
        with self._lock:
            if self._closed:
                raise RuntimeError("onebit backend: this process group was destroyed (destroy_process_group)")
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="onebit-compressed-calls", daemon=True)
                self._thread.start()
            self._jobs.append((call, work))
            self._submitted += 1
            self._lock.notify_all()

    def _serve(self):
        # Daemon: a thread still waiting here must not hold up interpreter exit (threading's
        # shutdown joins non-daemon threads before atexit runs the backends' release, which
        # stops this one).
        while True:
            with self._lock:
                while not self._jobs:
                    self._lock.wait()
                call, work = self._jobs.popleft()
            if call is None:
                return
            error = None
            try:
                with self._calling:
                    call()
            except Exception as failure:  # the call's error belongs to its Work
                error = str(failure)
            del call
            work._finish(error)
            # The call's tensors live as long as its Work's holders, not until the next call; and
            # drain() returning means this thread holds none (a tagged tensor's storage freed with
            # its last holder takes its tag with it, onebit._untag_when_freed).
            del work
            with self._lock:
                self._finished += 1
                self._lock.notify_all()

    def drain(self):
        """Returns once every call submitted so far has run (their errors stay with their Work).
        On the worker itself (a callback or a collector's finalizer run there) it returns at once:
        the worker cannot wait for itself."""
        with self._lock:
            if self._on_worker():
                return
            target = self._submitted
            while self._finished < target:
                self._lock.wait()

    def close(self):
        """Runs what is queued, then stops the worker."""
        with self._lock:
            thread, self._closed = self._thread, True
            if thread is None:
                return
            self._jobs.append((None, None))
            self._lock.notify_all()
        if not self._on_worker():
            thread.join()

    def abort(self, reason):
        """Fails every queued call's Work with `reason` without running it, and lets the worker stop
        after the call it is running (which ends by itself, at the latest at the group's timeout).
        Returns at once: what c10d's abort asks of a group whose peers may be gone."""
        with self._lock:
            self._closed = True
            dropped = [work for call, work in self._jobs if call is not None]
            self._jobs.clear()
            if self._thread is not None:
                self._jobs.append((None, None))
            self._finished += len(dropped)
            self._lock.notify_all()
        for work in dropped:
            work._finish(reason)


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
    closed at once, from at most 32 ranks of the group), agreed over the gloo half before the
    bootstrap: a rank that cannot — a loopback address sent to another host, a firewall — fails
    every rank now with its reason, instead of failing itself at the timeout while rank 0 waits. Each rank writes its answer into its own row; a SUM
    (gloo has no allgather into one tensor on every torch) gives every rank every row."""
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


class _Compression:
    """The onebit half of an onebit group, whichever form the group's backend takes: the
    communicator over onebit's TCP transport, the queue of compressed calls, and the counters.
    allreduce() answers whether a call is onebit's (its Work) or gloo's (None).

    The native backend (csrc/c10d_backend.cc) calls allreduce, drain, close, release, split and
    merge from C++ with the GIL held for the call; the Python backend (OnebitBackend) calls them
    from its methods."""

    def __init__(self, gloo, rank, size, timeout):
        self._lib = _library()
        self._gloo = gloo  # shut down by close(), with the communicator
        self._rank = rank  # split() finds its place among the child's ranks
        self._comm = ctypes.c_void_p()
        root, identity, secret = _invitation(gloo, rank)
        config = _capi.Config(int(timeout.total_seconds() * 1000), 0, None, None, identity.encode(), secret.encode())
        try:
            _reached_by_every_rank(gloo, rank, size, root)
            _check(self._lib, self._lib.onebit_comm_init_config(ctypes.byref(self._comm), rank, size, root.encode(),
                                                                ctypes.byref(config)))
        except BaseException:
            if rank == 0:  # rank 0's listener, if no communicator took it, would hold the port until exit
                self._lib.onebit_root_close(root.encode())
            raise
        self._lock = threading.Lock()  # forwarded-call counters
        self._compressed_calls = _CompressedCallQueue()
        self.forwarded_calls = 0
        self.forwarded_bytes = 0
        self._final_stats = None  # stats() once released
        _groups.append(self)

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

    def allreduce(self, tensors, opts):
        """The Work of the compressed all_reduce of `tensors` (a tagged tensor, SUM or AVG), or None
        for a call that is gloo's (counted as forwarded)."""
        verdict = self._compressible(tensors, opts)
        if verdict is None:
            with self._lock:
                self.forwarded_calls += 1
                self.forwarded_bytes += sum(t.numel() * t.element_size() for t in tensors)
            return None
        dtype, op = verdict
        t = tensors[0]
        if self._comm is None:
            raise RuntimeError("onebit backend: this process group was destroyed (destroy_process_group)")
        lib = self._lib

        def call():  # the error message is thread-local in C: read on the thread that called
            comm = self._comm  # None once released: by a future's callback on the worker, queued calls after it fail
            if comm is None:
                raise RuntimeError("onebit backend: this process group was destroyed (destroy_process_group) before "
                                   f"the queued all_reduce of tag '{_tag_name(t)}' ran")
            _check(lib, lib.onebit_allreduce(comm, ctypes.c_void_p(t.data_ptr()), ctypes.c_size_t(t.numel()),
                                             dtype, op))

        # opts.asyncOp (torch 2.15 sets it; older AllreduceOptions may lack it) says whether the
        # caller waits at once; without it every call is queued, and dist.all_reduce's own wait()
        # keeps the synchronous ones synchronous.
        if not getattr(opts, "asyncOp", True):
            # The tensor is complete (or untouched, with the error raised here) on return.
            self._compressed_calls.run(call)
            work = _CompressedWork(tensors, "")
            work._finish()
            return work
        return self._compressed_calls.submit(call, tensors, f"the compressed all_reduce of tag '{_tag_name(t)}'")

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

    def drain(self):
        """Returns once the queued compressed calls ran (barrier() calls it before gloo's)."""
        self._compressed_calls.drain()

    def release(self):
        """Runs the queued calls, then releases onebit's communicator (idempotent)."""
        with _release_lock:
            if self._comm is None:
                return
            self._compressed_calls.close()  # queued calls run first: peers issued them too
            try:
                self._final_stats = self.stats()
            finally:
                comm, self._comm = self._comm, None
                self._lib.onebit_comm_destroy(comm)

    def abort(self):
        """c10d's abort: the queued compressed calls fail without running (their Work raises) and
        nothing waits; the communicator is released by the next close() (destroy_process_group or
        the exit hook), once the call in flight, if any, has ended."""
        self._compressed_calls.abort("onebit backend: this process group was aborted before its queued compressed "
                                     "all_reduce ran")

    def close(self):
        """release(), then gloo's shutdown — while Python is whole (destroy_process_group, or the
        atexit hook): at interpreter teardown a gloo thread meeting a half-finalized interpreter
        ended finished jobs with SIGABRT ("terminate called without an active exception")."""
        self.release()
        gloo, self._gloo = self._gloo, None
        if gloo is not None and hasattr(gloo, "shutdown"):
            gloo.shutdown()

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

    def stats(self):
        if self._comm is None:
            return dict(self._final_stats)
        out = _capi.Stats()
        _check(self._lib, self._lib.onebit_comm_stats(self._comm, ctypes.byref(out)))
        return {name: getattr(out, name) for name, _ in _capi.Stats._fields_}


class OnebitBackend(torch._C._distributed_c10d.Backend):
    """The Python form of the onebit backend, for a process where the native one
    (csrc/c10d_backend.cc) cannot be built: gloo for everything, onebit's compressed allreduce for
    tagged tensors.

    Its base is c10d's Backend from torch._C (the way torch documents for third-party backends in
    Python, though not a public API): checked on torch 2.15.0 (the pip venv); Debian's torch 1.13
    has none (register_backend refuses it); torch 2.5 cannot construct one. torch wraps each Work
    it returns in PyWorkHolder (docs/design.md, "The native c10d backend")."""

    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)
        self._gloo_group = _gloo_half(store, rank, size, timeout)
        self._onebit = _Compression(self._gloo_group, rank, size, timeout)

    @property
    def _gloo(self):
        if self._gloo_group is None:
            raise RuntimeError("onebit backend: this process group was destroyed (destroy_process_group)")
        return self._gloo_group

    def shutdown(self):
        """Called by destroy_process_group: releases onebit's communicator and the inner gloo group
        now (_Compression.close)."""
        self._onebit.close()
        self._gloo_group = None

    def getBackendName(self):
        return BACKEND_NAME

    def allreduce(self, *args, **kwargs):
        # Every form gloo's binding accepts (a tensor or a list; opts, or op and timeout): torch
        # calls (tensors, opts), code holding the backend object any of them.
        work = self._onebit.allreduce(*allreduce_arguments(*args, **kwargs))
        return work if work is not None else self._gloo.allreduce(*args, **kwargs)

    def abort(self):
        self._onebit.abort()
        return self._gloo.abort()

    def allreduce_coalesced(self, *args, **kwargs):
        self._onebit.note_coalesced(args[0] if args else kwargs.get("tensors", ()))
        return self._gloo.allreduce_coalesced(*args, **kwargs)

    # Everything else is gloo's, forwarded by _forward.forward_backend_methods below (generated from
    # the installed torch's Backend method table, docs/design.md "The native c10d backend").
    # barrier stays spelled out, as gloo's: it is where this backend's own calls in flight would be
    # waited for.
    def barrier(self, *args, **kwargs):
        # As gloo's barrier, which first waits for the group's work in flight: queued compressed
        # calls end first (their errors stay with their Work).
        self._onebit.drain()
        return self._gloo.barrier(*args, **kwargs)

    def _forward_target(self):
        return self._gloo

    @property
    def supports_splitting(self):
        return True  # split() below: a child group is an onebit backend too

    @property
    def supports_reconfigure(self):
        return False  # a reconfigure would reach gloo's connections, not onebit's

    def split(self, store, ranks, opts):
        return self._onebit.split(store, ranks, opts)  # make_backend: this form, as register_backend chose

    def merge(self, store, opts, rank, size):
        return self._onebit.merge(store, opts, rank, size)

    def stats(self):
        return self._onebit.stats()


FORWARDED = forward_backend_methods(OnebitBackend)  # the names this torch's Backend has and gloo answers

_groups = []  # every _Compression of this process, for onebit.stats() (released ones keep their counts)
_native_backends = []  # every native backend of this process, for _release_all
_coalesced_said = set()  # the tags note_coalesced has warned about
_use_native = None  # register_backend's choice: None (native if it builds), True or False


def make_backend(store, rank, size, timeout):
    """The onebit backend of one group: the native one (csrc/c10d_backend.cc over a gloo backend on
    the same store) unless register_backend chose the Python one or the native one cannot be built
    here (onebit._native says why, once)."""
    module = None if _use_native is False else _native_module(required=_use_native is True)
    if module is None:
        try:
            return OnebitBackend(store, rank, size, timeout)
        except TypeError as failure:  # pybind11's "No constructor defined!": no Python trampoline for Backend
            raise RuntimeError(f"onebit backend: torch {torch.__version__} cannot run a c10d Backend written in Python "
                               f"({failure}), and the native backend is not available here: build it (a C++ compiler "
                               "and ninja; docs/usage.md, \"Which torch\") or use a newer torch") from None
    gloo = _gloo_half(store, rank, size, timeout)
    backend = module.OnebitBackend(gloo, _Compression(gloo, rank, size, timeout))
    _native_backends.append(backend)  # shut down at exit if torch has not (it drops gloo without the GIL)
    return backend


def wait_for_compressed_calls():
    """Returns once every backend's queued compressed calls have run: what onebit.tag and
    onebit.untag call before they change a tag, since a queued call finds its tag by address when
    it runs, and must find on every rank what the program had tagged when it issued the call."""
    for group in list(_groups):
        group.drain()


_release_lock = threading.Lock()
_registered = False


@atexit.register
def _release_all():
    """At interpreter exit, before its teardown: every group not destroyed by then releases its
    communicator and gloo backend (see _Compression.close; a native backend's shutdown then drops
    gloo itself, csrc/c10d_backend.cc)."""
    def release(what):
        try:
            what()
        except Exception as failure:  # the others are still released
            logger.warning("releasing an onebit group at exit failed: %s", failure)
    for backend in _native_backends:
        release(lambda: backend.shutdown())  # closes its _Compression too
    for group in _groups:
        release(group.close)  # the Python form's, and any a shutdown left (close is idempotent)


def register_backend(native=None):
    """Registers the "onebit" backend with torch.distributed (idempotent).

    Args:
        native: which form later groups take: None (the default) the native c10d backend when it
            can be built here, else the Python one with a warning; True the native one or a
            RuntimeError saying why not; False the Python one (docs/usage.md, "Which torch").
    """
    global _registered, _use_native
    _use_native = native
    if _registered:
        return
    dist.Backend.register_backend(BACKEND_NAME, make_backend, devices=["cpu"])
    _registered = True


def backend_stats():
    """What every onebit backend of this process did, as onebit.stats() reports it."""
    total = {name: 0 for name, _ in _capi.Stats._fields_}
    total.update(forwarded_calls=0, forwarded_bytes=0)
    for group in _groups:
        for name, value in group.stats().items():
            total[name] += value
        total["forwarded_calls"] += group.forwarded_calls
        total["forwarded_bytes"] += group.forwarded_bytes
    return total
