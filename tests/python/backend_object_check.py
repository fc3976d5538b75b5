"""The onebit backend as a c10d citizen (issue 30), 2 ranks with a PyTorch 2.x from pip: what
test_c10d_gloo.py's ProcessGroupGlooTest checks on a gloo object, checked here on the onebit
default group, each against the same call on a plain gloo group of the same job (so "exact" means
bit for bit what gloo gives):

  - the structure: the default group's CPU backend is onebit's native OnebitBackend;
  - the group object's overloads: allreduce(t), allreduce([t]), allreduce([t], op=MAX),
    allreduce([t], AllreduceOptions), broadcast(x, root=...), broadcast([x], BroadcastOptions),
    allreduce_coalesced(ts); the Work they return is gloo's own: is_completed() and result() after
    wait();
  - through torch.distributed on the onebit group: all_gather_into_tensor, all_gather_object,
    all_reduce of a sparse tensor, reduce_scatter_tensor, all_to_all_single (unequal splits), all_to_all, gather, scatter, reduce,
    monitored_barrier (and wait_all_ranks), batch_isend_irecv, send/recv with src, isend/irecv, the
    group's sequence number; supports_reconfigure False;
  - Work through torch.distributed: wait() True, get_future(), is_completed(), is_success(),
    result(); isend/irecv completed after wait(), irecv's source rank, recv without src;
  - groups: new_group, split_group and merge_remote_group make onebit groups whose all_reduce is
    exact and whose tagged all_reduce is compressed (a split into one group per rank, and those
    merged again, included); destroy and re-init the default group.

    PYTHON tests/python/backend_object_check.py BUILD_DIR
Exit 77 (a skip, with the reason) when this PYTHON's torch has no c10d Backend class.
"""
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, HERE)

WORLD = 2
failures = []
# What torch itself refuses to every backend registered through Backend.register_backend (its
# backend name is not "gloo", its type is CUSTOM) before any call reaches onebit: torch 2.5 and 2.8
# (docs/benchmarks/torch-suites.md, "Older torch"); not torch 2.15, where the c10d suite's monitored_barrier tests
# in the test command would fail.
TORCH_REFUSES_CUSTOM = ("monitored_barrier is only implemented for GLOO backend", "does not yet support sequence numbers")


def check(rank, ok, what):
    if not ok:
        failures.append(what)
        print(f"rank {rank}: FAIL: {what}", flush=True)


