"""gloo's worker threads and the tensors onebit's own code hands them.

ProcessGroupGloo runs each collective on a worker thread, which ends the call by dropping its
reference to the Work. When that reference is the last, the thread frees the Work's tensors, and
freeing a tensor made in Python takes the GIL (c10::TensorImpl::decref_pyobject). A thread that
takes the GIL while the interpreter is finalizing is ended there, and its unwind aborts the process
("terminate called without an active exception"; pytorch issue 190489). So a program whose last
act was onebit's collective followed by an exception could die with SIGABRT instead of its
exception's exit code: rank 0 raising that it cannot serve the bootstrap root did, in a few runs
in a hundred (a reproducer here: 9 aborts in 150; once in CI). Every rank raising that the
optimizers disagree is the same shape (not seen to abort in 66 runs).

returned_by_gloo is the fence: the collectives inside its block have let go of the tensor when the
block ends, and what is left to free is freed by the caller's thread.
"""
import contextlib
import sys
import time

_BOUND_S = 2.0  # a worker thread that has ended its Work needs microseconds; this for a starved machine


@contextlib.contextmanager
def returned_by_gloo(tensor):
    """On leaving the block, waits with the GIL released until the tensor's C++ use count and its
    Python reference count are what they were on entering: no worker thread holds it any more, nor
    is about to take the GIL for it (the count in C++ falls first, the Python one under the GIL).
    Left by an exception, the use count only: the traceback's frames hold Python references of
    their own. At most _BOUND_S, then goes on as before.

    A CPU tensor only (gloo's; NCCL's watchdog may keep a CUDA tensor for long), on a torch with
    Tensor._use_count (a private method; 2.15 has it): elsewhere the block runs as it is."""
    use_count = getattr(tensor, "_use_count", None)
    if use_count is None or tensor.device.type != "cpu":
        yield
        return
    before = (use_count(), sys.getrefcount(tensor))
    try:
        yield
    except BaseException:
        _wait_while(lambda: use_count() > before[0])
        raise
    _wait_while(lambda: use_count() > before[0] or sys.getrefcount(tensor) > before[1])


def _wait_while(held):
    deadline = time.monotonic() + _BOUND_S
    while held() and time.monotonic() < deadline:
        time.sleep(0.0005)  # no event marks the letting go, so polled; the GIL released for the worker
