"""OnebitAdam with DistributedDataParallel and onebit.ddp_comm_hook, 2 ranks of real
torch.distributed (gloo) under libonebit-preload.so, two parameter groups (the second with lr 0).

Checks:
  - DDP + hook and plain OnebitAdam (which averages gradients itself) end with bitwise equal
    parameters on every rank: the hook averages in warmup and skips the gradient allreduce after;
  - the lr-0 group never moves and the other does: each group's hyper-parameters reach its range;
  - the per-step loss all_reduce is exact (never compressed), and onebit.stats() counts: one
    compressed call per compression-stage step, nothing else compressed.

    /usr/bin/python3 tests/python/onebit_ddp_check.py BUILD_DIR
"""
import gc
import json
import os
import subprocess
import sys
import tempfile
from modes import require  # tests/python: a failed check raises, also under python -O

WORLD, STEPS, FREEZE = 2, 30, 8


def rank_main(rank, mode, store, out_dir):
    import numpy as np
    import torch
    import torch.distributed as dist
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
    import onebit

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3))
    frozen = model[2].bias
    start_frozen = frozen.detach().clone()
    start_rest = model[0].weight.detach().clone()
    rng = np.random.default_rng(50 + rank)
    x = torch.from_numpy(rng.standard_normal((64, 16)).astype(np.float32))
    y = torch.from_numpy(rng.standard_normal((64, 3)).astype(np.float32))
    groups = [{"params": [p for p in model.parameters() if p is not frozen], "weight_decay": 0.01},
              {"params": [frozen], "lr": 0.0}]
    net = model
    if mode == "ddp":
        net = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = onebit.OnebitAdam(groups, lr=0.01, freeze_step=FREEZE)
    if mode == "ddp":
        net.register_comm_hook(optimizer, onebit.ddp_comm_hook)
    for _ in range(STEPS):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        optimizer.step()
        mine = loss.detach().clone()
        gathered = [torch.zeros(1) for _ in range(WORLD)]
        dist.all_gather(gathered, mine.reshape(1))
        dist.all_reduce(mine)  # a metric: must be exact
        require(mine.item() == (gathered[0] + gathered[1]).item(), (mine, gathered))
    require(torch.equal(frozen.detach(), start_frozen), "the lr-0 group moved")
    require(not torch.equal(model[0].weight.detach(), start_rest), "the trained group did not move")
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    np.save(os.path.join(out_dir, f"{mode}{rank}.npy"), params)
    s = onebit.stats()
    require(s["compressed_calls"] == STEPS - FREEZE, s)
    with open(os.path.join(out_dir, f"{mode}{rank}.json"), "w") as f:
        json.dump(s, f)
    optimizer.close()
    # Torch 1.13: a DDP left to interpreter teardown can deadlock there — its Reducer's destructor
    # joins gloo's worker thread, holding the GIL that thread waits for to free a tensor (seen as a
    # rank that never exits, about 1 run in 20 on a loaded machine). docs/usage/optimizers.md's advice: let the
    # DDP module go before destroy_process_group().
    del net
    gc.collect()
    dist.destroy_process_group()


def main():
    if len(sys.argv) == 6:
        rank_main(int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5])
        return 0
    import numpy as np
    preload = os.path.abspath(os.path.join(sys.argv[1], "libonebit-preload.so"))
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, LD_PRELOAD=preload, MASTER_ADDR="127.0.0.1")
        env.pop("ONEBIT_FREEZE_STEP", None)
        for mode in ("ddp", "plain"):
            store = os.path.join(tmp, f"store-{mode}")
            procs = [subprocess.Popen([sys.executable, __file__, "rank", str(r), mode, store, tmp], env=env)
                     for r in range(WORLD)]
            codes = [p.wait(timeout=300) for p in procs]
            require(not any(codes), f"{mode}: rank exit codes {codes}")
        params = {(m, r): np.load(os.path.join(tmp, f"{m}{r}.npy")) for m in ("ddp", "plain") for r in range(WORLD)}
        for key, value in params.items():
            require(np.array_equal(value.view(np.uint32), params[("plain", 0)].view(np.uint32)),
                    f"{key} differs from plain OnebitAdam on rank 0")
        ddp = json.load(open(os.path.join(tmp, "ddp0.json")))
        plain = json.load(open(os.path.join(tmp, "plain0.json")))
        # Warmup: DDP's bucket (one here) or the optimizer's flat gradient, plus the loss each step,
        # plus the constructor's check that the ranks agree on the schedule (one small all_reduce).
        require(plain["forwarded_calls"] == FREEZE + STEPS + 1, plain)
        # DDP + hook: one bucket per warmup step and none after (1-bit Adam sends no gradients then).
        require(ddp["forwarded_calls"] == FREEZE + STEPS + 1, ddp)
    print(f"OK: DDP + onebit.ddp_comm_hook and plain OnebitAdam agree bit for bit after {STEPS} steps "
          f"(freeze at {FREEZE}); lr-0 group unmoved; loss all_reduces exact")
    return 0


if __name__ == "__main__":
    sys.exit(main())
