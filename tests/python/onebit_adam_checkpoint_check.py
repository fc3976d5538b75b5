"""Checkpointing OnebitAdam mid-compression-stage: 2 ranks train 30 steps uninterrupted; then 2 fresh
ranks train 18 steps and save (model + optimizer, error-feedback state included) two ways — one
file per rank, and one file from rank 0 after consolidate_state_dict() on every rank, as the
trainers save —; then fresh processes load each and train the remaining 12. The final parameters
must be bitwise equal to the uninterrupted run's either way. Both ranks loading rank 0's
unconsolidated file is refused on both, naming the rank whose part is missing, before anything
changes (rank 0, which finds its part, does not go on alone into the next collective).

    /usr/bin/python3 tests/python/onebit_adam_checkpoint_check.py BUILD_DIR
"""
import os
import sys
import tempfile

from ranks import preload_env, run_ranks
from modes import require  # tests/python: a failed check raises, also under python -O

WORLD, STEPS, STOP, FREEZE = 2, 30, 18, 10


def rank_main(mode, rank, store, out_dir):
    import numpy as np
    import torch
    import torch.distributed as dist
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
    from onebit import OnebitAdam

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2))
    rng = np.random.default_rng(100 + rank)
    x = torch.from_numpy(rng.standard_normal((128, 16)).astype(np.float32))
    y = torch.from_numpy(rng.standard_normal((128, 2)).astype(np.float32))
    optimizer = OnebitAdam(model.parameters(), lr=0.01, freeze_step=FREEZE)
    checkpoint = os.path.join(out_dir, f"checkpoint{rank}.pt")
    consolidated = os.path.join(out_dir, "checkpoint.pt")
    first, last = 0, STEPS
    if mode == "first":
        last = STOP
    elif mode.startswith("resume"):
        if mode == "resume":
            refuse_rank_zeros_file(torch, optimizer, os.path.join(out_dir, "checkpoint0.pt"))
        saved = torch.load(checkpoint if mode == "resume" else consolidated)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        first = STOP
    for _ in range(first, last):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    if mode == "first":
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, checkpoint)
        optimizer.consolidate_state_dict()  # every rank
        if rank == 0:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, consolidated)
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    np.save(os.path.join(out_dir, f"{mode}{rank}.npy"), weights)
    dist.destroy_process_group()


def refuse_rank_zeros_file(torch, optimizer, path):
    """Every rank loading rank 0's own (unconsolidated) file: the same ValueError on each, naming the
    rank whose part is missing, nothing changed."""
    before = optimizer.state_dict()
    try:
        optimizer.load_state_dict(torch.load(path)["optimizer"])
    except ValueError as error:
        for words in ("holds the part of rank 0 of 2, not that of rank 1", "consolidate_state_dict()"):
            require(words in str(error), f"the refusal does not say '{words}': {error}")
    else:
        raise AssertionError("rank 0's unconsolidated checkpoint was loaded")
    after = optimizer.state_dict()["onebit"]["parts"]["every"]["m"]
    require(torch.equal(after, before["onebit"]["parts"]["every"]["m"]), "the refused load changed m")


def main():
    if len(sys.argv) == 5 and sys.argv[1] in ("full", "first", "resume", "resume-consolidated"):
        rank_main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4])
        return 0
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        print(__doc__)
        return 2
    import numpy as np
    with tempfile.TemporaryDirectory() as tmp:
        env = preload_env(sys.argv[1])
        for mode in ("full", "first", "resume", "resume-consolidated"):
            run_ranks(__file__, mode, WORLD, tmp, env)
        for r in range(WORLD):
            full = np.load(os.path.join(tmp, f"full{r}.npy"))
            for resume in ("resume", "resume-consolidated"):
                resumed = np.load(os.path.join(tmp, f"{resume}{r}.npy"))
                require(np.array_equal(full.view(np.uint32), resumed.view(np.uint32)),
                        f"rank {r}: {resume}: resumed parameters differ from the uninterrupted run's")
            require(not np.array_equal(full, np.load(os.path.join(tmp, f"first{r}.npy"))),
                    "the resume trained nothing")
    print(f"OK: saved at step {STOP} (compression stage from step {FREEZE}) per rank and consolidated on rank 0, "
          f"restored into fresh processes: parameters after {STEPS} steps bitwise equal to the uninterrupted run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
