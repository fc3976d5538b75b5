"""The paper's headline on onebit's code: DDP step time with Adam vs with 1-bit Adam, 2 ranks on the
one GPU, through onebit's NCCL_NET plugin (distinct NCCL_HOSTID per rank, SHM/P2P off: NCCL's
traffic takes the network), libonebit-nccl-preload.so preloaded in both runs (it forwards
untagged calls, and counts them).

  adam:   DDP (its own bucketed allreduce) + torch.optim.Adam
  onebit: DDP + onebit.ddp_comm_hook + onebit.OnebitAdam (freeze after the warmup steps; from then
          on DDP sends nothing and the momentum goes compressed through the preload)

A model of ~100 M parameters (a stack of square Linear layers), the same seed and data on both.
Reports per run: the median step time over the measured steps (all in the compression stage for
onebit), the bytes this rank put on the wire per measured step (from onebit.stats(): NCCL's ring
sends 2(W-1)/W of each forwarded buffer, onebit counts what it sent), and whether both ranks'
parameters are bitwise equal at the end. With --link RATE (root, network namespaces) the two ranks
run behind an emulated link (tools/ethernet/onebit-ethernet's Emulation: veth + tc tbf).

    python3 tools/gpu/ddp_step_check.py BUILD_DIR [--link 10gbit] [--width 2880 --layers 12]

--cpu runs the same script on CPU ranks (gloo, libonebit-preload.so): what CI uses to keep this
script honest on machines without a GPU; its times mean nothing.
"""
import argparse
import importlib.machinery
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")


def rank_main(config):
    import torch
    import torch.distributed as dist
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import onebit
    rank = config["rank"]
    device = config["device"]
    if device == "cuda":
        torch.cuda.set_device(0)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=f"file://{config['store']}", rank=rank,
                            world_size=2)
    torch.manual_seed(1)
    width, layers = config["width"], config["layers"]
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)]).to(device)
    params = sum(p.numel() for p in model.parameters())
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0] if device == "cuda" else None,
                                                    bucket_cap_mb=100)
    warmup, measured = config["warmup"], config["measured"]
    if config["optimizer"] == "onebit":
        optimizer = onebit.OnebitAdam(ddp.parameters(), lr=1e-4, freeze_step=warmup)
        ddp.register_comm_hook(optimizer, onebit.ddp_comm_hook)
    else:
        optimizer = torch.optim.Adam(ddp.parameters(), lr=1e-4)
    generator = torch.Generator(device=device).manual_seed(100 + rank)
    times, stats_before = [], None
    for step in range(warmup + measured):
        if step == warmup:
            stats_before = onebit.stats()
        x = torch.randn(64, width, device=device, generator=generator)
        sync()
        start = time.perf_counter()
        loss = ddp(x).pow(2).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        sync()
        if step >= warmup:
            times.append(time.perf_counter() - start)
    after = onebit.stats()
    wire = (after["compressed_bytes_sent"] - stats_before["compressed_bytes_sent"]) + \
        (after["forwarded_bytes"] - stats_before["forwarded_bytes"]) * 2 * (2 - 1) / 2
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.zeros_like(flat) for _ in range(2)]
    dist.all_gather(gathered, flat)
    equal = bool(torch.equal(gathered[0], gathered[1]))
    result = dict(optimizer=config["optimizer"], rank=rank, params=params, median_s=statistics.median(times),
                  wire_bytes_per_step=wire / measured, ranks_equal=equal,
                  compressed_calls=after["compressed_calls"] - stats_before["compressed_calls"])
    with open(config["out"], "w") as f:
        json.dump(result, f)
    sync()
    del ddp
    dist.destroy_process_group()


