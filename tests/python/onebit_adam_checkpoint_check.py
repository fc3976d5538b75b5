"""Checkpointing OnebitAdam mid-compression-stage: 2 ranks train 30 steps uninterrupted; then 2 fresh
ranks train 18 steps and save (model + optimizer, one file per rank, error-feedback state included);
then 2 more fresh processes load and train the remaining 12. The final parameters must be bitwise
equal to the uninterrupted run's.

    /usr/bin/python3 tests/python/onebit_adam_checkpoint_check.py BUILD_DIR
"""
import os
import sys
import tempfile

from ranks import preload_env, run_ranks

WORLD, STEPS, STOP, FREEZE = 2, 30, 18, 10


def rank_main(mode, rank, store, out_dir):
    import numpy as np
    import torch
    import torch.distributed as dist
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
    from onebit.optim import OnebitAdam

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2))
    rng = np.random.default_rng(100 + rank)
    x = torch.from_numpy(rng.standard_normal((128, 16)).astype(np.float32))
    y = torch.from_numpy(rng.standard_normal((128, 2)).astype(np.float32))
    optimizer = OnebitAdam(model.parameters(), lr=0.01, freeze_step=FREEZE)
    checkpoint = os.path.join(out_dir, f"checkpoint{rank}.pt")
    first, last = 0, STEPS
    if mode == "first":
        last = STOP
    elif mode == "resume":
        saved = torch.load(checkpoint)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        first = STOP
    for _ in range(first, last):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    if mode == "first":
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, checkpoint)
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    np.save(os.path.join(out_dir, f"{mode}{rank}.npy"), weights)
    dist.destroy_process_group()


def main():
    if len(sys.argv) == 5 and sys.argv[1] in ("full", "first", "resume"):
        rank_main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4])
        return 0
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        print(__doc__)
        return 2
    import numpy as np
    with tempfile.TemporaryDirectory() as tmp:
        env = preload_env(sys.argv[1])
        for mode in ("full", "first", "resume"):
            run_ranks(__file__, mode, WORLD, tmp, env)
        for r in range(WORLD):
            full = np.load(os.path.join(tmp, f"full{r}.npy"))
            resumed = np.load(os.path.join(tmp, f"resume{r}.npy"))
            assert np.array_equal(full.view(np.uint32), resumed.view(np.uint32)), \
                f"rank {r}: resumed parameters differ from the uninterrupted run's"
            assert not np.array_equal(full, np.load(os.path.join(tmp, f"first{r}.npy"))), "the resume trained nothing"
    print(f"OK: saved at step {STOP} (compression stage from step {FREEZE}), restored into fresh processes: "
          f"parameters after {STEPS} steps bitwise equal to the uninterrupted run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
