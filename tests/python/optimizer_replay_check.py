"""The three optimizers' steps replayed by the C core's host steps, through the shims as a training
loop drives them: tools/gpu/nccl_job_check.py's optimizer check (`optimizers_on_cuda`), run here on
CPU parameters over 2 ranks, so that the check the GPU run depends on is known to work before a
GPU is lent (the GPU run is rare: a check that breaks on a rename would waste it), and the CPU
shims are held to the same replay: OnebitAdam (its in-place path), ZeroOneAdam (every kind of
step) and OnebitLamb (warmup, scaling coefficients, compression), each step's parameters, state,
lr sums and LAMB's layer scalars equal to the host core's over the same inputs, bit for bit.

    PYTHON tests/python/optimizer_replay_check.py BUILD_DIR [preload|onebit]
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools", "gpu"))
from modes import rank_or_driver  # noqa: E402


def host_replay(mode, rank, torch, dist, onebit, tmp):
    import nccl_job_check
    nccl_job_check.optimizers_on_cuda(rank, device="cpu")  # prints a FAIL line for each step that differs
    if nccl_job_check.FAILURES:
        print(f"rank {rank}: FAIL: host-replay: {len(nccl_job_check.FAILURES)} checks failed", file=sys.stderr,
              flush=True)
        sys.exit(4)


if __name__ == "__main__":
    sys.exit(rank_or_driver(__file__, {"host-replay": host_replay}, ("host-replay",), 2, doc=__doc__))
