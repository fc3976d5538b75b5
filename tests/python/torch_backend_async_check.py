"""The onebit backend's Work objects and tag lifetime (python/onebit/backend.py), with pip's torch,
2 ranks as processes over a file store. Each mode is one job; a rank fails naming what differed:

  returns-at-once  rank 0's async tagged all_reduce returns before rank 1 has issued its own (rank 1
                   waits for rank 0's word in a side store first: a call that blocked would never
                   return, and rank 1 fails at the store's timeout), then both complete.
  exact            3 async tagged calls + wait() equal the float64 reference of docs/algorithm.md,
                   and bitwise the same inputs through synchronous calls on a twin tag issued
                   between them (a synchronous call queued behind an async one keeps call order).
  untag-after-async  onebit.untag right after an async tagged call, before its wait(): the call
                   still runs compressed on every rank (untag waits for queued calls).
  in-flight        4 async tagged calls on 4 tags and an untagged async call in flight at once,
                   waited in reverse order: each tag equals its reference, the untagged sum is exact.
  future           get_future().then(...) of an async tagged call gives the callback's value (twice
                   the result, bitwise); the future's value is the list of tensors.
  error            rank 1's input holds a NaN: the async call's wait() raises RuntimeError naming the
                   tag on every rank, its future's wait() raises too, the buffers are unchanged; the
                   next call of the tag equals the reference's first call (error state unchanged).
  work-state       after wait(): wait() True, is_completed() and is_success() True, result() gives
                   the tensors and the future is done with them, for tagged calls (compressed:
                   the group's compressed-call count grows by one each) and forwarded ones, through
                   the group object (group.allreduce([t], opts)), the backend object and
                   dist.all_reduce.
  coalesced        all_reduce_coalesced([tagged, untagged]) twice: gloo's exact sums for both, no
                   compressed call, one warning naming the tag; the tag's own all_reduce is then
                   compressed.
  abort            rank 1 queues two tagged calls rank 0 has not issued and aborts the group: abort
                   returns at once (rank 0 waits for its word, 60 s at most), the queued call's
                   wait() raises "aborted" with its tensor untouched, and the call in flight, if
                   one was, completes when rank 0 issues its twin.
  tag-lifetime     a tensor tagged (onebit.tag) and dropped without untag, an OnebitAdam dropped
                   without close(), and a tagged tensor dropped while its async all_reduce is in
                   flight (gone after its Work and a barrier): each address leaves onebit's tag
                   table, and a new tensor of the same size (allocated until one lands at the freed
                   address, 8 tries) all_reduces integer-valued data exactly (the float64 sum), not
                   compressed; and a tensor over memory the test keeps (torch.frombuffer), tagged
                   and dropped, then a new one over the same memory: the same address by
                   construction, its sum exact.

    PYTHON tests/python/torch_backend_async_check.py BUILD_DIR [onebit] [MODE ...]
"""
import datetime
import gc
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools", "gpu"))
sys.path.insert(0, HERE)
from modes import require, rank_or_driver  # noqa: E402

WORLD = 2
N = 5003


