"""Two ranks of torch.distributed's NCCL backend on one GPU, connected through onebit's NCCL_NET
plugin: distinct NCCL_HOSTID per rank makes NCCL treat them as two hosts, and SHM/P2P off leaves it
the network. Untagged all_reduces of integer-valued tensors must be exact; the log must show NCCL
using NET/onebit. (Tagged all_reduces need the ncclAllReduce interposer, not built yet: reported
as such, not claimed.)

    python3 tools/gpu/nccl_job_check.py BUILD_DIR
"""
import os
import subprocess
import sys
import tempfile


def rank_main(rank, store):
    import torch
    import torch.distributed as dist
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=2)
    for n in (1, 1000, 1 << 20, (16 << 20) + 3):
        t = (torch.arange(n, device="cuda", dtype=torch.float32) % 1000) + rank
        dist.all_reduce(t)
        want = 2 * (torch.arange(n, device="cuda", dtype=torch.float32) % 1000) + 1
        if not torch.equal(t, want):
            print(f"rank {rank}: all_reduce of {n} floats is not exact", flush=True)
            sys.exit(3)
    torch.cuda.synchronize()
    dist.destroy_process_group()


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "rank":
        rank_main(int(sys.argv[2]), sys.argv[3])
        return 0
    build = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        procs, logs = [], []
        for rank in range(2):
            env = dict(os.environ, NCCL_NET_PLUGIN="onebit", NCCL_HOSTID=f"onebit-host-{rank}", NCCL_SHM_DISABLE="1",
                       NCCL_P2P_DISABLE="1", NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET",
                       LD_LIBRARY_PATH=build + ":" + os.environ.get("LD_LIBRARY_PATH", ""))
            log = open(os.path.join(tmp, f"rank{rank}.log"), "w+")
            logs.append(log)
            procs.append(subprocess.Popen([sys.executable, __file__, "rank", str(rank), store], env=env, stdout=log,
                                          stderr=subprocess.STDOUT))
        codes = [p.wait(timeout=300) for p in procs]
        text = ""
        for log in logs:
            log.seek(0)
            text += log.read()
    used = "NET/onebit" in text
    print(f"nccl job: exit codes {codes}; NET/onebit in NCCL's log: {used}")
    if not used or any(codes):
        print(text[-4000:])
        return 1
    print("nccl job: untagged all_reduces exact over onebit's NCCL_NET plugin (2 ranks, one GPU, distinct NCCL_HOSTID)")
    print("nccl job: tagged all_reduce: NOT RUN — the ncclAllReduce interposer is not built yet (issue 6)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
