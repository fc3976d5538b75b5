"""One optimizer, two languages, the same bits: each C++ optimizer shim (include/onebit/*.hpp, run by
tests/engine/shim_replay.cc as onebit-shim-replay) and its Python twin (onebit.OnebitAdam, ZeroOneAdam,
OnebitLamb over Debian's torch with libonebit-preload.so), each on 4 ranks fed the same gradient
stream, end with bitwise equal parameters, m and v on every rank, and the same counters:

  adam       OnebitAdam, freeze_step 5, 12 steps: warmup, the freeze, the compression stage;
  adam-auto  OnebitAdam, freeze_step "auto" (window 2, threshold 0.3, at most step 9), 14 steps: the
             automatic freeze decides at the same step in both languages (the C core's rule);
  adam-bias  OnebitAdam, freeze_step 5, bias_correction=True, 12 steps: the corrected steps, the
             variance's correction frozen at the freeze;
  adam-deepspeed  OnebitAdam, freeze_step 5, deepspeed_schedule=True, 12 steps: the first call counts only;
  zero_one   ZeroOneAdam, var_freeze_step 6 (scalers 2 and 4, clipper 4), 18 steps: variance steps,
             compressed-gradient steps, local steps and syncs, with its schedule's counters;
  lamb       OnebitLamb, freeze_step 5, 12 steps: each group one layer, its trust ratio frozen.

The stream is onebit-shim-replay's (its header says it): two parameter groups with their own lr
and weight decay, dyadic gradients whose sums over ranks are exact, so that the gloo ring's and
onebit's ring's averages are the same bits and what could differ is each shim's own arithmetic,
schedule and compressed calls. Both run flat compression (ONEBIT_LOCAL_SIZE=1).

Then the checkpoints cross: each language's full run also saves every rank's parameters and
checkpoint file (save_file(), onebit.h "Checkpoint files") after SAVE_AT steps of the mode, and the
other language resumes from those files (load_file()) and takes the remaining steps: its end must
be the full run's, bit for bit, on every rank — a checkpoint saved by one language resumes in the
other. In JOB_MODES the Python run also saves the job's one file (save_file(consolidated=True),
each rank's part streamed to rank 0's file): C++ resumes from its part of that file instead, and a
Python run resumes from it too, each ending bitwise as the full runs.

    /usr/bin/python3 tests/python/shim_languages_check.py BUILD_DIR [MODE ...]
"""
import os
import socket
import subprocess
import sys
import tempfile

from modes import require
from ranks import preload_env, run_ranks

WORLD = 4
SIZES = (1000, 37)
# After how many steps the checkpoints are taken: past each mode's freeze (error feedback held),
# and for adam-auto before its decision (the measurements and v_then held, undecided).
SAVE_AT = {"adam": 8, "adam-auto": 5, "adam-bias": 8, "adam-deepspeed": 8, "zero_one": 11, "lamb": 8}
JOB_MODES = ("adam-auto", "zero_one", "lamb")  # saved as the job's one file too, and resumed from it
MODES = {"adam": dict(optimizer="adam", steps=12, freeze="5"),
         "adam-auto": dict(optimizer="adam", steps=14, freeze="auto", window=2, threshold=0.3, max_step=10),
         "adam-bias": dict(optimizer="adam", steps=12, freeze="5", bias_correction=True),
         "adam-deepspeed": dict(optimizer="adam", steps=12, freeze="5", deepspeed_schedule=True),
         "zero_one": dict(optimizer="zero_one", steps=18, freeze="6"),
         "lamb": dict(optimizer="lamb", steps=12, freeze="5")}


def stream(np, rank, step):
    """Rank `rank`'s gradient at `step`: onebit-shim-replay's, element for element."""
    i = np.arange(sum(SIZES), dtype=np.int64)
    return (((rank * 1000003 + step * 7919 + i * 104729) % 4097 - 2048) / 2048.0).astype(np.float32)


