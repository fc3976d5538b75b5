"""Checkpointing OnebitAdam mid-compression-stage, at 2 and at 4 ranks: W ranks train 30 steps
uninterrupted; then W fresh ranks train 18 steps and save (model + optimizer, error-feedback state
included) two ways — one file per rank, and one file from rank 0 after consolidate_state_dict() on
every rank, as the trainers save —; then fresh processes load each and train the remaining 12. The
final parameters must be bitwise equal to the uninterrupted run's either way. Both ranks loading
rank 0's unconsolidated file is refused on every rank, naming the ranks whose part is missing,
before anything changes (rank 0, which finds its part, does not go on alone into the next
collective).

The consolidated file holds what every rank holds alike once: m, v and the counters under
"shared", each rank's part its error feedback alone — 4 n (3 + W) bytes of tensors for n
parameters (m and v once, W worker errors of n, server errors of n in all), not W copies of m
and v. The same checkpoint in the consolidated format before (each rank's part whole, m and v in
each) still resumes bitwise.

    /usr/bin/python3 tests/python/onebit_adam_checkpoint_check.py BUILD_DIR
"""
import os
import sys
import tempfile

from ranks import preload_env, run_ranks
from modes import require  # tests/python: a failed check raises, also under python -O

WORLDS, STEPS, STOP, FREEZE = (2, 4), 30, 18, 10
MODES = ("full", "first", "resume", "resume-consolidated", "resume-before")


def rank_main(mode, world, rank, store, out_dir):
    import numpy as np
    import torch
    import torch.distributed as dist
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
    from onebit import OnebitAdam

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2))
    rng = np.random.default_rng(100 + rank)
    x = torch.from_numpy(rng.standard_normal((128, 16)).astype(np.float32))
    y = torch.from_numpy(rng.standard_normal((128, 2)).astype(np.float32))
    optimizer = OnebitAdam(model.parameters(), lr=0.01, freeze_step=FREEZE)
    checkpoint = os.path.join(out_dir, f"checkpoint{rank}-{world}.pt")
    consolidated = os.path.join(out_dir, f"checkpoint-{world}.pt")
    before = os.path.join(out_dir, f"checkpoint-before-{world}.pt")
    first, last = 0, STEPS
    if mode == "first":
        last = STOP
    elif mode.startswith("resume"):
        if mode == "resume":
            refuse_rank_zeros_file(torch, optimizer, os.path.join(out_dir, f"checkpoint0-{world}.pt"), world)
        saved = torch.load({"resume": checkpoint, "resume-consolidated": consolidated, "resume-before": before}[mode])
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
            state = optimizer.state_dict()
            held_once(torch, state["onebit"], world, sum(p.numel() for p in model.parameters()))
            torch.save({"model": model.state_dict(), "optimizer": state}, consolidated)
            torch.save({"model": model.state_dict(), "optimizer": format_before(state)}, before)
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    np.save(os.path.join(out_dir, f"{mode}{rank}-{world}.npy"), weights)
    dist.destroy_process_group()


def held_once(torch, saved, world, n):
    """The consolidated "onebit" entry keeps m, v and the counters once, and each rank's error
    feedback (and its rank) in its part: 4 n (3 + W) bytes of tensors in all."""
    require("shared" in saved, f"the consolidated state dict keeps nothing once: {sorted(saved)}")
    for key in ("m", "v", "step", "freeze_step"):
        require(key in saved["shared"], f"{key} is not kept once: shared holds {sorted(saved['shared'])}")
    require(sorted(saved["parts"]) == list(range(world)), f"the parts are not every rank's: {sorted(saved['parts'])}")
    for r, part in saved["parts"].items():
        require(sorted(part) == ["rank", "server_error", "worker_error"] and part["rank"] == r,
                f"rank {r}'s part holds more than its error feedback: {sorted(part)}")
        require(part["worker_error"].numel() == n, f"rank {r}'s worker error has {part['worker_error'].numel()} floats")
    tensors = [v for v in saved["shared"].values() if torch.is_tensor(v)]
    tensors += [v for part in saved["parts"].values() for v in part.values() if torch.is_tensor(v)]
    held = sum(t.numel() * t.element_size() for t in tensors)
    want = 4 * n * (3 + world)
    require(held == want, f"{held} bytes of tensors at {world} ranks, not 4 n (3 + W) = {want}")


def format_before(state):
    """`state` as onebit saved a consolidated state dict before "shared": every rank's part whole."""
    saved = dict(state["onebit"])
    shared = saved.pop("shared")
    return dict(state, onebit=dict(saved, parts={r: dict(shared, **part) for r, part in saved["parts"].items()}))


def refuse_rank_zeros_file(torch, optimizer, path, world):
    """Every rank loading rank 0's own (unconsolidated) file: the same ValueError on each, naming the
    ranks whose part is missing, nothing changed."""
    before = optimizer.state_dict()
    others = ", ".join(map(str, range(1, world)))
    try:
        optimizer.load_state_dict(torch.load(path)["optimizer"])
    except ValueError as error:
        for words in (f"holds the part of rank 0 of {world}, not that of rank {others}", "consolidate_state_dict()"):
            require(words in str(error), f"the refusal does not say '{words}': {error}")
    else:
        raise AssertionError("rank 0's unconsolidated checkpoint was loaded")
    after = optimizer.state_dict()["onebit"]["parts"]["every"]["m"]
    require(torch.equal(after, before["onebit"]["parts"]["every"]["m"]), "the refused load changed m")


def main():
    if len(sys.argv) == 5 and sys.argv[1].split("@")[0] in MODES:
        mode, world = sys.argv[1].split("@")
        rank_main(mode, int(world), int(sys.argv[2]), sys.argv[3], sys.argv[4])
        return 0
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        print(__doc__)
        return 2
    import numpy as np
    with tempfile.TemporaryDirectory() as tmp:
        env = preload_env(sys.argv[1])
        for world in WORLDS:
            for mode in MODES:
                run_ranks(__file__, f"{mode}@{world}", world, tmp, env)
            for r in range(world):
                full = np.load(os.path.join(tmp, f"full{r}-{world}.npy"))
                for resume in MODES[2:]:
                    resumed = np.load(os.path.join(tmp, f"{resume}{r}-{world}.npy"))
                    require(np.array_equal(full.view(np.uint32), resumed.view(np.uint32)),
                            f"{world} ranks, rank {r}: {resume}: the parameters differ from the uninterrupted run's")
                require(not np.array_equal(full, np.load(os.path.join(tmp, f"first{r}-{world}.npy"))),
                        "the resume trained nothing")
    print(f"OK: at {' and '.join(map(str, WORLDS))} ranks, saved at step {STOP} (compression stage from step {FREEZE}) "
          "per rank and consolidated on rank 0 (m and v once, each rank's error feedback its own), restored into "
          f"fresh processes, from the consolidated format before too: parameters after {STEPS} steps bitwise equal to "
          "the uninterrupted run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
