"""ZeroOneAdam and OnebitLamb end to end: 2 ranks of real torch.distributed (gloo) with
libonebit-preload.so, one small model trained by each optimizer side by side.

1. "plain": 28 steps. The compressed all_reduces onebit took are exactly the schedule's (0/1 Adam:
   its compressed and sync steps; 1-bit LAMB: every step from freeze_step on), both ranks hold
   bitwise the same parameters (0/1 Adam: after its last step, a sync), and the LAMB coefficients
   moved.
2. "ddp": the same under DistributedDataParallel with onebit.ddp_comm_hook: bitwise the same
   parameters (the hook averages exactly the steps that want averaged gradients).
3. "first" + "resume": saved at step 17 (0/1 Adam in its local-step stage with u accumulated since
   a sync, 1-bit LAMB in compression) and resumed in fresh processes: bitwise the uninterrupted run.
4. In "plain", first: a C call refused (an untag of an untagged tensor, a ZeroOneAdam hyper-parameter
   the C core rejects) raises onebit.OnebitError with the code INVALID_ARGUMENT.

    /usr/bin/python3 tests/python/optimizers_check.py BUILD_DIR
"""
import json
import os
import sys
import tempfile

from ranks import preload_env, run_ranks
from modes import require  # tests/python: a failed check raises, also under python -O

WORLD, STEPS, STOP = 2, 28, 17
ZERO_ONE = dict(lr=0.01, var_freeze_step=8, var_update_scaler=2, local_step_scaler=4, local_step_clipper=4)
LAMB = dict(lr=0.01, freeze_step=6, weight_decay=0.01)
OVERRIDE = 10  # ONEBIT_FREEZE_STEP in the "override" run


def schedule_kinds(steps):
    """0/1 Adam's step kinds as onebit.h writes the rule: V(ariance), C(ompressed), L(ocal), S(ync)."""
    var_interval, var_counter, local_interval, local_counter, kinds = 1, 0, 1, 0, []
    for t in range(steps):
        count = t + 1
        if t <= ZERO_ONE["var_freeze_step"]:
            variance = count % var_interval == 0
            kinds.append("V" if variance else "C")
            if variance:
                var_counter += 1
                if var_counter == ZERO_ONE["var_update_scaler"]:
                    var_counter, var_interval = 0, var_interval * 2
        else:
            kinds.append("S" if count % local_interval == 0 else "L")
            local_counter += 1
            if local_counter == ZERO_ONE["local_step_scaler"]:
                local_counter, local_interval = 0, min(ZERO_ONE["local_step_clipper"], local_interval * 2)
    return kinds


def check_errors(torch, onebit):
    """A C call that fails raises onebit.OnebitError — a RuntimeError — with the call's onebit_result_t
    as .code and the library's message; pickled, it keeps both."""
    import pickle
    cases = [("untag of a tensor never tagged", lambda: onebit.untag(torch.zeros(4)), "is not tagged"),
             ("ZeroOneAdam(var_update_scaler=0)",
              lambda: onebit.ZeroOneAdam(torch.nn.Linear(2, 2).parameters(), var_update_scaler=0), "var_update_scaler")]
    for what, call, words in cases:
        try:
            call()
        except onebit.OnebitError as error:
            require(isinstance(error, RuntimeError) and error.code == onebit.OnebitError.INVALID_ARGUMENT
                    and words in str(error), f"{what}: {error.code} {error}")
            again = pickle.loads(pickle.dumps(error))
            require(type(again) is onebit.OnebitError and again.code == error.code and str(again) == str(error),
                    f"{what}: pickled, the error became {again!r}")
        else:
            require(False, f"{what}: accepted")


