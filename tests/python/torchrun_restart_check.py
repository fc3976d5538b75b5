"""A job killed and restarted by torchrun, as elastic training runs one: 2 CPU ranks over the onebit
backend (pip's torch), DDP with OnebitAdam and its comm hook, a consolidated checkpoint saved by rank
0 every 4 steps. In the first attempt rank 1 kills itself (SIGKILL) at step 9, in the compression
stage; torchrun (--max-restarts 1) starts both ranks again, they load the step-8 checkpoint and train
to step 16. The final parameters must be bitwise equal on both ranks to an uninterrupted run's, under
each of torchrun's rendezvous — static (--master-addr/--master-port) and c10d — both of which keep
one store across restarts, with whatever the first attempt left there (docs/usage/restarting.md, "Restarting
a job"). Without onebit's care the restarted ranks could take the dead attempt's bootstrap root or
gloo addresses from it — a race, which this check loses only some of the time: membership_check.py
`stale-store` makes every read lose it.

    tests/scripts/with_pip_torch.sh tests/python/torchrun_restart_check.py BUILD_DIR
"""
import os
import signal
import socket
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from modes import CheckFailed, require  # noqa: E402

STEPS, KILLED_AT, SAVE_EVERY, FREEZE = 16, 9, 4, 3


def train(out_dir, kill):
    """One rank under torchrun: resumes from the checkpoint if there is one, trains to STEPS."""
    import datetime
    sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
    import torch
    import torch.distributed as dist
    import onebit
    onebit.register_backend()
    dist.init_process_group("onebit", timeout=datetime.timedelta(seconds=60))  # a wrong root: an error, not a hang
    rank, attempt = dist.get_rank(), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)))
    optimizer = onebit.OnebitAdam(model.parameters(), lr=1e-2, freeze_step=FREEZE)
    model.register_comm_hook(optimizer, onebit.ddp_comm_hook)
    checkpoint, first = os.path.join(out_dir, "checkpoint.pt"), 0
    if os.path.exists(checkpoint):
        saved = torch.load(checkpoint, weights_only=False)
        model.module.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        first = saved["step"]
        print(f"rank {rank}: attempt {attempt} resumed from step {first}", flush=True)
    for step in range(first, STEPS):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x, y = torch.randn(8, 32, generator=g), torch.randn(8, 4, generator=g)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        if kill and attempt == 0 and rank == 1 and step == KILLED_AT:
            os.kill(os.getpid(), signal.SIGKILL)
        optimizer.step()
        if (step + 1) % SAVE_EVERY == 0:
            optimizer.consolidate_state_dict()  # every rank
            if rank == 0:
                state = {"step": step + 1, "model": model.module.state_dict(), "optimizer": optimizer.state_dict()}
                torch.save(state, checkpoint + ".part")
                os.replace(checkpoint + ".part", checkpoint)
    final = torch.cat([p.detach().reshape(-1) for p in model.module.parameters()])
    torch.save(final, os.path.join(out_dir, f"final{rank}.pt"))
    print(f"rank {rank}: attempt {attempt} done, {onebit.stats()['compressed_calls']} compressed calls", flush=True)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def torchrun(build, out_dir, rendezvous, kill):
    """The job under torchrun; its output. torchrun's exit code must be 0. Past JOB_SECONDS the job
    is killed, torchrun and its workers (a session of their own)."""
    os.makedirs(out_dir)
    where = (["--master-addr", "127.0.0.1", "--master-port", str(free_port())] if rendezvous == "static" else
             ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}"])
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--max-restarts", "1" if kill else "0", *where, __file__, "train", out_dir, "kill" if kill else "whole"]
    env = {key: value for key, value in os.environ.items() if key != "ONEBIT_ROOT"}
    env.update(ONEBIT_LIBRARY=os.path.join(build, "libonebit.so"), OMP_NUM_THREADS="1")
    job = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True)
    try:
        output, _ = job.communicate(timeout=JOB_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        output, _ = job.communicate()
        raise CheckFailed(f"{rendezvous}: the job did not end in {JOB_SECONDS} s:\n{output[-6000:]}") from None
    require(job.returncode == 0, f"{rendezvous}: torchrun exited {job.returncode}:\n{output[-6000:]}")
    return output


JOB_SECONDS = 240  # three jobs inside ctest's 900 s; a job takes about 10 s


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "train":
        train(sys.argv[2], sys.argv[3] == "kill")
        return 0
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        print(__doc__)
        return 2
    import torch
    if not hasattr(torch._C._distributed_c10d, "Backend"):
        print(f"SKIP: torch {torch.__version__} has no c10d Backend class (the onebit backend needs torch >= 2.0)")
        return 77
    build = os.path.abspath(sys.argv[1])
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        torchrun(build, os.path.join(tmp, "whole"), "static", kill=False)
        whole = [torch.load(os.path.join(tmp, "whole", f"final{rank}.pt")) for rank in (0, 1)]
        require(torch.equal(whole[0], whole[1]), "the uninterrupted run's ranks ended apart")
        for rendezvous in ("static", "c10d"):
            out_dir = os.path.join(tmp, rendezvous)
            try:
                output = torchrun(build, out_dir, rendezvous, kill=True)
                for rank in (0, 1):
                    require(f"rank {rank}: attempt 1 resumed from step {KILLED_AT // SAVE_EVERY * SAVE_EVERY}" in output,
                            f"{rendezvous}: rank {rank} did not resume in a second attempt:\n{output[-4000:]}")
                    final = torch.load(os.path.join(out_dir, f"final{rank}.pt"))
                    require(torch.equal(final, whole[0]),
                            f"{rendezvous}: rank {rank}'s parameters differ from the uninterrupted run's by up to "
                            f"{(final - whole[0]).abs().max().item():.3g}")
            except CheckFailed as failure:
                failed += 1
                print(f"FAIL: {failure}", flush=True)
                continue
            print(f"ok: {rendezvous}: rank 1 killed at step {KILLED_AT}, both ranks restarted by torchrun, resumed "
                  f"and ended bitwise equal to the uninterrupted run", flush=True)
    print(f"{2 - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
