"""A job restarted at another size or layout (docs/usage/restarting.md, "Restarting a job"), for each of the
three optimizers, through real torch.distributed (Debian's torch, gloo, libonebit-preload.so):

  save     4 ranks as 2 hosts of 2 (ONEBIT_LOCAL_SIZE=2, hierarchical compression): a checkpoint
           in warmup (the state every rank shares) and one in the compression stage, consolidated
           to rank 0 (every rank's error feedback; m, v and what else every rank holds alike
           kept once), each saved by rank 0 alone as the trainers do.
  resized  2 ranks, flat: the warmup checkpoint loads and training goes on (before: refused, a
           crash loop for an elastic restart); the compression-stage one is refused on every rank
           naming both layouts, with nothing changed; with reset_error_feedback=True it loads —
           m, v and the step are the checkpoint's, no error feedback — rank 0 warns once, and the
           ranks train on bitwise equal; into an optimizer whose compressed calls have run, the
           reset load is refused (its own feedback would stay, not be dropped).
  relaid   4 ranks, flat (ONEBIT_LOCAL_SIZE=1): the compression-stage checkpoint is refused on
           every rank naming "4 ranks, 2 per host" and "4 ranks, flat" (before: loaded without a
           word, its error feedback applied to other chunks).

The same checkpoints saved as the job's one file (save_file(path, consolidated=True)) meet the same
rules through load_file(); and a warmup job file the 2 ranks save loads into the 4 (ranks 2 and 3,
of which it has no part, read rank 0's).

    /usr/bin/python3 tests/python/resize_check.py BUILD_DIR
"""
import os
import sys
import tempfile

from ranks import preload_env, run_ranks
from modes import CheckFailed, fit, require

KINDS = ("OnebitAdam", "OnebitLamb", "ZeroOneAdam")
FREEZE = 3
REFUSED = "each rank's error feedback belongs to the chunks of the layout it was made in"


def make(onebit, torch, kind):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2))
    if kind == "ZeroOneAdam":
        optimizer = onebit.ZeroOneAdam(model.parameters(), lr=1e-3, var_freeze_step=FREEZE, local_step_clipper=4)
    else:
        optimizer = getattr(onebit, kind)(model.parameters(), lr=1e-3, freeze_step=FREEZE)
    return model, optimizer


def batch(torch, rank):
    generator = torch.Generator().manual_seed(10 + rank)
    return torch.randn(32, 16, generator=generator), torch.randn(32, 2, generator=generator)


def save(rank, torch, dist, onebit, tmp):
    for kind in KINDS:
        model, optimizer = make(onebit, torch, kind)
        x, y = batch(torch, rank)
        fit(torch, model, optimizer, x, y, FREEZE - 1)
        warmup = optimizer.state_dict()
        require(list(warmup["onebit"]["parts"]) == ["every"], f"{kind}: the warmup state is not every rank's")
        optimizer.save_file(os.path.join(tmp, f"{kind}-warmup.ckpt"), consolidated=True)
        fit(torch, model, optimizer, x, y, 4)
        optimizer.save_file(os.path.join(tmp, f"{kind}-compressed.ckpt"), consolidated=True)
        optimizer.consolidate_state_dict()
        if rank == 0:
            compressed = optimizer.state_dict()
            require(compressed["onebit"]["local_size"] == 2, f"{kind}: the layout is not recorded: {compressed['onebit']}")
            held_once(torch, compressed["onebit"], kind)
            torch.save({"warmup": warmup, "compressed": compressed, "model": model.state_dict()},
                       os.path.join(tmp, f"{kind}.pt"))
        optimizer.close()


def held_once(torch, saved, kind):
    """m and v (and LAMB's v_fresh, 0/1 Adam's u and parameters at the last sync: every rank's alike
    right after a sync) kept once for the 4 ranks; each rank's part its error feedback alone."""
    shared = saved.get("shared", {})
    once = {"OnebitAdam": ["m", "v"], "OnebitLamb": ["m", "v", "v_fresh"],
            "ZeroOneAdam": ["m", "params_at_sync", "u", "v"]}
    require(sorted(k for k, v in shared.items() if torch.is_tensor(v)) == once[kind],
            f"{kind}: the tensors kept once are {sorted(shared)}, not {once[kind]}")
    for r, part in saved["parts"].items():
        require(sorted(part) == ["rank", "server_error", "worker_error"], f"{kind}: rank {r}'s part holds {sorted(part)}")


def refused_on_every_rank(torch, optimizer, load, words, kind):
    """load(optimizer) — a load_state_dict() or load_file() — is refused saying `words`, nothing changed."""
    before = optimizer.state_dict()
    try:
        load(optimizer)
    except ValueError as error:
        for said in words:
            require(said in str(error), f"{kind}: the refusal does not say {said!r}: {error}")
    else:
        raise CheckFailed(f"{kind}: a compression-stage checkpoint of another layout was loaded")
    after = optimizer.state_dict()
    require(after["param_groups"] == before["param_groups"], f"{kind}: the refused load changed param_groups")
    for key, value in before["onebit"]["parts"]["every"].items():
        if torch.is_tensor(value):
            require(torch.equal(after["onebit"]["parts"]["every"][key], value), f"{kind}: the refused load changed {key}")