def rank_main(run_name, rank, store, out_dir):
    """One Python rank: "MODE" runs the whole stream and saves at SAVE_AT into OUT_DIR/python-MODE;
    "MODE@resume" resumes from the C++ run's files in OUT_DIR/cpp-MODE; "MODE@job" from the Python
    run's job file in OUT_DIR/python-MODE."""
    import numpy as np
    import torch
    import torch.distributed as dist
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
    import onebit
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    mode, _, resume = run_name.partition("@")
    run = MODES[mode]
    start = np.array([(i % 61 - 30) / 64.0 for i in range(sum(SIZES))], dtype=np.float32)
    params = [torch.nn.Parameter(torch.from_numpy(start[:SIZES[0]].copy())),
              torch.nn.Parameter(torch.from_numpy(start[SIZES[0]:].copy()))]
    # The C++ replay's float settings, as float64s: the bias correction computes in float64 from them.
    f32 = lambda x: float(np.float32(x))  # noqa: E731
    groups = [dict(params=[params[0]], lr=f32(1e-3), weight_decay=0.0),
              dict(params=[params[1]], lr=f32(3e-3), weight_decay=f32(0.01))]
    optimizer = make_optimizer(onebit, run, groups)
    first = 0
    if resume:
        where = os.path.join(out_dir, f"{'python' if resume == 'job' else 'cpp'}-{mode}")
        flat = np.fromfile(os.path.join(where, f"params-{rank}.bin"), dtype=np.float32)
        with torch.no_grad():
            params[0].copy_(torch.from_numpy(flat[:SIZES[0]].copy()))
            params[1].copy_(torch.from_numpy(flat[SIZES[0]:].copy()))
        optimizer.load_file(os.path.join(where, f"optimizer-{'job' if resume == 'job' else rank}.ckpt"))
        first = SAVE_AT[mode]
    for step in range(first, run["steps"]):
        g = torch.from_numpy(stream(np, rank, step))
        params[0].grad, params[1].grad = g[:SIZES[0]].clone(), g[SIZES[0]:].clone()
        optimizer.step()
        if not resume and step + 1 == SAVE_AT[mode]:
            where = os.path.join(out_dir, f"python-{mode}")
            os.makedirs(where, exist_ok=True)
            torch.cat([p.detach().reshape(-1) for p in params]).numpy().tofile(os.path.join(where, f"params-{rank}.bin"))
            optimizer.save_file(os.path.join(where, f"optimizer-{rank}.ckpt"))
            if mode in JOB_MODES:
                optimizer.save_file(os.path.join(where, "optimizer-job.ckpt"), consolidated=True)
    saved = optimizer.state_dict()["onebit"]
    part = saved["parts"].get(rank, saved["parts"].get("every"))
    if "shared" in saved:
        part = dict(saved["shared"], **part)
    flat = torch.cat([p.detach().reshape(-1) for p in params]).numpy()
    with open(os.path.join(out_dir, f"python-{run_name}-{rank}.bin"), "wb") as f:
        f.write(flat.tobytes() + part["m"].numpy().tobytes() + part["v"].numpy().tobytes()
                + np.array(counters(run, optimizer, part), dtype=np.int64).tobytes())
    optimizer.close()
    dist.destroy_process_group()


def make_optimizer(onebit, run, groups):
    """The Python optimizer onebit-shim-replay's C++ one is, with its settings."""
    freeze = run["freeze"]
    if run["optimizer"] == "zero_one":
        return onebit.ZeroOneAdam(groups, var_freeze_step=int(freeze), var_update_scaler=2, local_step_scaler=4,
                                  local_step_clipper=4)
    if run["optimizer"] == "lamb":
        return onebit.OnebitLamb(groups, freeze_step=int(freeze))
    import numpy as np
    adam = dict(betas=(float(np.float32(0.9)), float(np.float32(0.999))), eps=float(np.float32(1e-8)),
                bias_correction=run.get("bias_correction", False), deepspeed_schedule=run.get("deepspeed_schedule", False))
    if freeze == "auto":
        return onebit.OnebitAdam(groups, freeze_step="auto", freeze_window=run["window"],
                                 freeze_threshold=run["threshold"], max_freeze_step=run["max_step"], **adam)
    return onebit.OnebitAdam(groups, freeze_step=int(freeze), **adam)


