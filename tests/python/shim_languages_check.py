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
schedule and compressed calls. Both run flat compression (ONEBIT_LOCAL_SIZE=1). Checkpoints are
not compared: the two languages still keep them in formats of their own (issue 46).

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


def rank_main(mode, rank, store, out_dir):
    import numpy as np
    import torch
    import torch.distributed as dist
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
    import onebit
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    run = MODES[mode]
    start = np.array([(i % 61 - 30) / 64.0 for i in range(sum(SIZES))], dtype=np.float32)
    params = [torch.nn.Parameter(torch.from_numpy(start[:SIZES[0]].copy())),
              torch.nn.Parameter(torch.from_numpy(start[SIZES[0]:].copy()))]
    # The C++ replay's float settings, as float64s: the bias correction computes in float64 from them.
    f32 = lambda x: float(np.float32(x))  # noqa: E731
    groups = [dict(params=[params[0]], lr=f32(1e-3), weight_decay=0.0),
              dict(params=[params[1]], lr=f32(3e-3), weight_decay=f32(0.01))]
    optimizer = make_optimizer(onebit, run, groups)
    for step in range(run["steps"]):
        g = torch.from_numpy(stream(np, rank, step))
        params[0].grad, params[1].grad = g[:SIZES[0]].clone(), g[SIZES[0]:].clone()
        optimizer.step()
    saved = optimizer.state_dict()["onebit"]
    part = saved["parts"].get(rank, saved["parts"].get("every"))
    if "shared" in saved:
        part = dict(saved["shared"], **part)
    flat = torch.cat([p.detach().reshape(-1) for p in params]).numpy()
    with open(os.path.join(out_dir, f"python-{mode}-{rank}.bin"), "wb") as f:
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


def run_cpp(build, mode, tmp):
    run = MODES[mode]
    args = ["--optimizer", run["optimizer"], "--steps", str(run["steps"]), "--freeze", run["freeze"]]
    if run["freeze"] == "auto":
        args += ["--window", str(run["window"]), "--threshold", str(run["threshold"]), "--max-step", str(run["max_step"])]
    args += ["--bias-correction", str(int(run.get("bias_correction", False))),
             "--deepspeed", str(int(run.get("deepspeed_schedule", False)))]
    root = f"127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONEBIT_") and k not in ("LD_PRELOAD",)}
    procs = [subprocess.Popen([os.path.join(build, "tests", "onebit-shim-replay"), *args, "--out",
                               os.path.join(tmp, f"cpp-{mode}-{r}.bin")],
                              env=dict(env, ONEBIT_RANK=str(r), ONEBIT_WORLD_SIZE=str(WORLD), ONEBIT_ROOT=root,
                                       ONEBIT_LOCAL_SIZE="1"), stderr=subprocess.PIPE, text=True)
             for r in range(WORLD)]
    errors = [p.communicate(timeout=300)[1] for p in procs]
    require(not any(p.returncode for p in procs), f"{mode}: onebit-shim-replay failed:\n" + "\n".join(errors))


def compare(np, mode, tmp):
    total = sum(SIZES)
    for rank in range(WORLD):
        got = {}
        for language in ("cpp", "python"):
            with open(os.path.join(tmp, f"{language}-{mode}-{rank}.bin"), "rb") as f:
                data = f.read()
            floats = np.frombuffer(data[:12 * total], dtype=np.float32).reshape(3, total)
            got[language] = dict(params=floats[0], m=floats[1], v=floats[2],
                                 counters=tuple(np.frombuffer(data[12 * total:], dtype=np.int64).tolist()))
        for what in ("params", "m", "v"):
            a, b = got["cpp"][what], got["python"][what]
            differ = np.flatnonzero(a.view(np.uint32) != b.view(np.uint32))
            require(differ.size == 0, f"{mode}, rank {rank}: {what} differs in {differ.size} of {total} elements, first "
                                      f"at {differ[:1].tolist()}: C++ {a[differ[:1]].tolist()}, Python {b[differ[:1]].tolist()}")
        require(got["cpp"]["counters"] == got["python"]["counters"],
                f"{mode}, rank {rank}: counters C++ {got['cpp']['counters']}, Python {got['python']['counters']}")
    return got["cpp"]["counters"]


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
    return 0


if __name__ == "__main__":
    sys.exit(main())