def rank_main(mode, rank, store, out_dir):
    import numpy as np
    import torch
    import torch.distributed as dist
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
    import onebit

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    if mode == "plain":
        check_errors(torch, onebit)

    def make(seed):
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2))

    models = {"zero_one": make(0), "lamb": make(1)}
    if mode == "ddp":
        models = {k: torch.nn.parallel.DistributedDataParallel(m) for k, m in models.items()}
    optimizers = {"zero_one": onebit.ZeroOneAdam(models["zero_one"].parameters(), **ZERO_ONE),
                  "lamb": onebit.OnebitLamb(models["lamb"].parameters(), **LAMB)}
    if mode == "ddp":
        for k in models:
            models[k].register_comm_hook(optimizers[k], onebit.ddp_comm_hook)
    rng = np.random.default_rng(100 + rank)
    x = torch.from_numpy(rng.standard_normal((128, 16)).astype(np.float32))
    y = torch.from_numpy(rng.standard_normal((128, 2)).astype(np.float32))
    checkpoint = os.path.join(out_dir, f"checkpoint{rank}.pt")
    first, last = 0, STEPS
    if mode == "first":
        last = STOP
    elif mode == "resume":
        saved = torch.load(checkpoint)
        for k in models:
            models[k].load_state_dict(saved[k]["model"])
            optimizers[k].load_state_dict(saved[k]["optimizer"])
        first = STOP
    kinds = []
    for _ in range(first, last):
        kinds.append("VCLS"[optimizers["zero_one"].next_step_kind()])
        for k in models:
            optimizers[k].zero_grad()
            torch.nn.functional.mse_loss(models[k](x), y).backward()
            optimizers[k].step()
    if mode == "first":
        torch.save({k: {"model": models[k].state_dict(), "optimizer": optimizers[k].state_dict()} for k in models},
                   checkpoint)
    for k, model in models.items():
        weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
        np.save(os.path.join(out_dir, f"{mode}-{k}{rank}.npy"), weights)
    with open(os.path.join(out_dir, f"{mode}{rank}.json"), "w") as f:
        json.dump({"kinds": "".join(kinds), "compressed_calls": onebit.stats()["compressed_calls"],
                   "lamb_coeffs": optimizers["lamb"].lamb_coeffs, "lamb_freeze": optimizers["lamb"].freeze_step}, f)
    dist.destroy_process_group()


def run(mode, tmp, env):
    return run_ranks(__file__, mode, WORLD, tmp, env)


def main():
    if len(sys.argv) == 5 and sys.argv[1] in ("plain", "ddp", "first", "resume", "override"):
        rank_main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4])
        return 0
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        print(__doc__)
        return 2
    import numpy as np
    expected = schedule_kinds(STEPS)
    require(expected[-1] == "S" and expected[STOP - 1] == "L" and set(expected) == set("VCLS"), "".join(expected))
    with tempfile.TemporaryDirectory() as tmp:
        env = preload_env(sys.argv[1])
        for mode in ("plain", "ddp", "first", "resume"):
            run(mode, tmp, env)
        run("override", tmp, dict(env, ONEBIT_FREEZE_STEP=str(OVERRIDE)))  # moves LAMB's freeze, not 0/1 Adam's
        reports = {mode: [json.load(open(os.path.join(tmp, f"{mode}{r}.json"))) for r in range(WORLD)]
                   for mode in ("plain", "ddp", "first", "resume", "override")}
        for report in reports["override"]:
            require(report["lamb_freeze"] == OVERRIDE and report["kinds"] == "".join(expected), report)
            require(report["compressed_calls"] == expected.count("C") + expected.count("S") + STEPS - OVERRIDE,
                    report)
        calls = expected.count("C") + expected.count("S") + STEPS - LAMB["freeze_step"]
        for mode in ("plain", "ddp"):
            for report in reports[mode]:
                require(report["kinds"] == "".join(expected), (mode, report["kinds"], "".join(expected)))
                require(report["compressed_calls"] == calls, (mode, report["compressed_calls"], calls))
        coeffs = reports["plain"][0]["lamb_coeffs"]
        require(len(coeffs) == 4 and all(c > 0 and c != 1.0 for c in coeffs), coeffs)
        load = lambda name: np.load(os.path.join(tmp, name)).view(np.uint32)
        for k in ("zero_one", "lamb"):
            plain = load(f"plain-{k}0.npy")
            require(np.array_equal(plain, load(f"plain-{k}1.npy")), f"{k}: the two ranks' parameters differ")
            for r in range(WORLD):
                require(np.array_equal(load(f"plain-{k}{r}.npy"), load(f"ddp-{k}{r}.npy")),
                        f"{k}, rank {r}: DDP with onebit.ddp_comm_hook differs from the plain run")
                require(np.array_equal(load(f"plain-{k}{r}.npy"), load(f"resume-{k}{r}.npy")),
                        f"{k}, rank {r}: resumed from step {STOP}, the run differs from the uninterrupted one")
    print(f"OK: ZeroOneAdam ({''.join(expected)}) and OnebitLamb (freeze at {LAMB['freeze_step']}): {calls} compressed "
          f"all_reduces as scheduled, replicas equal, DDP hook and a resume from step {STOP} bitwise equal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