def _near_reference(torch, got, want, what):
    from reference import mismatches
    bad = mismatches(got, want, 1e-4)
    require(bad <= got.numel() // 10000 + 1, f"{what}: {bad} of {got.numel()} elements off the float64 reference")


def returns_at_once(mode, rank, torch, dist, onebit, tmp):
    side = dist.FileStore(os.path.join(tmp, "side-returns-at-once"), WORLD)
    t = torch.full((N,), float(rank + 1))
    onebit.tag(t, "at-once")
    if rank == 0:
        work = dist.all_reduce(t, async_op=True)  # rank 1 has not issued its call: this must not block
        side.set("issued", "rank 0's call returned")
        work.wait()
    else:
        side.set_timeout(datetime.timedelta(seconds=60))
        try:
            side.wait(["issued"])
            late = None
        except RuntimeError as error:  # the store's timeout
            late = error
        require(late is None, f"rank 0's async all_reduce did not return before rank 1 issued its own: {late}")
        dist.all_reduce(t, async_op=True).wait()
    require(torch.equal(t, torch.full_like(t, 3.0)), f"sum {t[:3].tolist()}, want 3 (constant inputs compress exactly)")
    print(f"rank {rank}: the async call returned before the peer issued its own; sum 3", flush=True)


def exact(mode, rank, torch, dist, onebit, tmp):
    from reference import Reference, inputs_of
    queued, twin = torch.zeros(N), torch.zeros(N)
    onebit.tag(queued, "queued")
    onebit.tag(twin, "twin")
    reference = Reference(WORLD, N)
    for call in range(3):
        queued.copy_(inputs_of("exact", N, rank, call))
        twin.copy_(queued)
        work = dist.all_reduce(queued, async_op=True)
        dist.all_reduce(twin)  # synchronous, behind the queued call on every rank
        require(work.wait() is True, f"call {call}: wait() did not return True")
        want = reference.step([inputs_of("exact", N, r, call) for r in range(WORLD)])
        _near_reference(torch, queued, want, f"async call {call}")
        require(torch.equal(queued, twin), f"call {call}: the async result differs from the synchronous one "
                f"({int((queued != twin).sum())} elements)")
    require(onebit.stats()["compressed_calls"] == 6, f"{onebit.stats()['compressed_calls']} compressed calls, want 6")
    print(f"rank {rank}: 3 async calls equal the float64 reference and the synchronous twin bitwise", flush=True)


def untag_after_async(mode, rank, torch, dist, onebit, tmp):
    from reference import Reference, inputs_of
    t = inputs_of("untagged-soon", N, rank, 0)
    onebit.tag(t, "untagged-soon")
    work = dist.all_reduce(t, async_op=True)
    onebit.untag(t)  # waits for the queued call, which must still find t tagged on every rank
    work.wait()
    _near_reference(torch, t, Reference(WORLD, N).step([inputs_of("untagged-soon", N, r, 0) for r in range(WORLD)]),
                    "an async call untagged before its wait()")
    require(onebit.stats()["compressed_calls"] == 1, f"{onebit.stats()['compressed_calls']} compressed calls, want 1")
    print(f"rank {rank}: untag right after an async call: the call still ran compressed", flush=True)


def in_flight(mode, rank, torch, dist, onebit, tmp):
    from reference import Reference, inputs_of
    names = [f"flight-{k}" for k in range(4)]
    tensors = [inputs_of(name, N + k, rank, 0) for k, name in enumerate(names)]
    for t, name in zip(tensors, names):
        onebit.tag(t, name)
    plain = torch.arange(1000, dtype=torch.float32) * (rank + 1)
    works = [dist.all_reduce(t, async_op=True) for t in tensors[:2]]
    works.append(dist.all_reduce(plain, async_op=True))  # untagged: to gloo, between the tagged ones
    works += [dist.all_reduce(t, async_op=True) for t in tensors[2:]]
    for work in reversed(works):
        work.wait()
    for k, (t, name) in enumerate(zip(tensors, names)):
        want = Reference(WORLD, N + k).step([inputs_of(name, N + k, r, 0) for r in range(WORLD)])
        _near_reference(torch, t, want, f"tag {name}")
    require(torch.equal(plain, torch.arange(1000, dtype=torch.float32) * 3), "the untagged async sum is not exact")
    print(f"rank {rank}: 4 tagged and 1 untagged async calls in flight, waited in reverse: all right", flush=True)


def future(mode, rank, torch, dist, onebit, tmp):
    from reference import inputs_of
    t, twin = inputs_of("future", N, rank, 0), inputs_of("future", N, rank, 0)
    onebit.tag(t, "future")
    onebit.tag(twin, "future-twin")
    fut = dist.all_reduce(t, async_op=True).get_future()
    doubled = fut.then(lambda f: f.value()[0] * 2)
    dist.all_reduce(twin)
    require(torch.equal(doubled.wait(), twin * 2), "the .then() callback's value is not twice the result")
    value = fut.value()
    require(isinstance(value, list) and len(value) == 1 and value[0].data_ptr() == t.data_ptr(),
            f"the future's value is {type(value).__name__}, not the list of the reduced tensor")
    print(f"rank {rank}: get_future().then() gives twice the result", flush=True)


def error(mode, rank, torch, dist, onebit, tmp):
    from reference import Reference, inputs_of
    t = inputs_of("error", N, rank, 0)
    if rank == 1:
        t[17] = float("nan")
    onebit.tag(t, "poisoned")
    before = t.clone()
    work = dist.all_reduce(t, async_op=True)
    try:
        work.wait()
        message = None
    except RuntimeError as failure:
        message = str(failure)
    require(message is not None, "wait() returned for a call whose input held a NaN")
    require("poisoned" in message, f"the error does not name the tag: {message}")
    try:
        work.get_future().wait()
        require(False, "the future of a failed call completed without an error")
    except RuntimeError as failure:
        require("poisoned" in str(failure), f"the future's error does not name the tag: {failure}")
    require(torch.equal(t.view(torch.int32), before.view(torch.int32)), "the failed call changed the buffer")
    t.copy_(inputs_of("error", N, rank, 1))
    dist.all_reduce(t, async_op=True).wait()  # the communicator stays usable, the error state unchanged
    _near_reference(torch, t, Reference(WORLD, N).step([inputs_of("error", N, r, 1) for r in range(WORLD)]),
                    "the call after the failed one")
    print(f"rank {rank}: wait() raised: {message.splitlines()[0][:200]}", flush=True)


def work_state(mode, rank, torch, dist, onebit, tmp):
    group = dist.distributed_c10d._get_default_group()
    opts = dist.AllreduceOptions()
    opts.asyncOp = True
    tagged, plain = torch.full((N,), float(rank + 1)), torch.full((N,), float(rank + 1))
    onebit.tag(tagged, "state")
    backend = group._get_backend(torch.device("cpu"))
    calls = (("group.allreduce", lambda t: group.allreduce([t], opts)),
             ("backend.allreduce", lambda t: backend.allreduce([t], opts)),
             ("dist.all_reduce", lambda t: dist.all_reduce(t, async_op=True)))
    for what, t in (("tagged", tagged), ("forwarded", plain)):
        for how, issue in calls:
            t.fill_(rank + 1)
            compressed = onebit.stats()["compressed_calls"]
            work = issue(t)
            require(work.wait() is True, f"{what} ({how}): wait() did not return True")
            require(work.is_completed() and work.is_success(), f"{what} ({how}): not completed after wait()")
            result = work.result()
            require(len(result) == 1 and torch.equal(result[0], torch.full_like(t, 3.0)),
                    f"{what} ({how}): result() is not the reduced tensor")
            fut = work.get_future()
            require(fut.done() and torch.equal(fut.value()[0], torch.full_like(t, 3.0)),
                    f"{what} ({how}): the future is not done with the reduced tensor after wait()")
            want = compressed + (1 if what == "tagged" else 0)
            require(onebit.stats()["compressed_calls"] == want, f"{what} ({how}): compressed calls "
                    f"{onebit.stats()['compressed_calls']}, expected {want}")
    print(f"rank {rank}: tagged and forwarded Work complete after wait(), result() gives the tensors", flush=True)


def _lands_at(torch, address, n):
    """A new float32 tensor of `n` elements at `address` if one of 8 allocations lands there, else
    the last one (the earlier ones held meanwhile, so that each try gets other memory)."""
    held = []
    for _ in range(8):
        fresh = torch.empty(n)
        if fresh.data_ptr() == address:
            return fresh, True
        held.append(fresh)
    return held[-1], False


def _reduces_exactly(torch, dist, onebit, rank, fresh, what):
    from onebit import _tagged_dtype
    require(_tagged_dtype(fresh) is None, f"{what}: a fresh tensor at the freed address is taken as tagged")
    values = torch.arange(fresh.numel(), dtype=torch.float64) % 1000
    fresh.copy_(values * (rank + 1))
    before = onebit.stats()["compressed_calls"]
    dist.all_reduce(fresh, async_op=True).wait()
    require(onebit.stats()["compressed_calls"] == before, f"{what}: the fresh tensor's all_reduce was compressed")
    want = sum(values * (r + 1) for r in range(WORLD))
    require(torch.equal(fresh.double(), want), f"{what}: the sum is not exact ({fresh[:4].tolist()} ...)")


def tag_lifetime(mode, rank, torch, dist, onebit, tmp):
    from onebit import _tags
    reused = []
    # A user's tag, dropped without untag.
    dropped = torch.zeros(4096)
    onebit.tag(dropped, "dropped")
    address = dropped.data_ptr()
    dropped.fill_(1.0)
    dist.all_reduce(dropped)
    del dropped
    require(address not in _tags, "a freed tagged tensor's address is still in onebit's tag table")
    fresh, hit = _lands_at(torch, address, 4096)
    reused.append(hit)
    _reduces_exactly(torch, dist, onebit, rank, fresh, "tag then del")
    del fresh
    # An optimizer dropped without close(): its momentum was tagged.
    model = torch.nn.Linear(64, 64)
    optimizer = onebit.OnebitAdam(model.parameters(), lr=1e-3, freeze_step=1)
    address, n = optimizer._m.data_ptr(), optimizer._m.numel()
    require(address in _tags, "OnebitAdam's momentum is not tagged")
    del optimizer
    gc.collect()  # an optimizer in a reference cycle goes at the next collection
    require(address not in _tags, "a dropped OnebitAdam's momentum address is still in onebit's tag table")
    fresh, hit = _lands_at(torch, address, n)
    reused.append(hit)
    _reduces_exactly(torch, dist, onebit, rank, fresh, "OnebitAdam dropped without close()")
    del fresh
    # A tagged tensor dropped while its async all_reduce is in flight: the call keeps it alive.
    flying = torch.full((4096,), float(rank + 1))
    onebit.tag(flying, "flying")
    address = flying.data_ptr()
    work = dist.all_reduce(flying, async_op=True)
    del flying
    require(torch.equal(work.get_future().wait()[0], torch.full((4096,), 3.0)), "the in-flight call's sum")
    del work
    dist.barrier()  # as gloo's, it first waits for the calls in flight: the worker holds no tensor of theirs
    require(address not in _tags, "a tagged tensor freed after its async call still has its address tagged")
    fresh, hit = _lands_at(torch, address, 4096)
    reused.append(hit)
    _reduces_exactly(torch, dist, onebit, rank, fresh, "dropped during an async call")
    # The same address by construction: tensors over memory the test keeps (the allocator may
    # place the fresh tensors above elsewhere).
    memory = bytearray(4096 * 4)
    over = torch.frombuffer(memory, dtype=torch.float32)
    onebit.tag(over, "over-kept-memory")
    address = over.data_ptr()
    del over
    require(address not in _tags, "a freed tagged tensor over kept memory still has its address tagged")
    fresh = torch.frombuffer(memory, dtype=torch.float32)
    require(fresh.data_ptr() == address, "torch.frombuffer of the same memory gave another address")
    _reduces_exactly(torch, dist, onebit, rank, fresh, "a new tensor over the freed tagged tensor's memory")
    print(f"rank {rank}: 4 freed tags gone; fresh tensors at the freed addresses {reused + [True]}; sums exact",
          flush=True)


def coalesced(mode, rank, torch, dist, onebit, tmp):
    import logging
    said = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())
    logging.getLogger("onebit").addHandler(handler)
    tagged, plain = torch.full((N,), float(rank + 1)), torch.arange(7, dtype=torch.float32) * (rank + 1)
    onebit.tag(tagged, "coalesced")
    before = onebit.stats()["compressed_calls"]
    for _ in range(2):
        tagged.fill_(rank + 1), plain.copy_(torch.arange(7, dtype=torch.float32) * (rank + 1))
        dist.all_reduce_coalesced([tagged, plain], async_op=True).wait()
        require(torch.equal(tagged, torch.full_like(tagged, 3.0)) and torch.equal(plain, torch.arange(7.0) * 3),
                "all_reduce_coalesced of a tagged and an untagged tensor: not gloo's exact sums")
    require(onebit.stats()["compressed_calls"] == before, "all_reduce_coalesced compressed a call")
    notes = [m for m in said if "all_reduce_coalesced of the tagged tensor 'coalesced' runs uncompressed" in m]
    require(len(notes) == 1, f"the uncompressed coalesced call is said once per tag, got {said}")
    dist.all_reduce(tagged)
    require(onebit.stats()["compressed_calls"] == before + 1, "the tagged tensor's own all_reduce was not compressed")
    logging.getLogger("onebit").removeHandler(handler)
    onebit.untag(tagged)
    print(f"rank {rank}: all_reduce_coalesced with a tagged member: gloo's exact sums, said once", flush=True)


