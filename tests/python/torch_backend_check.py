"""The onebit torch.distributed backend (python/onebit/backend.py) with a PyTorch 2.x from pip, W
ranks as processes over a file store. Each rank checks, naming what failed:
  - tagged float32 and float16 all_reduces equal the float64 reference of docs/algorithm.md over 3 calls
    (of the hierarchical rule, docs/design/engine.md, when ONEBIT_LOCAL_SIZE is set);
  - untagged all_reduces of random floats are bit-identical to the same call on a plain gloo group
    of the same job (the backend forwards them to gloo), and a broadcast and an all_gather work;
  - DDP + onebit.ddp_comm_hook + OnebitAdam trains with every rank's parameters bitwise equal, and
    its compression stage sends no gradient allreduce;
  - onebit.stats() counts exactly the compressed calls.

    PYTHON tests/python/torch_backend_check.py BUILD_DIR [RANKS[:PER_HOST] ...]
        (default: 2 and 3 ranks, and 4 ranks as 2 hosts of 2 with ONEBIT_LOCAL_SIZE=2)
    PYTHON torch_backend_check.py --installed [RANKS[:PER_HOST] ...]
        the onebit that PYTHON imports from its own environment (an installed wheel), with
        reference.py copied next to this script: nothing is taken from a checkout, and each rank
        checks that its onebit and libonebit.so lie inside sys.prefix

Exit 77 (a skip, with the reason) when this PYTHON's torch has no c10d Backend class (torch < 2.0).
"""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
INSTALLED = "--installed" in sys.argv
if not INSTALLED:
    sys.path.insert(0, os.path.join(ROOT, "python"))
    sys.path.insert(0, os.path.join(ROOT, "tools", "gpu"))

N, HALF, STEPS, FREEZE = 5003, 4099, 8, 3


def fail(rank, what):
    print(f"rank {rank}: FAIL: {what}", flush=True)
    sys.exit(4)


