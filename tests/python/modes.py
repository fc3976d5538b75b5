"""The runner the checks that take a door and a list of modes share (training_hazards_check.py,
parameter_moves_check.py): each mode is WORLD ranks of one script as processes over a file store,
through one of two doors —

  preload: Debian's torch, gloo, libonebit-preload.so in LD_PRELOAD;
  onebit:  pip's torch, the onebit backend, libonebit.so through ONEBIT_LIBRARY —

and a check named by the script (`CheckFailed` from `require`, never a bare assert, which python
-O would drop). The script's rank entry is `SCRIPT rank MODE DOOR RANK STORE TMP`.
"""
import contextlib
import os
import subprocess
import sys
import tempfile
import time


class CheckFailed(Exception):
    pass


class Skipped(Exception):
    """Raised by a rank for a case this torch or this venv cannot run; the rank prints SKIP."""


def require(condition, what):
    if not condition:
        raise CheckFailed(what)


def modules(door):
    """In a rank: (torch, dist, onebit), the onebit backend registered for its door."""
    import torch
    import torch.distributed as dist
    import onebit
    if door == "onebit":
        onebit.register_backend()
    return torch, dist, onebit


def join(door, rank, store, world):
    """In a rank: the process group through `door`; returns (torch, dist, onebit)."""
    torch, dist, onebit = modules(door)
    dist.init_process_group("onebit" if door == "onebit" else "gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world)
    return torch, dist, onebit


def run_case(case, mode, door, rank, store, tmp, world):
    """In a rank: join, run `case(mode, rank, torch, dist, onebit, tmp)`, leave; exit 4 naming a failed check.
    A case marked `makes_its_groups` is run before any group is made, and makes its own."""
    if getattr(case, "makes_its_groups", False):
        torch, dist, onebit = modules(door)
    else:
        torch, dist, onebit = join(door, rank, store, world)
    torch.manual_seed(0)
    try:
        case(mode, rank, torch, dist, onebit, tmp)
    except CheckFailed as failure:
        print(f"rank {rank}: FAIL: {mode}: {failure}", file=sys.stderr, flush=True)
        sys.exit(4)
    except Skipped as why:
        print(f"SKIP: {why}", flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()


def fit(torch, model, optimizer, x, y, steps):
    """`steps` optimizer steps of the MSE of model(x) against y, one batch; each step's loss."""
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def door_env(build, door):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1")
    env.pop("ONEBIT_FREEZE_STEP", None)
    if door == "preload":
        env["LD_PRELOAD"] = os.path.join(build, "libonebit-preload.so")
    else:
        env["ONEBIT_LIBRARY"] = os.path.join(build, "libonebit.so")
    return env


# How long a mode's ranks may take, shorter than ctest's 600 s: a rank that failed while the other
# waits in a collective is then reported with its message, not as ctest's bare timeout.
RANKS_SECONDS = 540


def collect(procs, seconds):
    """Every rank's (stdout, stderr) and exit code, waiting `seconds` in all; past it the ranks still
    running are killed (exit code None) and what they wrote is returned all the same."""
    deadline = time.monotonic() + seconds
    outputs, codes = [], []
    for p in procs:
        try:
            outputs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic())))
            codes.append(p.returncode)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            outputs.append((out, err + f"\n(killed after {seconds} s)"))
            codes.append(None)
    return outputs, codes


def run_modes(script, argv, modes, world, check=None, rank_env=None, around_mode=None, doc=""):
    """The driver's main: `argv` is BUILD_DIR [preload|onebit] [MODE ...]. Runs each mode's ranks
    (their environment from `rank_env(mode, rank, env)` if given; inside `around_mode(mode)`, a
    context manager, if given, whose value — when not None — makes each rank's command:
    `value(rank, argv)`, e.g. in a network namespace of its own), fails a mode whose ranks do not
    all exit 0 or whose `check(mode, outputs)` raises CheckFailed (outputs: each rank's (stdout,
    stderr)), and prints the closing 'N passed, N failed' line. Returns the exit code (77: skip)."""
    if len(argv) < 1 or not os.path.isdir(argv[0]):
        print(doc)
        return 2
    build = os.path.abspath(argv[0])
    door = argv[1] if len(argv) > 1 else "preload"
    modes = argv[2:] or modes
    import torch
    if door == "onebit" and not hasattr(torch._C._distributed_c10d, "Backend"):
        print(f"SKIP: torch {torch.__version__} has no c10d Backend class (the onebit backend needs torch >= 2.0)")
        return 77
    print(f"torch {torch.__version__}, door {door}", flush=True)
    env = door_env(build, door)
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in modes:
            store = os.path.join(tmp, f"store-{mode}")
            with around_mode(mode) if around_mode else contextlib.nullcontext() as command:
                procs = [subprocess.Popen((command or (lambda rank, argv: argv))(
                    rank, [sys.executable, script, "rank", mode, door, str(rank), store, tmp]),
                    env=rank_env(mode, rank, env) if rank_env else env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    text=True) for rank in range(world)]
                outputs, codes = collect(procs, RANKS_SECONDS)
            try:
                require(codes == [0] * world, f"exit codes {codes}")
                if check is not None:
                    check(mode, outputs)
            except CheckFailed as failure:
                failed.append(mode)
                print(f"FAIL: {mode}: {failure}")
                for rank, (stdout, stderr) in enumerate(outputs):
                    print(f"--- rank {rank}\n{stdout[-2000:]}{stderr[-4000:]}")
                continue
            print(f"ok: {mode}\n{outputs[0][0].rstrip()}".rstrip(), flush=True)
    print(f"{len(modes) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


def rank_or_driver(script, cases, modes, world, **driver):
    """A check script's main: a rank when called as SCRIPT rank ..., else the driver."""
    if len(sys.argv) == 7 and sys.argv[1] == "rank":
        mode = sys.argv[2]
        run_case(cases[mode], mode, sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6], world)
        return 0
    return run_modes(script, sys.argv[1:], modes, world, **driver)
