"""Finished jobs exit 0 over the onebit backend (pip torch): JOBS back-to-back 2-rank jobs, each a
DDP model, an untagged and a tagged all_reduce and an OnebitAdam step, half of them ending with
destroy_process_group() and half leaving the group to interpreter exit.

Before the backend released its communicator and inner gloo group itself (shutdown, which c10d
calls in destroy_process_group, and an atexit hook: backend._release_all), about one job in three
ended with SIGABRT after its last line ("terminate called without an active exception": a gloo
thread meeting a half-finalized interpreter) and torchrun reported the job failed.

    PYTHON tests/python/backend_exit_check.py BUILD_DIR [JOBS]   (default 20)
"""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))


def rank_main(rank, store, destroy):
    import torch
    import torch.distributed as dist
    import onebit
    onebit.register_backend()
    dist.init_process_group("onebit", init_method=f"file://{store}", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 8))
    optimizer = onebit.OnebitAdam(model.parameters(), freeze_step=1)
    model.register_comm_hook(optimizer, onebit.ddp_comm_hook)
    for _ in range(2):
        optimizer.zero_grad()
        model(torch.ones(4, 64)).sum().backward()
        optimizer.step()
    counts = torch.zeros(4, dtype=torch.int64)
    dist.all_reduce(counts)
    if destroy:
        dist.destroy_process_group()
        from onebit.backend import _backends
        if not all(backend.released for backend in _backends):  # torch called shutdown(): released now
            sys.exit(6)
        if onebit.stats()["compressed_calls"] != 1:  # the counts outlive the group
            sys.exit(5)


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "rank":
        rank_main(int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1")
        return 0
    if len(sys.argv) < 2 or not os.path.isdir(sys.argv[1]):
        print(__doc__)
        return 2
    import torch
    if not hasattr(torch._C._distributed_c10d, "Backend"):
        print(f"SKIP: torch {torch.__version__} has no c10d Backend class (the onebit backend needs torch >= 2.0)")
        return 77
    jobs = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    env = dict(os.environ, ONEBIT_LIBRARY=os.path.join(os.path.abspath(sys.argv[1]), "libonebit.so"),
               MASTER_ADDR="127.0.0.1")
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for job in range(jobs):
            destroy = str(job % 2)
            store = os.path.join(tmp, f"store-{job}")
            procs = [subprocess.Popen([sys.executable, __file__, "rank", str(r), store, destroy], env=env,
                                      stderr=subprocess.PIPE, text=True) for r in range(2)]
            errors = [p.communicate(timeout=300)[1] for p in procs]
            codes = [p.returncode for p in procs]
            if any(codes):
                failed += 1
                print(f"FAIL: job {job} (destroy_process_group: {destroy == '1'}): exit codes {codes}")
                for rank, text in enumerate(errors):
                    print(f"--- rank {rank}\n{text[-1500:]}")
    print(f"{jobs - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
