"""Two ranks of torch.distributed's NCCL backend on one GPU, connected through onebit's NCCL_NET
plugin (distinct NCCL_HOSTID per rank makes NCCL treat them as two hosts; SHM/P2P off leaves it the
network), with libonebit-nccl-preload.so preloaded. Checks: NCCL's log shows NET/onebit; untagged
all_reduces of integer-valued tensors are exact; a tagged CUDA tensor's all_reduce equals the
float64 reference of algorithm.md over 3 calls, for float32 and float16; onebit.stats() counts the
compressed calls.

    python3 tools/gpu/nccl_job_check.py BUILD_DIR
"""
import os
import subprocess
import sys
import tempfile


HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))


def rank_main(rank, store):
    import numpy as np
    import torch
    import torch.distributed as dist
    import onebit
    from gloo_preload_check import inputs_of, reference
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=2)
    for dtype, tolerance in ((torch.float32, 1e-4), (torch.float16, 2e-3)):
        name = f"momentum-{dtype}"
        t = torch.zeros(5003, device="cuda", dtype=dtype)
        onebit.tag(t, name)
        np_dtype = np.float32 if dtype == torch.float32 else np.float16
        for call in range(3):
            t.copy_(torch.from_numpy(inputs_of(name, 5003, rank, call, np_dtype)))
            dist.all_reduce(t)
            want = reference([[inputs_of(name, 5003, r, c, np_dtype) for r in range(2)] for c in range(call + 1)])[call]
            got = t.float().cpu().numpy().astype(np.float64)
            err = np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-30))
            if not err < tolerance:
                print(f"rank {rank}: tagged {dtype} call {call}: relative error {err}", flush=True)
                sys.exit(4)
        onebit.untag(t)
    if onebit.stats()["compressed_calls"] != 6:
        print(f"rank {rank}: stats {onebit.stats()}", flush=True)
        sys.exit(5)
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
            env = dict(os.environ, LD_PRELOAD=os.path.join(build, "libonebit-nccl-preload.so"), NCCL_NET_PLUGIN="onebit", NCCL_HOSTID=f"onebit-host-{rank}", NCCL_SHM_DISABLE="1",
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
    print("nccl job: over onebit's NCCL_NET plugin (2 ranks, one GPU, distinct NCCL_HOSTID): untagged all_reduces "
          "exact; tagged float32/float16 all_reduces match the float64 reference over 3 calls")
    return 0


if __name__ == "__main__":
    sys.exit(main())
