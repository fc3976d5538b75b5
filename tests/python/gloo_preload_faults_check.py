"""Failures under the Gloo front door (ONEBIT_TRANSPORT=gloo and tcp), with real torch.distributed:

  peer_dies    rank 1 is SIGKILLed after a first tagged call; rank 0's next tagged all_reduce
               raises a RuntimeError that names onebit, the tag and rank 1 — at once, from the broken
               connection, not from a timeout — and leaves the tensor unchanged.
  peer_stalls  rank 1 stays alive but never calls; rank 0's tagged all_reduce raises within the
               process group's timeout (2 s here) saying it timed out, tensor unchanged.

    /usr/bin/python3 tests/python/gloo_preload_faults_check.py BUILD_DIR
"""
import datetime
import os
import signal
import subprocess
import sys
import tempfile
from modes import require  # tests/python: a failed check raises, also under python -O

N = 10007


def rank_main(rank, case, store, out_dir):
    import torch
    import torch.distributed as dist
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
    import onebit

    timeout = datetime.timedelta(seconds=2 if case == "peer_stalls" else 60)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2, timeout=timeout)
    t = torch.zeros(N)
    onebit.tag(t, "momentum")
    if case == "peer_dies":
        t.copy_(torch.arange(N, dtype=torch.float32) - rank)
        dist.all_reduce(t)  # the communicator is up
        if rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
    if case == "peer_stalls" and rank == 1:
        sys.stdin.read()  # until the parent closes the pipe, after rank 0 is done
        return
    before = (torch.arange(N, dtype=torch.float32) * 0.5).contiguous()
    t.copy_(before)
    try:
        dist.all_reduce(t)
    except RuntimeError as error:
        message = str(error)
        with open(os.path.join(out_dir, "error.txt"), "w") as f:
            f.write(message)
        require(torch.equal(t, before), "the tensor changed in a failed call")
        # Leave without interpreter teardown: once, in about 40 runs under load, torch 1.13's
        # teardown of a process group whose collective had failed aborted with "terminate called
        # without an active exception" (cause not found; the closing note of 2026-12-02 says so).
        # This test checks the error and the tensor, which are settled by now.
        sys.stdout.flush()
        os._exit(0)
    raise AssertionError("the all_reduce did not fail")


def check(build, case, transport):
    preload = os.path.abspath(os.path.join(build, "libonebit-preload.so"))
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, LD_PRELOAD=preload, ONEBIT_TRANSPORT=transport, MASTER_ADDR="127.0.0.1")
        store = os.path.join(tmp, "store")
        procs = [subprocess.Popen([sys.executable, __file__, "rank", str(r), case, store, tmp], env=env,
                                  stdin=subprocess.PIPE) for r in range(2)]
        code0 = procs[0].wait(timeout=120)
        procs[1].stdin.close()
        code1 = procs[1].wait(timeout=120)
        require(code0 == 0, f"{case}/{transport}: rank 0 exit code {code0}")
        require(code1 == (-signal.SIGKILL if case == "peer_dies" else 0), f"{case}/{transport}: rank 1 exit {code1}")
        with open(os.path.join(tmp, "error.txt")) as f:
            message = f.read()
    require("onebit" in message and "'momentum'" in message, message)
    if case == "peer_dies":
        require("rank 1" in message and "timed out" not in message.lower(), message)
    else:
        require("timed out" in message.lower() and ("2000 ms" in message or "2000ms" in message), message)
    print(f"OK: {case} over {transport}: {message.splitlines()[0][:300]}")


def main():
    if len(sys.argv) == 6:
        rank_main(int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5])
        return 0
    for transport in ("gloo", "tcp"):
        for case in ("peer_dies", "peer_stalls"):
            check(sys.argv[1], case, transport)
    return 0


if __name__ == "__main__":
    sys.exit(main())