def abort(mode, rank, torch, dist, onebit, tmp):
    side = dist.FileStore(os.path.join(tmp, "side-abort"), WORLD)
    side.set_timeout(datetime.timedelta(seconds=60))
    first, second = torch.full((N,), float(rank + 1)), torch.full((N,), float(rank + 1))
    onebit.tag(first, "abort-first")
    onebit.tag(second, "abort-second")
    if rank == 1:
        backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
        running = dist.all_reduce(first, async_op=True)  # rank 0 has not issued it: in flight, or still queued
        queued = dist.all_reduce(second, async_op=True)
        backend.abort()  # must return with the first call unfinished: rank 0 waits for this word, 60 s at most
        in_flight = not running.is_completed()
        side.set("aborted", "in flight" if in_flight else "dropped")
        def require_aborted(work, tensor, what):
            """`work` failed with 'aborted' and left `tensor` as rank 1 filled it."""
            try:
                work.wait()
                failed = None
            except RuntimeError as error:
                failed = str(error)
            require(failed is not None and "aborted" in failed, f"the {what} call's wait() after abort: {failed}")
            require(torch.equal(tensor, torch.full_like(tensor, 2.0)), f"the {what} call changed its tensor")
        require_aborted(queued, second, "queued")
        if in_flight:
            running.wait()
            require(torch.equal(first, torch.full_like(first, 3.0)), "the call in flight at abort did not complete")
        else:  # dropped before it ran: failed like the queued one
            require_aborted(running, first, "dropped")
        print(f"rank 1: abort returned at once (first call {'in flight' if in_flight else 'dropped'}); the queued "
              "call's wait() raised 'aborted', its tensor untouched", flush=True)
    else:
        try:
            side.wait(["aborted"])
            word = side.get("aborted").decode()
        except RuntimeError as error:  # the store's timeout: rank 1's abort waited for the calls
            word = f"no word from rank 1's abort ({error})"
        require(word in ("in flight", "dropped"), word)
        if word == "in flight":
            dist.all_reduce(first)  # pairs with rank 1's call in flight
    onebit.untag(first)
    onebit.untag(second)


CASES = {"returns-at-once": returns_at_once, "exact": exact, "untag-after-async": untag_after_async,
         "in-flight": in_flight, "future": future,
         "error": error, "work-state": work_state, "coalesced": coalesced, "abort": abort,
         "tag-lifetime": tag_lifetime}


def rank_env(mode, rank, env):
    return dict(env, OMP_NUM_THREADS="1")


if __name__ == "__main__":
    if len(sys.argv) == 2:  # the driver with the onebit door by default
        sys.argv.append("onebit")
    sys.exit(rank_or_driver(__file__, CASES, list(CASES), WORLD, rank_env=rank_env, doc=__doc__))
