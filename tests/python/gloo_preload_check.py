"""End to end through real torch.distributed (gloo backend) with libonebit-preload.so loaded:
a tagged all_reduce equals the float64 reference of algorithm.md over several calls, untagged
all_reduces are exact (integer-valued inputs), and onebit.stats() counts the compressed calls.

    /usr/bin/python3 tests/python/gloo_preload_check.py BUILD_DIR   (spawns its own ranks)
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

WORLD = 2
N = 5003
CALLS = 3


def reference(inputs):
    """algorithm.md in float64 for W ranks over consecutive calls; returns each call's SUM result."""
    world, n = len(inputs[0]), N
    chunk = ((n + world - 1) // world + 7) // 8 * 8
    e = [np.zeros(n) for _ in range(world)]
    s = [np.zeros(max(0, min(n, (j + 1) * chunk) - min(n, j * chunk))) for j in range(world)]
    outputs = []
    for call in inputs:
        y = [call[r].astype(np.float64) + e[r] for r in range(world)]
        a = [np.sqrt(np.mean(y[r] ** 2)) for r in range(world)]
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


def inputs_of(rank, call):
    return np.random.default_rng(1000 * rank + call).standard_normal(N).astype(np.float32)


def rank_main(rank, store, out_dir):
    import torch
    import torch.distributed as dist
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
    import onebit

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    noise = torch.from_numpy(np.random.default_rng(7 + rank).standard_normal(100003).astype(np.float32))
    dist.all_reduce(noise)  # untagged floats: must be bit-identical with and without the preload
    np.save(os.path.join(out_dir, f"noise{rank}.npy"), noise.numpy())
    if "LD_PRELOAD" not in os.environ:
        dist.destroy_process_group()
        return
    momentum = torch.zeros(N)
    onebit.tag(momentum, "momentum")
    results = []
    for call in range(CALLS):
        momentum.copy_(torch.from_numpy(inputs_of(rank, call)))
        dist.all_reduce(momentum)
        results.append(momentum.numpy().copy())
    exact = torch.tensor([float((i * 7 + rank) % 100) for i in range(1000)])
    dist.all_reduce(exact)  # untagged: libgloo's own allreduce
    loss = torch.tensor([0.5 + rank])
    dist.all_reduce(loss)
    np.save(os.path.join(out_dir, f"rank{rank}.npy"), np.stack(results))
    np.save(os.path.join(out_dir, f"exact{rank}.npy"), exact.numpy())
    s = onebit.stats()
    assert s["compressed_calls"] == CALLS, s
    assert s["full_precision_calls"] == 0, s  # untagged calls never reach onebit
    assert loss.item() == 2.0, loss
    dist.destroy_process_group()


def run_job(env, out_dir):
    store = os.path.join(out_dir, "store")
    procs = [subprocess.Popen([sys.executable, __file__, "rank", str(r), store, out_dir], env=env)
             for r in range(WORLD)]
    return [p.wait(timeout=300) for p in procs]


def main():
    if len(sys.argv) == 5:
        rank_main(int(sys.argv[2]), sys.argv[3], sys.argv[4])
        return 0
    build = sys.argv[1]
    preload = os.path.abspath(os.path.join(build, "libonebit-preload.so"))
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory() as plain:
        base = dict(os.environ, MASTER_ADDR="127.0.0.1", ONEBIT_TIMEOUT_MS="60000")
        base.pop("LD_PRELOAD", None)
        codes = run_job(dict(base, LD_PRELOAD=preload), tmp) + run_job(base, plain)
        if any(codes):
            print(f"FAIL: rank exit codes {codes} (with the preload, then without)")
            return 1
        for r in range(WORLD):
            with_preload = np.load(os.path.join(tmp, f"noise{r}.npy"))
            without = np.load(os.path.join(plain, f"noise{r}.npy"))
            assert np.array_equal(with_preload.view(np.uint32), without.view(np.uint32)), \
                "an untagged all_reduce changed under the preload"
        outs = [np.load(os.path.join(tmp, f"rank{r}.npy")) for r in range(WORLD)]
        assert np.array_equal(outs[0], outs[1]), "ranks disagree"
        expected = reference([[inputs_of(r, c) for r in range(WORLD)] for c in range(CALLS)])
        for c in range(CALLS):
            err = np.max(np.abs(outs[0][c] - expected[c]) / np.maximum(np.abs(expected[c]), 1e-30))
            assert err < 1e-4, f"call {c}: relative error {err} against the float64 reference"
        for r in range(WORLD):
            exact = np.load(os.path.join(tmp, f"exact{r}.npy"))
            want = np.array([float((i * 7) % 100 + (i * 7 + 1) % 100) for i in range(1000)], dtype=np.float32)
            assert np.array_equal(exact, want), "untagged all_reduce is not exact"
    print("OK: tagged all_reduce matches the float64 reference over 3 calls; untagged ones are exact and "
          "bit-identical to runs without the preload")
    return 0


if __name__ == "__main__":
    sys.exit(main())
