"""OnebitAdam(freeze_step="auto") end to end: 2 ranks of real torch.distributed (gloo) with
libonebit-preload.so.

1. "auto": the rule fires on both ranks after the same step, rank 0 says so on stderr, and exactly
   the steps after it ran compressed allreduces.
2. "fixed": the same training with freeze_step set to that step gives bitwise the same parameters:
   the automatic run is 1-bit Adam with a freeze step the variance chose. This run's script routes
   the "onebit" logger into its own logging (docs/usage/optimizers.md, "Logging"): rank 0's freeze line lands
   in the application's log file, with the logger's name and level, and not on stderr.
3. "first" + "resume": saved in warmup between two measurements and resumed in fresh processes,
   the run ends bitwise where the uninterrupted one does (the decision, v's snapshot and the
   error-feedback state all travel in state_dict()).
4. "uneven": rank 0's variance has settled and rank 1's has not (its snapshot loaded as zeros):
   the decision is the largest change, 1.0, on both ranks, and the warmup goes on — the C core's
   rule across ranks, which the C++ shim's test AutomaticFreezeWaitsForEveryRanksVariance holds too.

    /usr/bin/python3 tests/python/onebit_auto_freeze_check.py BUILD_DIR
"""
import json
import os
import sys
import tempfile

from ranks import preload_env, run_ranks
from modes import require  # tests/python: a failed check raises, also under python -O

WORLD, STEPS, WINDOW, THRESHOLD, STOP = 2, 40, 4, 0.3, 6


def rank_main(mode, rank, store, out_dir):
    import numpy as np
    import torch
    import torch.distributed as dist
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
    import onebit
    from onebit import OnebitAdam

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    if mode == "uneven":
        return uneven(rank, out_dir)
    if mode == "fixed":  # docs/usage/optimizers.md's recipe: the application's logging takes onebit's lines over
        import logging
        logging.basicConfig(filename=os.path.join(out_dir, f"log{rank}.txt"), level=logging.INFO,
                            format="app: %(name)s %(levelname)s %(message)s")
        log = logging.getLogger("onebit")
        log.handlers.clear()
        log.propagate = True
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2))
    rng = np.random.default_rng(100 + rank)
    x = torch.from_numpy(rng.standard_normal((128, 16)).astype(np.float32))
    y = torch.from_numpy(rng.standard_normal((128, 2)).astype(np.float32))
    if mode == "fixed":
        with open(os.path.join(out_dir, "auto.json")) as f:
            freeze = json.load(f)["freeze_step"]
        optimizer = OnebitAdam(model.parameters(), lr=0.01, freeze_step=freeze)
    else:
        optimizer = OnebitAdam(model.parameters(), lr=0.01, freeze_step="auto", freeze_window=WINDOW,
                               freeze_threshold=THRESHOLD)
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
        require(optimizer.freeze_step is None, "the rule fired before the checkpoint; move STOP")
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, checkpoint)
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    np.save(os.path.join(out_dir, f"{mode}{rank}.npy"), weights)
    if mode == "auto":
        with open(os.path.join(out_dir, f"auto{rank}.json"), "w") as f:
            json.dump({"freeze_step": optimizer.freeze_step, "changes": optimizer.variance_changes,
                       "compressed_calls": onebit.stats()["compressed_calls"]}, f)
    dist.destroy_process_group()


def uneven(rank, out_dir):
    import torch
    import torch.distributed as dist
    from onebit import OnebitAdam
    model = torch.nn.Linear(16, 2)
    optimizer = OnebitAdam(model.parameters(), freeze_step="auto", freeze_window=1, freeze_threshold=0.9)
    state = optimizer.state_dict()
    part = state["onebit"]["parts"]["every"]
    part["v"] = torch.ones_like(part["v"])
    part["v_then"] = torch.ones_like(part["v"]) if rank == 0 else torch.zeros_like(part["v"])
    optimizer.load_state_dict(state)
    for p in model.parameters():
        p.grad = torch.ones_like(p)  # v stays about 1: rank 0 measures about 0, rank 1 exactly 1
    optimizer.step()
    with open(os.path.join(out_dir, f"uneven{rank}.json"), "w") as f:
        json.dump({"freeze_step": optimizer.freeze_step, "changes": optimizer.variance_changes}, f)
    dist.destroy_process_group()


def run(mode, tmp, env):
    return run_ranks(__file__, mode, WORLD, tmp, env)


def main():
    if len(sys.argv) == 5 and sys.argv[1] in ("auto", "fixed", "first", "resume", "uneven"):
        rank_main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4])
        return 0
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        print(__doc__)
        return 2
    import numpy as np
    with tempfile.TemporaryDirectory() as tmp:
        env = preload_env(sys.argv[1])
        errors = run("auto", tmp, env)
        reports = [json.load(open(os.path.join(tmp, f"auto{r}.json"))) for r in range(WORLD)]
        freeze = reports[0]["freeze_step"]
        require(freeze is not None and WINDOW <= freeze < STEPS,
                f"the rule did not fire in {STEPS} steps: {reports[0]}")
        require(all(r["freeze_step"] == freeze and r["changes"] == reports[0]["changes"] for r in reports), reports)
        require(freeze % WINDOW == 0, f"it fires only after a measurement: {freeze}")
        changes = reports[0]["changes"]
        require(changes[0] == [WINDOW - 1, 1.0], f"the first measurement compares with zeros: {changes[0]}")
        require(changes[-1][0] == freeze - 1 and changes[-1][1] < THRESHOLD, changes)
        require(all(c >= THRESHOLD for _, c in changes[:-1]), changes)
        require(all(r["compressed_calls"] == STEPS - freeze for r in reports), reports)
        require(f"fired after step {freeze - 1}" in errors[0] and f"compression from step {freeze}" in errors[0],
                errors[0])
        require("fired" not in errors[1], "only rank 0 reports it")
        require(f"onebit: OnebitAdam: variance frozen from step {freeze};" in errors[0], errors[0])
        with open(os.path.join(tmp, "auto.json"), "w") as f:
            json.dump({"freeze_step": freeze}, f)
        errors = run("fixed", tmp, env)
        logs = [open(os.path.join(tmp, f"log{r}.txt")).read() for r in range(WORLD)]
        require(f"app: onebit INFO OnebitAdam: variance frozen from step {freeze};" in logs[0], logs[0])
        require("variance frozen" not in errors[0] + logs[1], f"the line went elsewhere too: {errors[0]}{logs[1]}")
        run("first", tmp, env)
        run("resume", tmp, env)
        for r in range(WORLD):
            auto = np.load(os.path.join(tmp, f"auto{r}.npy")).view(np.uint32)
            require(np.array_equal(auto, np.load(os.path.join(tmp, f"fixed{r}.npy")).view(np.uint32)),
                    f"rank {r}: the automatic run differs from freeze_step={freeze}")
            require(np.array_equal(auto, np.load(os.path.join(tmp, f"resume{r}.npy")).view(np.uint32)),
                    f"rank {r}: resumed from a warmup checkpoint, the run differs from the uninterrupted one")
        run("uneven", tmp, env)
        for r in range(WORLD):
            report = json.load(open(os.path.join(tmp, f"uneven{r}.json")))
            require(report == {"freeze_step": None, "changes": [[0, 1.0]]},
                    f"rank {r}: the ranks did not decide on the largest change (rank 1's 1.0): {report}")
    print(f"OK: freeze_step='auto' fired after step {freeze - 1} on both ranks (changes "
          f"{[round(c, 3) for _, c in changes]}), bitwise equal to freeze_step={freeze} and to a resume from step {STOP}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