def rank_main(mode, rank, store):
    import torch
    import torch.distributed as dist
    import onebit
    onebit.register_backend()
    dist.init_process_group("onebit", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    cpu = torch.device("cpu")
    plain = dist.new_group(backend="gloo")
    expected = "onebit_c10d"  # the native extension's module
    backend = dist.group.WORLD._get_backend(cpu)
    check(rank, type(backend).__name__ == "OnebitBackend" and type(backend).__module__.startswith(expected)
          and dist.get_backend() == "onebit" and backend.name() == "onebit",
          f"the default group's backend is onebit's native one ({type(backend).__module__}.{type(backend).__name__}, "
          f"{dist.get_backend()}, {backend.name()})")
    check(rank, not hasattr(torch._C._distributed_c10d.Backend, "supports_reconfigure")  # torch 2.5, 2.8: none
          or backend.supports_reconfigure is False, "supports_reconfigure False (a reconfigure would miss onebit's connections)")
    peer = 1 - rank

    def both(call, make, objects):
        """call(object, *inputs) on the onebit and the gloo object with equal fresh inputs."""
        a, b = make(), make()
        wa, wb = call(objects[0], *a), call(objects[1], *b)
        return a, b, wa, wb

    def values(rank_scale=1.0, n=7):
        return torch.arange(n, dtype=torch.float32) * (rank + 1) * rank_scale + 0.25

    # The overloads of the group and of the backend object, as c10d's pybind11 bindings take them.
    forms = {
        "allreduce(t)": lambda be, t: be.allreduce(t),
        "allreduce([t])": lambda be, t: be.allreduce([t]),
        "allreduce([t], op=MAX)": lambda be, t: be.allreduce([t], op=dist.ReduceOp.MAX),
        "allreduce([t], AllreduceOptions(PRODUCT))": lambda be, t: be.allreduce([t], _opts(dist.AllreduceOptions(), reduceOp=dist.ReduceOp.PRODUCT)),
        "broadcast(x, root=1)": lambda be, t: be.broadcast(t, root=1),
        "broadcast([x], BroadcastOptions(rootRank=0))": lambda be, t: be.broadcast([t], _opts(dist.BroadcastOptions(), rootRank=0)),
    }
    objects = {"group": (dist.group.WORLD, plain), "backend": (backend, plain._get_backend(cpu))}
    for (what, call), (kind, pair) in ((f, o) for f in forms.items() for o in objects.items()):
        what = f"{kind}.{what}"
        try:
            (a,), (b,), wa, wb = both(call, lambda: (values(),), pair)
        except Exception as e:  # gloo takes every one of these forms
            check(rank, False, f"{what}: raises {type(e).__name__}: {str(e).splitlines()[0]}")
            continue
        check(rank, wa.wait() is True and wb.wait() is True, f"{what}: wait() returns True")
        check(rank, torch.equal(a, b), f"{what}: {a.tolist()} where gloo gives {b.tolist()}")
        check(rank, type(wa) is type(wb) and wa.is_completed() and wa.is_success(),
              f"{what}: the Work is gloo's, completed after wait() ({type(wa).__name__}, is_completed {wa.is_completed()})")
        check(rank, [torch.equal(x, y) for x, y in zip(wa.result(), wb.result())] == [True] * len(wb.result()),
              f"{what}: Work.result() as gloo's")
    a, b, wa, wb = both(lambda be, *ts: be.allreduce_coalesced(list(ts)), lambda: (values(n=3), values(2.0, 5)),
                        objects["backend"])
    wa.wait(), wb.wait()
    check(rank, all(torch.equal(x, y) for x, y in zip(a, b)), "allreduce_coalesced(ts) as gloo's")

    # Through torch.distributed: the default (onebit) group against group=plain.
    def same(what, run):
        try:
            b = run(plain)
        except Exception as e:  # what this torch's gloo refuses (all_to_all on torch 2.5) onebit refuses alike
            try:
                run(None)
                check(rank, False, f"{what}: returns where gloo raises {type(e).__name__}")
            except Exception as e2:
                check(rank, str(e2) == str(e), f"{what}: raises {e2} where gloo raises {e}")
            return
        try:
            a = run(None)
        except Exception as e:  # on gloo it returned
            check(rank, _torch_refuses_custom(rank, what, e), f"{what}: raises {type(e).__name__}: {str(e).splitlines()[0]}")
            return
        equal = a == b if not isinstance(a, (torch.Tensor, list, tuple)) else _equal(a, b)
        check(rank, equal, f"{what}: {a} where gloo gives {b}")

    same("all_gather_into_tensor", lambda g: _out(lambda o: dist.all_gather_into_tensor(o, values(n=3), group=g), torch.zeros(3 * WORLD)))
    same("all_gather_object", lambda g: _gathered_objects(dist, g, {"rank": rank, "name": f"r{rank}"}))
    same("reduce_scatter_tensor", lambda g: _out(lambda o: dist.reduce_scatter_tensor(o, values(n=2 * WORLD), group=g), torch.zeros(2)))
    splits = [[1, 2], [3, 1]]  # rank r sends splits[r][j] elements to rank j
    same("all_to_all_single (unequal splits)", lambda g: _out(lambda o: dist.all_to_all_single(
        o, values(n=sum(splits[rank])), [splits[j][rank] for j in range(WORLD)], splits[rank], group=g),
        torch.zeros(sum(splits[j][rank] for j in range(WORLD)))))
    same("all_to_all", lambda g: _outs(lambda os_: dist.all_to_all(os_, [values(float(j + 1), 2) for j in range(WORLD)], group=g),
                                       [torch.zeros(2) for _ in range(WORLD)]))
    same("gather to 1", lambda g: _outs(lambda os_: dist.gather(values(), os_ if rank == 1 else None, dst=1, group=g),
                                        [torch.zeros(7) for _ in range(WORLD)] if rank == 1 else []))
    same("scatter from 0", lambda g: _out(lambda o: dist.scatter(o, [values(float(j + 3)) for j in range(WORLD)] if rank == 0 else None,
                                                                 src=0, group=g), torch.zeros(7)))
    same("reduce MIN to 0", lambda g: _out(lambda o: (o.copy_(values()), dist.reduce(o, dst=0, op=dist.ReduceOp.MIN, group=g)), torch.zeros(7)))
    same("all_reduce of a sparse tensor", lambda g: _out(lambda x: dist.all_reduce(x, group=g),
                                                         torch.sparse_coo_tensor([[rank, 2]], [1.0 + rank, 0.5], (3,))).to_dense())
    same("monitored_barrier", lambda g: dist.monitored_barrier(group=g))
    same("monitored_barrier(wait_all_ranks=True)", lambda g: dist.monitored_barrier(group=g, wait_all_ranks=True))

    def ring(g):
        got = torch.zeros(4)
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, values(n=4), peer, group=g),
                                        dist.P2POp(dist.irecv, got, peer, group=g)])
        return [w.wait() for w in works], got
    same("batch_isend_irecv", ring)

    def p2p(g):
        got, got2 = torch.zeros(5), torch.zeros(5)
        if rank == 0:
            dist.send(values(n=5), 1, group=g)
            dist.recv(got, 1, group=g)
        else:
            dist.recv(got, 0, group=g)
            dist.send(values(n=5), 0, group=g)
        w = dist.isend(values(2.0, 5), peer, group=g), dist.irecv(got2, peer, group=g)
        return [x.wait() for x in w], got, got2
    same("send/recv with src, isend/irecv", p2p)

    try:
        before = dist.group.WORLD._get_sequence_number_for_group(), plain._get_sequence_number_for_group()
        dist.all_reduce(values()), dist.all_reduce(values(), group=plain)
        after = dist.group.WORLD._get_sequence_number_for_group(), plain._get_sequence_number_for_group()
        check(rank, after[0] - before[0] == after[1] - before[1] == 1,
              f"the sequence number counts one collective as gloo's does: {before} -> {after} (onebit, gloo)")
    except RuntimeError as e:
        check(rank, _torch_refuses_custom(rank, "the group's sequence number", e), f"the sequence number: {e}")

    work_contract(rank, torch, dist, onebit, values)
    tagged = torch.full((64,), float(rank + 1))
    onebit.tag(tagged, "object-coalesced")
    before = onebit.stats()["compressed_calls"]
    dist.all_reduce_coalesced([tagged, values()])
    check(rank, torch.equal(tagged, torch.full((64,), 3.0)) and onebit.stats()["compressed_calls"] == before,
          "all_reduce_coalesced with a tagged member: gloo's exact sum, nothing compressed")
    onebit.untag(tagged)

    # Groups: new_group, split_group (one group of both ranks, and one group per rank), where this
    # torch splits CPU groups (ProcessGroup.split_group; torch 2.8's dist.split_group is NCCL's only),
    # and merge_remote_group.
    groups = [("new_group", lambda: dist.new_group([0, 1]), WORLD)]
    if hasattr(dist.ProcessGroup, "split_group"):
        groups += [("split_group([[0, 1]])", lambda: dist.split_group(split_ranks=[[0, 1]]), WORLD),
                   ("split_group([[0], [1]])", lambda: dist.split_group(split_ranks=[[0], [1]]), 1)]
    for what, make, size in groups:
        g = make()
        x = values()
        dist.all_reduce(x, group=g)
        want = values() if size == 1 else sum(torch.arange(7, dtype=torch.float32) * (r + 1) + 0.25 for r in range(WORLD))
        made = type(g._get_backend(cpu))
        check(rank, dist.get_backend(g) == "onebit" and made is type(backend),
              f"{what}: an onebit group ({dist.get_backend(g)}, {made.__module__}.{made.__name__})")
        check(rank, g.size() == size and torch.equal(x, want), f"{what}: size {g.size()}, all_reduce {x.tolist()}")
        compressed_once(rank, torch, dist, onebit, g, what)
        if size == 1 and hasattr(g, "merge_remote_group"):
            merge(rank, dist, onebit, g, store, type(backend))
        dist.destroy_process_group(g)

    # Destroy and re-init: a second default group on a fresh store works as the first.
    dist.destroy_process_group()
    dist.init_process_group("onebit", init_method=f"file://{store}.again", rank=rank, world_size=WORLD)
    x = values()
    dist.all_reduce(x)
    check(rank, torch.equal(x, sum(torch.arange(7, dtype=torch.float32) * (r + 1) + 0.25 for r in range(WORLD))),
          f"after destroy and re-init: all_reduce {x.tolist()}")
    dist.destroy_process_group()
    if failures:
        sys.exit(4)
    print(f"rank {rank}: ok", flush=True)


