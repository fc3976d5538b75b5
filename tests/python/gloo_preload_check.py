"""End to end through real torch.distributed (gloo backend) with libonebit-preload.so loaded.

For each job (world size × ONEBIT_TRANSPORT × ONEBIT_LOCAL_SIZE), every rank checks, and the parent compares:
  - tagged float32 all_reduces equal the float64 reference of docs/algorithm.md over several calls
    (including a tensor smaller than the world's chunks, so some chunks are empty);
  - a tagged float16 tensor likewise (to float16 precision);
  - several tagged tensors all_reduced at once with async_op=True, which PyTorch runs on its two
    worker threads concurrently, each equal to its own reference;
  - untagged all_reduces (floats, a loss scalar, integers) are exact and bit-identical to a job
    without the preload: the front door never changes a call it does not take;
  - onebit.stats() counts exactly the compressed and forwarded calls.

    /usr/bin/python3 tests/python/gloo_preload_check.py BUILD_DIR   (spawns its own ranks)
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from modes import require  # tests/python: a failed check raises, also under python -O

CALLS = 3
SIZES = {"momentum": 5003, "tiny": 5}  # float32 tags; `tiny` leaves most chunks empty
HALF = 4099                            # the float16 tag
CONCURRENT = 4                         # tags in flight at once, per round
CONCURRENT_N = 20011


def reference(inputs):
    """docs/algorithm.md in float64: inputs[call][rank] → each call's SUM result."""
    world, n = len(inputs[0]), len(inputs[0][0])
    chunk = ((n + world - 1) // world + 7) // 8 * 8
    e = [np.zeros(n) for _ in range(world)]
    s = [np.zeros(max(0, min(n, (j + 1) * chunk) - min(n, j * chunk))) for j in range(world)]
    outputs = []
    for call in inputs:
        y = [call[r].astype(np.float64) + e[r] for r in range(world)]
        a = [np.sqrt(np.mean(y[r] ** 2)) if n else 0.0 for r in range(world)]
        for r in range(world):
            e[r] = y[r] - a[r] * np.where(y[r] >= 0, 1.0, -1.0)
        signed = sum(a[r] * np.where(y[r] >= 0, 1.0, -1.0) for r in range(world)) / world
        out = np.zeros(n)
        for j in range(world):
            lo, hi = min(n, j * chunk), min(n, (j + 1) * chunk)
            z = signed[lo:hi] + s[j]
            b = np.sqrt(np.mean(z ** 2)) if hi > lo else 0.0
            sign = np.where(z >= 0, 1.0, -1.0)
            s[j] = z - b * sign
            out[lo:hi] = b * sign * world
        outputs.append(out)
    return outputs


def hierarchical_reference(inputs, local):
    """The hierarchical rule in float64 (docs/design/engine.md): each host's mean of its `local` ranks,
    then docs/algorithm.md per shard over the hosts' means → each call's SUM result."""
    world, n = len(inputs[0]), len(inputs[0][0])
    hosts = world // local
    shard = ((n + local - 1) // local + 7) // 8 * 8
    outputs = [np.zeros(n) for _ in inputs]
    for q in range(local):
        lo, hi = min(n, q * shard), min(n, (q + 1) * shard)
        rail = [[np.mean([call[h * local + l][lo:hi].astype(np.float64) for l in range(local)], axis=0)
                 for h in range(hosts)] for call in inputs]
        for c, out in enumerate(reference(rail)):
            outputs[c][lo:hi] = out * local  # reference() sums over the hosts; the job has world ranks
    return outputs


def inputs_of(name, n, rank, call, dtype=np.float32):
    seed = sum(map(ord, name)) * 7919 + 1000 * rank + call
    return np.random.default_rng(seed).standard_normal(n).astype(dtype)


def rank_main(rank, world, store, out_dir):
    import torch
    import torch.distributed as dist
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
    import onebit

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    noise = torch.from_numpy(np.random.default_rng(7 + rank).standard_normal(100003).astype(np.float32))
    dist.all_reduce(noise)  # untagged floats: must be bit-identical with and without the preload
    np.save(os.path.join(out_dir, f"noise{rank}.npy"), noise.numpy())
    if "LD_PRELOAD" not in os.environ:
        dist.destroy_process_group()
        return
    results = {}
    tensors = {name: torch.zeros(n) for name, n in SIZES.items()}
    tensors["half"] = torch.zeros(HALF, dtype=torch.float16)
    for name, t in tensors.items():
        onebit.tag(t, name)
    for call in range(CALLS):
        for name, t in tensors.items():
            dtype = np.float16 if name == "half" else np.float32
            t.copy_(torch.from_numpy(inputs_of(name, t.numel(), rank, call, dtype)))
            dist.all_reduce(t)
            results[f"{name}/{call}"] = t.numpy().copy()
    concurrent = [torch.zeros(CONCURRENT_N) for _ in range(CONCURRENT)]
    for k, t in enumerate(concurrent):
        onebit.tag(t, f"concurrent{k}")
    for call in range(CALLS):
        for k, t in enumerate(concurrent):
            t.copy_(torch.from_numpy(inputs_of(f"concurrent{k}", CONCURRENT_N, rank, call)))
        works = [dist.all_reduce(t, async_op=True) for t in concurrent]
        for w in works:
            w.wait()
        for k, t in enumerate(concurrent):
            results[f"concurrent{k}/{call}"] = t.numpy().copy()
    exact = torch.tensor([float((i * 7 + rank) % 100) for i in range(1000)])
    dist.all_reduce(exact)  # untagged: libgloo's own allreduce
    loss = torch.tensor([0.5 + rank])
    dist.all_reduce(loss)
    counts = torch.tensor([rank + 1], dtype=torch.int64)
    dist.all_reduce(counts)
    np.savez(os.path.join(out_dir, f"rank{rank}.npz"), exact=exact.numpy(), **results)
    s = onebit.stats()
    tagged_calls = CALLS * (len(tensors) + CONCURRENT)
    require(s["compressed_calls"] == tagged_calls, s)
    require(s["forwarded_calls"] == 4, s)  # noise, exact, loss, counts
    require(s["forwarded_bytes"] == 4 * (100003 + 1000 + 1) + 8, s)
    require(s["full_precision_calls"] == 0, s)  # the front door never runs onebit's own ring
    require(s["compressed_bytes_sent"] > 0 and s["bytes_sent"] >= s["compressed_bytes_sent"], s)
    require(loss.item() == sum(0.5 + r for r in range(world)), loss)
    require(counts.item() == world * (world + 1) // 2, counts)
    with open(os.path.join(out_dir, f"stats{rank}.json"), "w") as f:
        json.dump(s, f)
    dist.destroy_process_group()


def run_job(env, world, out_dir):
    store = os.path.join(out_dir, "store")
    procs = [subprocess.Popen([sys.executable, __file__, "rank", str(r), str(world), store, out_dir], env=env)
             for r in range(world)]
    return [p.wait(timeout=300) for p in procs]


def check_job(build, world, transport, local=1):
    preload = os.path.abspath(os.path.join(build, "libonebit-preload.so"))
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory() as plain:
        base = dict(os.environ, MASTER_ADDR="127.0.0.1", ONEBIT_TIMEOUT_MS="60000")
        base.pop("LD_PRELOAD", None)
        onebit_env = dict(base, LD_PRELOAD=preload, ONEBIT_TRANSPORT=transport)
        if local > 1:
            onebit_env["ONEBIT_LOCAL_SIZE"] = str(local)
        codes = run_job(onebit_env, world, tmp)
        codes += run_job(base, world, plain)
        require(not any(codes), f"rank exit codes {codes} (with the preload, then without)")
        for r in range(world):
            with_preload = np.load(os.path.join(tmp, f"noise{r}.npy"))
            without = np.load(os.path.join(plain, f"noise{r}.npy"))
            require(np.array_equal(with_preload.view(np.uint32), without.view(np.uint32)),
                    "an untagged all_reduce changed under the preload")
        outs = [np.load(os.path.join(tmp, f"rank{r}.npz")) for r in range(world)]
        for key in outs[0].files:
            for r in range(1, world):
                require(np.array_equal(outs[0][key], outs[r][key]), f"{key}: ranks 0 and {r} disagree")
        checks = [(name, n, np.float32, 1e-4) for name, n in SIZES.items()]
        checks += [("half", HALF, np.float16, 2e-3)]
        checks += [(f"concurrent{k}", CONCURRENT_N, np.float32, 1e-4) for k in range(CONCURRENT)]
        for name, n, dtype, tolerance in checks:
            inputs = [[inputs_of(name, n, r, c, dtype) for r in range(world)] for c in range(CALLS)]
            expected = reference(inputs) if local == 1 else hierarchical_reference(inputs, local)
            for c in range(CALLS):
                got = outs[0][f"{name}/{c}"].astype(np.float64)
                err = np.max(np.abs(got - expected[c]) / np.maximum(np.abs(expected[c]), 1e-30), initial=0.0)
                require(err < tolerance, f"{name} call {c}: relative error {err} against the float64 reference")
        want = np.array([sum(float((i * 7 + r) % 100) for r in range(world)) for i in range(1000)], dtype=np.float32)
        require(np.array_equal(outs[0]["exact"], want), "untagged all_reduce is not exact")
    print(f"OK: {world} ranks, ONEBIT_TRANSPORT={transport}, ONEBIT_LOCAL_SIZE={local}: float32, float16 and {CONCURRENT} concurrent tags "
          f"match the float64 reference over {CALLS} calls; untagged calls exact and bit-identical without the preload")


def main():
    if len(sys.argv) == 6:
        rank_main(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
        return 0
    build = sys.argv[1]
    # (world, transport, ranks per host): the last runs hierarchically, 2 hosts of 2.
    # 8 as 2 hosts of 4: torchrun --nproc-per-node=4, the shape whose local rank 0 once crashed (e6f6e3b)
    jobs = [(2, "gloo", 1), (3, "gloo", 1), (4, "tcp", 1), (4, "gloo", 2), (8, "gloo", 4)]
    if len(sys.argv) > 2:  # e.g. "4:gloo" or "4:gloo:2" to run one job
        jobs = [(int(w), t, int(rest[0]) if rest else 1)
                for w, t, *rest in (arg.split(":") for arg in sys.argv[2:])]
    for world, transport, local in jobs:
        check_job(build, world, transport, local)
    return 0


if __name__ == "__main__":
    sys.exit(main())