def launch(build, optimizer, args, emulation=None):
    with tempfile.TemporaryDirectory() as tmp:
        procs, logs = [], []
        for rank in range(2):
            config = dict(rank=rank, store=os.path.join(tmp, "store"), optimizer=optimizer, width=args.width,
                          layers=args.layers, warmup=args.warmup, measured=args.measured,
                          out=os.path.join(tmp, f"rank{rank}.json"), device="cpu" if args.cpu else "cuda")
            if args.cpu:
                env = dict(os.environ, LD_PRELOAD=os.path.join(build, "libonebit-preload.so"), OMP_NUM_THREADS="1")
            else:
                env = dict(os.environ, LD_PRELOAD=os.path.join(build, "libonebit-nccl-preload.so"),
                           NCCL_NET_PLUGIN="onebit", NCCL_HOSTID=f"onebit-host-{rank}", NCCL_SHM_DISABLE="1",
                           NCCL_P2P_DISABLE="1", NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET",
                           LD_LIBRARY_PATH=build + ":" + os.environ.get("LD_LIBRARY_PATH", ""))
            env.pop("ONEBIT_FREEZE_STEP", None)
            command = [sys.executable, os.path.abspath(__file__), "--rank-config", json.dumps(config)]
            if emulation is not None:
                env.update(NCCL_SOCKET_IFNAME="eth0", ONEBIT_SOCKET_IFNAME="eth0", GLOO_SOCKET_IFNAME="eth0")
                command = ["ip", "netns", "exec", emulation.rank_ns[rank]] + command
            log = open(os.path.join(tmp, f"rank{rank}.log"), "w+")
            logs.append(log)
            procs.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT))
        try:
            codes = [p.wait(timeout=args.timeout) for p in procs]
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            codes = [p.wait() for p in procs]
            print(f"ddp step check: {optimizer}: timed out after {args.timeout} s")
        text = ""
        for log in logs:
            log.seek(0)
            text += log.read()
        via_plugin = args.cpu or "NET/onebit" in text
        if any(codes) or not via_plugin:
            print(f"ddp step check: {optimizer}: exit codes {codes}, NET/onebit in NCCL's log: {via_plugin}")
            print(text[-3000:])
            return None
        with open(os.path.join(tmp, "rank0.json")) as f:
            return json.load(f)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("build", nargs="?")
    parser.add_argument("--rank-config")
    parser.add_argument("--link", help="emulated link rate (e.g. 10gbit); needs root and network namespaces")
    parser.add_argument("--width", type=int, default=2880)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--measured", type=int, default=8)
    parser.add_argument("--timeout", type=int, default=150)
    parser.add_argument("--cpu", action="store_true", help="CPU ranks over gloo (a check of this script, not a measurement)")
    args = parser.parse_args()
    if args.rank_config:
        rank_main(json.loads(args.rank_config))
        return 0
    build = os.path.abspath(args.build)
    emulation = None
    if args.link:
        loader = importlib.machinery.SourceFileLoader("onebit_ethernet",
                                                      os.path.join(ROOT, "tools", "ethernet", "onebit-ethernet"))
        ethernet = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
        loader.exec_module(ethernet)
        emulation = ethernet.Emulation(2, args.link)
    where = f"emulated {args.link}" if args.link else "loopback TCP through NET/onebit"
    if args.cpu:
        where = "CPU ranks over gloo: a check of the script, no measurement"
    results = {}
    if emulation is not None:
        emulation.__enter__()
    try:
        for optimizer in ("adam", "onebit"):
            results[optimizer] = launch(build, optimizer, args, emulation)
    finally:
        if emulation is not None:
            emulation.__exit__(None, None, None)
    if not all(results.values()):
        return 1
    adam, one = results["adam"], results["onebit"]
    print(f"ddp step check ({where}; {adam['params'] / 1e6:.1f} M parameters, 2 ranks, "
          f"{args.measured} measured steps after {args.warmup}):")
    print(f"  {'optimizer':<24} {'median step':>12} {'wire/step/rank':>16} {'ranks bitwise equal':>20}")
    for name, r in (("DDP + Adam", adam), ("DDP + hook + OnebitAdam", one)):
        print(f"  {name:<24} {r['median_s'] * 1e3:>10.1f} ms {r['wire_bytes_per_step'] / 1e6:>13.2f} MB "
              f"{str(r['ranks_equal']):>20}")
    ratio = adam["median_s"] / one["median_s"]
    volume = adam["wire_bytes_per_step"] / max(one["wire_bytes_per_step"], 1)
    print(f"  step-time ratio Adam / OnebitAdam: {ratio:.2f}x; wire bytes ratio: {volume:.1f}x")
    ok = one["ranks_equal"] and one["compressed_calls"] == args.measured
    if not ok:
        print(f"  FAIL: OnebitAdam ranks equal {one['ranks_equal']}, compressed calls {one['compressed_calls']} "
              f"(want {args.measured})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