def _torch_refuses_custom(rank, what, error):
    """Whether `error` is one of torch's refusals of every custom backend, on a torch older than
    2.15 (printed when it is): on 2.15 and later it is a failure."""
    import torch
    older = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) < (2, 15)
    if older and any(text in str(error) for text in TORCH_REFUSES_CUSTOM):
        print(f"rank {rank}: {what}: torch refuses it to every custom backend: {str(error).splitlines()[0]}", flush=True)
        return True
    return False


def work_contract(rank, torch, dist, onebit, values):
    """Work through torch.distributed: the Work of untagged calls is gloo's own and answers as
    c10d's (is_completed, is_success, result, a recv's source rank), a tagged call's Work too."""
    t = values()
    w = dist.all_reduce(t, async_op=True)
    check(rank, w.wait() is True, "dist.all_reduce(async_op=True).wait() returns True")
    check(rank, _equal(w.get_future().value(), [t]), "get_future() holds the all_reduce's tensors")
    check(rank, w.is_completed() and w.is_success() and _equal(w.result(), [t]),
          "dist.all_reduce's Work: is_completed(), is_success() and result() after wait()")
    tagged = torch.full((64,), float(rank + 1))
    onebit.tag(tagged, "object-work")
    w = dist.all_reduce(tagged, async_op=True)
    check(rank, w.wait() is True and w.is_completed() and w.is_success() and _equal(w.result(), [tagged])
          and _equal(w.get_future().value(), [tagged]), "a tagged all_reduce's Work answers as c10d's after wait()")
    onebit.untag(tagged)
    got = torch.zeros(3)
    if rank == 0:
        w = dist.isend(torch.full((3,), 7.0), 1)
        check(rank, w.wait() and w.is_completed(), "isend's Work is_completed() after wait()")
        dist.send(torch.full((3,), 8.0), 1)
    else:
        w = dist.irecv(got)
        check(rank, w.wait() and w.is_completed() and w._source_rank() == 0 and torch.equal(got, torch.full((3,), 7.0)),
              "irecv without src: completed after wait(), its source rank 0, the data")
        source = dist.recv(got)
        check(rank, source == 0 and torch.equal(got, torch.full((3,), 8.0)), f"recv without src returns the source ({source})")