def resized(rank, torch, dist, onebit, tmp):
    for kind in KINDS:
        saved = torch.load(os.path.join(tmp, f"{kind}.pt"))
        model, optimizer = make(onebit, torch, kind)
        model.load_state_dict(saved["model"])
        x, y = batch(torch, rank)
        optimizer.load_state_dict(saved["warmup"])  # any size: no error feedback in it
        fit(torch, model, optimizer, x, y, 1)
        optimizer.close()

        model, optimizer = make(onebit, torch, kind)
        optimizer.load_file(os.path.join(tmp, f"{kind}-warmup.ckpt"))  # the job file's warmup: any size too
        fit(torch, model, optimizer, x, y, 1)
        optimizer.save_file(os.path.join(tmp, f"{kind}-warmup-2.ckpt"), consolidated=True)  # for relaid's 4 ranks
        optimizer.close()

        model, optimizer = make(onebit, torch, kind)
        words = [REFUSED, "saved by a job of 4 ranks, 2 per host, loading into one of 2 ranks, flat",
                 "reset_error_feedback=True", "nothing was loaded"]
        refused_on_every_rank(torch, optimizer, lambda o: o.load_state_dict(saved["compressed"]), words, kind)
        refused_on_every_rank(torch, optimizer, lambda o: o.load_file(os.path.join(tmp, f"{kind}-compressed.ckpt")),
                              words, kind)
        optimizer.load_state_dict(saved["compressed"], reset_error_feedback=True)
        part = optimizer.state_dict()["onebit"]["parts"]
        mine = part.get(rank, part.get("every"))
        want = saved["compressed"]["onebit"]["shared"]
        for key in ("m", "v"):
            require(torch.equal(mine[key], want[key]), f"{kind}: {key} is not the checkpoint's")
        require(not mine["worker_error"].any() and mine["server_error"].numel() == 0, f"{kind}: error feedback kept")
        model.load_state_dict(saved["model"])
        fit(torch, model, optimizer, x, y, 3)
        if kind == "ZeroOneAdam":
            optimizer.synchronize()
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        rank0 = flat.clone()
        dist.broadcast(rank0, 0)
        require(torch.equal(flat, rank0), f"{kind}: after the reset load the ranks differ")
        # Its compressed calls have run now: a reset load would keep their error feedback, not drop it.
        try:
            optimizer.load_state_dict(saved["compressed"], reset_error_feedback=True)
        except ValueError as error:
            require("has already run" in str(error), f"{kind}: the refusal does not say 'has already run': {error}")
        else:
            raise CheckFailed(f"{kind}: a reset load into an optimizer whose compressed calls ran was taken")
        optimizer.close()


def relaid(rank, torch, dist, onebit, tmp):
    for kind in KINDS:
        saved = torch.load(os.path.join(tmp, f"{kind}.pt"))
        model, optimizer = make(onebit, torch, kind)
        words = [REFUSED, "saved by a job of 4 ranks, 2 per host, loading into one of 4 ranks, flat"]
        refused_on_every_rank(torch, optimizer, lambda o: o.load_state_dict(saved["compressed"]), words, kind)
        refused_on_every_rank(torch, optimizer, lambda o: o.load_file(os.path.join(tmp, f"{kind}-compressed.ckpt")),
                              words, kind)
        optimizer.load_file(os.path.join(tmp, f"{kind}-warmup-2.ckpt"))  # 2 ranks' warmup file: the 4 take it
        part = optimizer.state_dict()["onebit"]["parts"]["every"]
        step = part["schedule"]["step"] if kind == "ZeroOneAdam" else part["step"]
        require(step == FREEZE, f"{kind}: the grown job is at step {step}, not the 2 ranks' {FREEZE}")
        model.load_state_dict(saved["model"])
        x, y = batch(torch, rank)
        fit(torch, model, optimizer, x, y, 1)
        optimizer.close()


CASES = {"save": (4, "2", save), "resized": (2, "1", resized), "relaid": (4, "1", relaid)}


def rank_main(mode, rank, store, tmp):
    import torch
    import torch.distributed as dist
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
    import onebit
    world, _, case = CASES[mode]
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        case(rank, torch, dist, onebit, tmp)
    except CheckFailed as failure:
        print(f"rank {rank}: FAIL: {mode}: {failure}", file=sys.stderr, flush=True)
        sys.exit(4)
    dist.destroy_process_group()


def main():
    if len(sys.argv) == 5 and sys.argv[1] in CASES:
        rank_main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4])
        return 0
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        print(__doc__)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        for mode, (world, local_size, _) in CASES.items():
            env = dict(preload_env(sys.argv[1]), ONEBIT_LOCAL_SIZE=local_size)
            errors = run_ranks(__file__, mode, world, tmp, env)
            if mode == "resized":
                warned = [e.count("load_state_dict(reset_error_feedback=True): the checkpoint's error feedback")
                          for e in errors]
                require(warned == [len(KINDS), 0], f"rank 0 warns once per reset load, the others never: {warned}")
                require("(saved by a job of 4 ranks) is dropped" in errors[0], errors[0])
    print(f"OK: {', '.join(KINDS)}: a warmup checkpoint loads at another size; a compression-stage one of another "
          "layout is refused on every rank naming both, and loads with reset_error_feedback=True")
    return 0


if __name__ == "__main__":
    sys.exit(main())
