"""The onebit backend as a c10d citizen (issue 30), 2 ranks with a PyTorch 2.x from pip: what
test_c10d_gloo.py's ProcessGroupGlooTest checks on a gloo backend object, checked here on the
onebit backend object and the onebit default group, each against the same call on a plain gloo
group of the same job (so "exact" means bit for bit what gloo gives):

  - the backend object's overloads: allreduce(t), allreduce([t]), allreduce([t], op=MAX),
    allreduce([t], AllreduceOptions), broadcast(x, root=...), broadcast([x], BroadcastOptions),
    allreduce_coalesced(ts); the Work they return is gloo's own: is_completed() and result() after
    wait();
  - through torch.distributed on the onebit group: all_gather_into_tensor, all_gather_object,
    all_reduce of a sparse tensor, reduce_scatter_tensor, all_to_all_single (unequal splits), all_to_all, gather, scatter, reduce,
    monitored_barrier (and wait_all_ranks), batch_isend_irecv, send/recv with src, isend/irecv, the
    group's sequence number, supports_coalescing as gloo's;
  - groups: new_group and split_group make onebit groups whose all_reduce is exact (a split into
    one group per rank included), destroy and re-init the default group;
  - Work through torch.distributed: wait() returns True and get_future() holds gloo's result; and
    what torch 2.15 cannot give a Python backend (docs/usage.md, "Which torch"): is_completed()
    stays False after wait(), and recv without src raises asking the Work for its source rank —
    asserted, so that a torch which forwards them makes this test fail and the docs get updated.

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


def check(rank, ok, what):
    if not ok:
        failures.append(what)
        print(f"rank {rank}: FAIL: {what}", flush=True)


def rank_main(rank, store):
    import torch
    import torch.distributed as dist
    import onebit
    onebit.register_backend()
    dist.init_process_group("onebit", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    cpu = torch.device("cpu")
    # By construction: every name of this torch's Backend table is the onebit class's own or a
    # forwarder, and so are the names the trampoline looks up under another spelling.
    from onebit import _forward, backend
    table = {n for n, v in vars(torch._C._distributed_c10d.Backend).items()
             if not n.startswith("__") and not isinstance(v, type)} - _forward._KEPT  # Options: a class, inherited
    missing = sorted(n for n in table | set(_forward._TRAMPOLINE_ALIASES.values()) if n not in vars(backend.OnebitBackend))
    check(rank, not missing, f"names of torch's Backend neither defined nor forwarded by OnebitBackend: {missing}")
    plain = dist.new_group(backend="gloo")
    ob, gl = dist.group.WORLD._get_backend(cpu), plain._get_backend(cpu)
    check(rank, type(ob).__name__ == "OnebitBackend" and dist.get_backend() == "onebit", "the default group is onebit's")
    peer = 1 - rank

    def both(call, make):
        """call(backend, *inputs) on the onebit and the gloo backend with equal fresh inputs."""
        a, b = make(), make()
        wa, wb = call(ob, *a), call(gl, *b)
        return a, b, wa, wb

    def values(rank_scale=1.0, n=7):
        return torch.arange(n, dtype=torch.float32) * (rank + 1) * rank_scale + 0.25

    # The backend object's overloads, as gloo's pybind11 ones take them.
    forms = {
        "allreduce(t)": lambda be, t: be.allreduce(t),
        "allreduce([t])": lambda be, t: be.allreduce([t]),
        "allreduce([t], op=MAX)": lambda be, t: be.allreduce([t], op=dist.ReduceOp.MAX),
        "allreduce([t], AllreduceOptions(PRODUCT))": lambda be, t: be.allreduce([t], _opts(dist.AllreduceOptions(), reduceOp=dist.ReduceOp.PRODUCT)),
        "broadcast(x, root=1)": lambda be, t: be.broadcast(t, root=1),
        "broadcast([x], BroadcastOptions(rootRank=0))": lambda be, t: be.broadcast([t], _opts(dist.BroadcastOptions(), rootRank=0)),
    }
    for what, call in forms.items():
        try:
            (a,), (b,), wa, wb = both(call, lambda: (values(),))
        except Exception as e:  # gloo takes every one of these forms
            check(rank, False, f"{what}: raises {type(e).__name__}: {str(e).splitlines()[0]}")
            continue
        check(rank, wa.wait() is True and wb.wait() is True, f"{what}: wait() returns True")
        check(rank, torch.equal(a, b), f"{what}: {a.tolist()} where gloo gives {b.tolist()}")
        check(rank, type(wa) is type(wb) and wa.is_completed() and wa.is_success(),
              f"{what}: the Work is gloo's, completed after wait() ({type(wa).__name__}, is_completed {wa.is_completed()})")
        check(rank, [torch.equal(x, y) for x, y in zip(wa.result(), wb.result())] == [True] * len(wb.result()),
              f"{what}: Work.result() as gloo's")
    a, b, wa, wb = both(lambda be, *ts: be.allreduce_coalesced(list(ts)), lambda: (values(n=3), values(2.0, 5)))
    wa.wait(), wb.wait()
    check(rank, all(torch.equal(x, y) for x, y in zip(a, b)), "allreduce_coalesced(ts) as gloo's")
    check(rank, ob.supports_coalescing == gl.supports_coalescing and ob.supports_splitting,
          "supports_coalescing as gloo's, supports_splitting True")

    # Through torch.distributed: the default (onebit) group against group=plain.
    def same(what, run):
        b = run(plain)
        try:
            a = run(None)
        except Exception as e:  # on gloo it returned
            check(rank, False, f"{what}: raises {type(e).__name__}: {str(e).splitlines()[0]}")
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

    before = dist.group.WORLD._get_sequence_number_for_group(), plain._get_sequence_number_for_group()
    dist.all_reduce(values()), dist.all_reduce(values(), group=plain)
    after = dist.group.WORLD._get_sequence_number_for_group(), plain._get_sequence_number_for_group()
    check(rank, after[0] - before[0] == after[1] - before[1] == 1,
          f"the sequence number counts one collective as gloo's does: {before} -> {after} (onebit, gloo)")

    # Work through torch.distributed (torch wraps a Python backend's Work).
    t = values()
    w = dist.all_reduce(t, async_op=True)
    check(rank, w.wait() is True, "dist.all_reduce(async_op=True).wait() returns True")
    check(rank, _equal(w.get_future().value(), [t]), "get_future() holds the all_reduce's tensors")
    check(rank, not w.is_completed(), "torch 2.15 forwards is_completed() through its PyWorkHolder now: "
          "update docs/usage.md ('Which torch') and c10d_suite.py's KNOWN_TORCH_LIMITS")
    got = torch.zeros(3)
    if rank == 0:
        dist.send(torch.full((3,), 7.0), 1)
    else:
        try:
            dist.recv(got)
            check(rank, False, "recv without src works through torch 2.15's PyWorkHolder now: update docs/usage.md "
                  "('Which torch') and c10d_suite.py's KNOWN_TORCH_LIMITS")
        except RuntimeError as e:
            check(rank, "sourceRank()" in str(e) and torch.equal(got, torch.full((3,), 7.0)),
                  f"recv without src: the data arrives and the source rank is refused by torch's holder ({e})")

    # Groups: new_group, split_group (one group of both ranks, and one group per rank).
    for what, make, size in (("new_group", lambda: dist.new_group([0, 1]), WORLD),
                             ("split_group([[0, 1]])", lambda: dist.split_group(split_ranks=[[0, 1]]), WORLD),
                             ("split_group([[0], [1]])", lambda: dist.split_group(split_ranks=[[0], [1]]), 1)):
        g = make()
        x = values()
        dist.all_reduce(x, group=g)
        want = values() if size == 1 else sum(torch.arange(7, dtype=torch.float32) * (r + 1) + 0.25 for r in range(WORLD))
        check(rank, dist.get_backend(g) == "onebit" and type(g._get_backend(cpu)).__name__ == "OnebitBackend",
              f"{what}: an onebit group ({dist.get_backend(g)})")
        check(rank, g.size() == size and torch.equal(x, want), f"{what}: size {g.size()}, all_reduce {x.tolist()}")
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
        rank_main(int(sys.argv[2]), sys.argv[3])
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
        run_ranks(os.path.abspath(__file__), "object", WORLD, tmp, env, timeout=240)
    print(f"torch {torch.__version__}, {WORLD} ranks: the onebit backend object's overloads, forwarded collectives, "
          "p2p, monitored_barrier, batch_isend_irecv, groups and re-init as gloo's; Work as documented")
    return 0


if __name__ == "__main__":
    sys.exit(main())