def compressed_once(rank, torch, dist, onebit, group, what):
    """A tagged all_reduce on `group` is one compressed call (onebit.stats() counts it)."""
    before = onebit.stats()["compressed_calls"]
    tagged = torch.full((64,), float(rank + 1))
    onebit.tag(tagged, f"object-{what}")
    dist.all_reduce(tagged, group=group)
    onebit.untag(tagged)
    check(rank, onebit.stats()["compressed_calls"] == before + 1, f"{what}: a tagged all_reduce on the group is compressed")


def merge(rank, dist, onebit, single, store, kind):
    """ProcessGroup.merge_remote_group: the two one-rank groups merged into one of both ranks over
    a store of their own is onebit's; its all_reduce is exact, its tagged one compressed."""
    import datetime
    import torch
    merged = single.merge_remote_group(dist.FileStore(f"{store}.merge", WORLD), WORLD, datetime.timedelta(seconds=60))
    x = torch.full((5,), float(rank + 1))
    dist.all_reduce(x, group=merged)
    made = type(merged._get_backend(torch.device("cpu")))
    check(rank, made is kind and merged.size() == WORLD and torch.equal(x, torch.full((5,), float(sum(range(1, WORLD + 1))))),
          f"merge_remote_group: an onebit group of {merged.size()} ({made.__name__}), all_reduce {x.tolist()}")
    compressed_once(rank, torch, dist, onebit, merged, "merged")
    merged.shutdown()


def _opts(opts, **fields):
    for k, v in fields.items():
        setattr(opts, k, v)
    return opts


def _out(run, out):
    run(out)
    return out


def _outs(run, outs):
    run(outs)
    return outs


def _gathered_objects(dist, group, obj):
    out = [None] * WORLD
    dist.all_gather_object(out, obj, group=group)
    return out


def _equal(a, b):
    import torch
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


def main():
    if len(sys.argv) == 5:  # ranks.run_ranks: MODE RANK STORE TMP
        rank_main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
        return 0
    import torch
    if not hasattr(torch._C._distributed_c10d, "Backend"):
        print(f"SKIP: torch {torch.__version__} has no c10d Backend class (torch >= 2.0 needed)")
        return 77
    from ranks import run_ranks
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS="1",
               ONEBIT_LIBRARY=os.path.join(os.path.abspath(sys.argv[1]), "libonebit.so"))
    env.pop("LD_PRELOAD", None)
    with tempfile.TemporaryDirectory() as tmp:
        for mode in sys.argv[2:] or ("native",):
            run_ranks(os.path.abspath(__file__), mode, WORLD, tmp, env, timeout=240)
    print(f"torch {torch.__version__}, {WORLD} ranks: the onebit backend object's overloads, forwarded collectives, "
          "p2p, monitored_barrier, batch_isend_irecv, groups and re-init as gloo's; Work as documented")
    return 0


if __name__ == "__main__":
    sys.exit(main())