def counters(run, optimizer, part):
    """The counters onebit-shim-replay writes for the same optimizer."""
    if run["optimizer"] == "zero_one":
        return [part["schedule"][k] for k in ("step", "var_interval", "var_counter", "local_step_interval",
                                               "local_step_counter")]
    if run["optimizer"] == "lamb":
        return [part["step"]]
    return [part["step"], -1 if optimizer.freeze_step is None else optimizer.freeze_step]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cpp(build, mode, tmp, resume=False):
    """The C++ ranks of `mode`: the whole stream, saving at SAVE_AT into TMP/cpp-MODE; or (`resume`)
    from the Python run's files in TMP/python-MODE (its job file in JOB_MODES)."""
    run = MODES[mode]
    args = ["--optimizer", run["optimizer"], "--steps", str(run["steps"]), "--freeze", run["freeze"]]
    where = os.path.join(tmp, f"{'python' if resume else 'cpp'}-{mode}")
    os.makedirs(where, exist_ok=True)
    args += ["--resume-at" if resume else "--save-at", str(SAVE_AT[mode]), "--checkpoints", where]
    if resume and mode in JOB_MODES:
        args += ["--job", "1"]
    name = f"{mode}@resume" if resume else mode
    if run["freeze"] == "auto":
        args += ["--window", str(run["window"]), "--threshold", str(run["threshold"]), "--max-step", str(run["max_step"])]
    args += ["--bias-correction", str(int(run.get("bias_correction", False))),
             "--deepspeed", str(int(run.get("deepspeed_schedule", False)))]
    root = f"127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONEBIT_") and k not in ("LD_PRELOAD",)}
    procs = [subprocess.Popen([os.path.join(build, "tests", "onebit-shim-replay"), *args, "--out",
                               os.path.join(tmp, f"cpp-{name}-{r}.bin")],
                              env=dict(env, ONEBIT_RANK=str(r), ONEBIT_WORLD_SIZE=str(WORLD), ONEBIT_ROOT=root,
                                       ONEBIT_LOCAL_SIZE="1"), stderr=subprocess.PIPE, text=True)
             for r in range(WORLD)]
    errors = [p.communicate(timeout=300)[1] for p in procs]
    require(not any(p.returncode for p in procs), f"{name}: onebit-shim-replay failed:\n" + "\n".join(errors))


def compare(np, mode, tmp, runs=("cpp", "python")):
    """Every rank's end of the two `runs` (file prefixes: "cpp", "python-MODE@resume", ...) bitwise equal."""
    total = sum(SIZES)
    for rank in range(WORLD):
        got = {}
        for language in runs:
            prefix, _, resumed = language.partition("@")  # "python@resume": python-MODE@resume-RANK.bin
            with open(os.path.join(tmp, f"{prefix}-{mode}{'@' + resumed if resumed else ''}-{rank}.bin"), "rb") as f:
                data = f.read()
            floats = np.frombuffer(data[:12 * total], dtype=np.float32).reshape(3, total)
            got[language] = dict(params=floats[0], m=floats[1], v=floats[2],
                                 counters=tuple(np.frombuffer(data[12 * total:], dtype=np.int64).tolist()))
        first, second = runs
        for what in ("params", "m", "v"):
            a, b = got[first][what], got[second][what]
            differ = np.flatnonzero(a.view(np.uint32) != b.view(np.uint32))
            require(differ.size == 0, f"{mode}, rank {rank}: {what} differs in {differ.size} of {total} elements, first "
                                      f"at {differ[:1].tolist()}: {first} {a[differ[:1]].tolist()}, {second} "
                                      f"{b[differ[:1]].tolist()}")
        require(got[first]["counters"] == got[second]["counters"],
                f"{mode}, rank {rank}: counters {first} {got[first]['counters']}, {second} {got[second]['counters']}")
    return got[first]["counters"]


def main():
    if len(sys.argv) == 5:  # ranks.run_ranks: MODE RANK STORE TMP
        rank_main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4])
        return 0
    import numpy as np
    build = os.path.abspath(sys.argv[1])
    env = dict(preload_env(build), ONEBIT_LOCAL_SIZE="1", OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as tmp:
        for mode in sys.argv[2:] or MODES:
            run_cpp(build, mode, tmp)
            run_ranks(os.path.abspath(__file__), mode, WORLD, tmp, env)
            said = compare(np, mode, tmp)
            print(f"{mode}: the C++ and the Python shim, {WORLD} ranks, {MODES[mode]['steps']} steps, counters {said}: "
                  "parameters, m and v bitwise equal on every rank")
            run_ranks(os.path.abspath(__file__), f"{mode}@resume", WORLD, tmp, env)  # from C++'s files
            compare(np, mode, tmp, runs=("cpp", "python@resume"))
            run_cpp(build, mode, tmp, resume=True)  # from Python's files
            compare(np, mode, tmp, runs=("python", "cpp@resume"))
            print(f"{mode}: checkpoint files of step {SAVE_AT[mode]} crossed both ways: Python resumed C++'s and C++ "
                  f"resumed Python's{' job file' if mode in JOB_MODES else ''}, each ending bitwise as the full runs")
            if mode in JOB_MODES:
                run_ranks(os.path.abspath(__file__), f"{mode}@job", WORLD, tmp, env)  # from Python's job file
                compare(np, mode, tmp, runs=("python", "python@job"))
                print(f"{mode}: Python resumed its own job file of step {SAVE_AT[mode]} bitwise as the full run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