def rank_main(rank, world, store):
    import torch
    import torch.distributed as dist
    import onebit
    from reference import HierarchicalReference, Reference, inputs_of, mismatches
    local = int(os.environ.get("ONEBIT_LOCAL_SIZE", "1"))
    if INSTALLED:
        library = onebit._library()._name or "(a preloaded copy)"
        for what, path in (("the onebit package", onebit.__file__), ("libonebit.so", library)):
            if not os.path.realpath(path).startswith(os.path.realpath(sys.prefix) + os.sep):
                fail(rank, f"{what} comes from {path}, outside this environment ({sys.prefix})")
    onebit.register_backend()
    dist.init_process_group("onebit", init_method=f"file://{store}", rank=rank, world_size=world)
    plain = dist.new_group(backend="gloo")
    compressed = 0
    for name, n, dtype, tolerance in (("m32", N, torch.float32, 1e-4), ("m16", HALF, torch.float16, 2e-3)):
        t = torch.zeros(n, dtype=dtype)
        onebit.tag(t, name)
        reference = Reference(world, n) if local == 1 else HierarchicalReference(world, local, n)
        for call in range(3):
            t.copy_(inputs_of(name, n, rank, call, dtype))
            dist.all_reduce(t)
            want = reference.step([inputs_of(name, n, r, call, dtype) for r in range(world)])
            bad = mismatches(t, want, tolerance)
            if bad > n // 10000 + 1:
                fail(rank, f"tagged {dtype} call {call}: {bad} of {n} elements off the float64 reference")
            compressed += 1
        onebit.untag(t)
    for n in (1, 1000, 100003):
        x = inputs_of("untagged", n, rank, 0)
        a, b = x.clone(), x.clone()
        dist.all_reduce(a)
        dist.all_reduce(b, group=plain)
        if not torch.equal(a, b):
            fail(rank, f"untagged all_reduce of {n} floats differs from plain gloo's")
    b = torch.arange(10.0) * (rank + 1)
    dist.broadcast(b, src=world - 1)
    if not torch.equal(b, torch.arange(10.0) * world):
        fail(rank, "broadcast through the backend")
    gathered = [torch.zeros(3) for _ in range(world)]
    dist.all_gather(gathered, torch.full((3,), float(rank)))
    if any(not torch.equal(g, torch.full((3,), float(r))) for r, g in enumerate(gathered)):
        fail(rank, "all_gather through the backend")

    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = onebit.OnebitAdam(ddp.parameters(), lr=1e-2, freeze_step=FREEZE)
    ddp.register_comm_hook(optimizer, onebit.ddp_comm_hook)
    generator = torch.Generator().manual_seed(100 + rank)
    forwarded_before = None
    for step in range(STEPS):
        if step == FREEZE:
            forwarded_before = onebit.stats()["forwarded_calls"]
        x = torch.randn(8, 16, generator=generator)
        loss = ddp(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    compressed += STEPS - FREEZE
    stats = onebit.stats()
    if stats["forwarded_calls"] != forwarded_before:
        fail(rank, f"the compression stage sent {stats['forwarded_calls'] - forwarded_before} gradient allreduces")
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    if not torch.isfinite(flat).all():
        fail(rank, "non-finite parameters")
    everyone = [torch.zeros_like(flat) for _ in range(world)]
    dist.all_gather(everyone, flat, group=plain)
    if any(not torch.equal(everyone[0], e) for e in everyone):
        fail(rank, "OnebitAdam + DDP parameters differ between ranks")
    if stats["compressed_calls"] != compressed:
        fail(rank, f"stats count {stats['compressed_calls']} compressed calls, want {compressed}: {stats}")
    del ddp
    dist.destroy_process_group()
    print(f"rank {rank}: ok", flush=True)


def run_job(world, local=1):
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS="1")
        if local > 1:  # hierarchical: 2 "hosts" of `local` ranks (docs/usage/c-cpp.md)
            env["ONEBIT_LOCAL_SIZE"] = str(local)
        env.pop("LD_PRELOAD", None)
        mode = ["--installed"] if INSTALLED else []
        procs = [subprocess.Popen([sys.executable, "-W", "ignore", __file__, "rank", str(r), str(world), store] + mode,
                                  env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(world)]
        outputs = []
        for p in procs:
            try:
                outputs.append(p.communicate(timeout=240)[0])
            except subprocess.TimeoutExpired:
                p.kill()
                outputs.append(p.communicate()[0] + "\n(timed out: a hang)")
        codes = [p.returncode for p in procs]
    if any(codes):
        print(f"{world} ranks: exit codes {codes}")
        for r, text in enumerate(outputs):
            print(f"--- rank {r}\n{text[-3000:]}")
        return False
    print(f"{world} ranks, {local} per host: tagged fp32/fp16 match the float64 reference over 3 calls; untagged bit-identical to "
          f"gloo; OnebitAdam + DDP bitwise equal on every rank; stats exact")
    return True


def main():
    if len(sys.argv) >= 5 and sys.argv[1] == "rank":
        rank_main(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
        return 0
    import torch
    if not hasattr(torch._C._distributed_c10d, "Backend"):
        print(f"SKIP: torch {torch.__version__} at {sys.executable} has no c10d Backend class (torch >= 2.0 needed)")
        return 77
    if not INSTALLED:
        os.environ["ONEBIT_LIBRARY"] = os.path.join(os.path.abspath(sys.argv[1]), "libonebit.so")
    print(f"torch {torch.__version__} from {os.path.dirname(torch.__file__)}")
    # WORLD or WORLD:RANKS_PER_HOST; the default's last job runs hierarchically.
    jobs = [tuple(int(v) for v in arg.split(":")) for arg in sys.argv[2:]] or [(2,), (3,), (4, 2)]
    return 0 if all([run_job(*job) for job in jobs]) else 1


if __name__ == "__main__":
    sys.exit(main())
