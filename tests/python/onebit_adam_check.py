"""OnebitAdam end to end: 2 ranks of real torch.distributed (gloo) with libonebit-preload.so, a
least-squares model on per-rank data shards; warmup, then the compression stage. Checks: the loss
falls (to under 10 % of its start) with no NaN, parameters are identical on both ranks, and exactly
the compression-stage steps ran compressed allreduces (ONEBIT_FREEZE_STEP moves the boundary).

This is a plumbing test, not a convergence claim: on this tiny noiseless problem the compression
stage plateaus near a loss of 1.3 where the same optimizer without compression
(ONEBIT_FREEZE_STEP=120) reaches 5e-5 — sign-compressed momentum has an error floor that SGD noise
hides in real training. The convergence demo of issue 5 is where that gets measured.

    /usr/bin/python3 tests/python/onebit_adam_check.py BUILD_DIR
"""
import os
import subprocess
import sys
import tempfile
from modes import require  # tests/python: a failed check raises, also under python -O

WORLD, STEPS, FREEZE = 2, 120, 20


def rank_main(rank, store, out_dir):
    import numpy as np
    import torch
    import torch.distributed as dist
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
    import onebit
    from onebit import OnebitAdam
    from modes import fit  # tests/python, the script's own folder

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    torch.manual_seed(0)  # same initial model on every rank
    model = torch.nn.Linear(32, 4)
    rng = np.random.default_rng(100 + rank)  # each rank its own data shard
    truth = torch.from_numpy(np.random.default_rng(1).standard_normal((32, 4)).astype(np.float32))
    x = torch.from_numpy(rng.standard_normal((256, 32)).astype(np.float32))
    y = x @ truth
    optimizer = OnebitAdam(model.parameters(), lr=0.02, freeze_step=FREEZE)
    losses = fit(torch, model, optimizer, x, y, STEPS)
    stats = onebit.stats()
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    np.save(os.path.join(out_dir, f"weights{rank}.npy"), weights)
    np.save(os.path.join(out_dir, f"losses{rank}.npy"), np.array(losses))
    require(stats["compressed_calls"] == max(0, STEPS - optimizer.freeze_step), stats)
    optimizer.close()
    dist.destroy_process_group()


def main():
    if len(sys.argv) == 5:
        rank_main(int(sys.argv[2]), sys.argv[3], sys.argv[4])
        return 0
    import numpy as np
    preload = os.path.abspath(os.path.join(sys.argv[1], "libonebit-preload.so"))
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, LD_PRELOAD=preload, MASTER_ADDR="127.0.0.1")
        procs = [subprocess.Popen([sys.executable, __file__, "rank", str(r), os.path.join(tmp, "store"), tmp], env=env)
                 for r in range(WORLD)]
        codes = [p.wait(timeout=300) for p in procs]
        if any(codes):
            print(f"FAIL: rank exit codes {codes}")
            return 1
        w0, w1 = (np.load(os.path.join(tmp, f"weights{r}.npy")) for r in range(WORLD))
        require(np.array_equal(w0.view(np.uint32), w1.view(np.uint32)), "ranks' parameters differ")
        losses = np.load(os.path.join(tmp, "losses0.npy"))
        require(np.all(np.isfinite(losses)), "NaN or Inf in the loss")
        require(losses[-1] < 0.1 * losses[0], f"loss went from {losses[0]:.4f} to {losses[-1]:.4f}")
        print(f"OK: loss {losses[0]:.4f} -> {losses[FREEZE]:.4f} (end of warmup) -> {losses[-1]:.5f} after "
              f"{STEPS} steps; parameters identical on both ranks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
