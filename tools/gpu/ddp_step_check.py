"""DDP step time with Adam vs with 1-bit Adam on onebit's code, 2 ranks on the one GPU, through
onebit's NCCL_NET plugin (distinct NCCL_HOSTID per rank, SHM/P2P off: NCCL's traffic takes the
network), libonebit-nccl-preload.so preloaded in both runs (it forwards untagged calls, and counts
them). Over loopback, with two ranks time-slicing one GPU, a first look at the paper's headline,
not a measurement of it.

  adam:   DDP (its own bucketed allreduce) + torch.optim.Adam
  onebit: DDP + onebit.ddp_comm_hook + onebit.OnebitAdam (freeze after the warmup steps; from then
          on DDP sends nothing and the momentum goes compressed through the preload)

A model of square Linear layers (--width 2880 --layers 12: ~100 M parameters; 1440: ~25 M), the
same seed and data on both. Steps: --warmup, then the first compressed step (timed apart: it sets
up the compressed path), then --measured timed ones. Reports per run and per rank: the first
compressed step's time, min / median / max of the timed steps, the bytes the NET plugin measured on
the wire over the whole run (set-up, warmup, every step, the final check: ONEBIT_NET_STATS_FILE,
one line per closed connection, sent and received), and whether both ranks' parameters are bitwise
equal at the end (a 64-bit digest of each). With --link RATE (root, network namespaces) the two ranks
run behind an emulated link (tools/ethernet/onebit-ethernet's Emulation: veth + bridge + tc tbf).

    python3 tools/gpu/ddp_step_check.py BUILD_DIR [--link 10gbit] [--width 2880 --layers 12]
                                        [--logs DIR] [--timeout SECONDS]

--cpu runs the same script on CPU ranks (gloo, libonebit-preload.so): what CI uses to keep this
script honest on machines without a GPU; its times mean nothing, and no NET plugin is in the way.
"""
import argparse
import importlib.machinery
import importlib.util
import json
import os
import re
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, HERE)
from ranks import Ranks, nccl_env, python_command  # noqa: E402


def digest(model):
    """Two 64-bit sums of the parameters' bit patterns (plain and position-weighted): equal on both
    ranks when the parameters are bitwise equal, without putting the whole model on the wire."""
    import torch
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).float()
    bits = flat.view(torch.int32).to(torch.int64)
    weights = torch.arange(bits.numel(), device=bits.device, dtype=torch.int64) % 65521 + 1
    return torch.stack([bits.sum(), (bits * weights).sum()])


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
    for step in range(warmup + 1 + measured):
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
        times.append(time.perf_counter() - start)
        print(f"step {step}: {times[-1] * 1e3:.1f} ms", flush=True)
    after = onebit.stats()
    mine = digest(model)
    gathered = [torch.zeros_like(mine) for _ in range(2)]
    dist.all_gather(gathered, mine)
    timed = times[warmup + 1:]
    result = dict(optimizer=config["optimizer"], rank=rank, params=params, first_compressed_s=times[warmup],
                  min_s=min(timed), median_s=statistics.median(timed), max_s=max(timed),
                  ranks_equal=bool(torch.equal(gathered[0], gathered[1])),
                  compressed_calls=after["compressed_calls"] - stats_before["compressed_calls"])
    with open(config["out"], "w") as f:
        json.dump(result, f)
    sync()
    del ddp
    dist.destroy_process_group()


def wire_bytes(path):
    """The NET plugin's lines in one rank's ONEBIT_NET_STATS_FILE: bytes sent and received, and the
    connections closed. None when there is no file (CPU ranks; or the ranks never closed)."""
    if not os.path.exists(path):
        return None
    sent = received = comms = 0
    with open(path) as f:
        for line in f:
            match = re.search(r" (closeSend|closeRecv) peer=\S+ bytes=(\d+) messages=(\d+)", line)
            if match:
                comms += 1
                if match.group(1) == "closeSend":
                    sent += int(match.group(2))
                else:
                    received += int(match.group(2))
    return dict(sent=sent, received=received, comms=comms)


def launch(build, optimizer, args, seconds, emulation=None):
    """Both ranks' results (with their measured wire bytes), or None."""
    with tempfile.TemporaryDirectory() as tmp:
        ranks = Ranks(args.logs or tmp, f"ddp step check: {optimizer}, {args.width}x{args.layers}"
                      f"{', emulated ' + args.link if args.link else ''}")
        for rank in range(2):
            config = dict(rank=rank, store=os.path.join(tmp, "store"), optimizer=optimizer, width=args.width,
                          layers=args.layers, warmup=args.warmup, measured=args.measured,
                          out=os.path.join(tmp, f"rank{rank}.json"), device="cpu" if args.cpu else "cuda")
            if args.cpu:
                env = dict(os.environ, LD_PRELOAD=os.path.join(build, "libonebit-preload.so"), OMP_NUM_THREADS="1")
            else:
                env = nccl_env(build, rank)
                env["ONEBIT_NET_STATS_FILE"] = os.path.join(tmp, f"net-stats{rank}.txt")
            env.pop("ONEBIT_FREEZE_STEP", None)
            command = python_command(__file__, "--rank-config", json.dumps(config))
            if emulation is not None:
                env.update(NCCL_SOCKET_IFNAME="eth0", ONEBIT_SOCKET_IFNAME="eth0", GLOO_SOCKET_IFNAME="eth0")
                command = ["ip", "netns", "exec", emulation.rank_ns[rank]] + command
            ranks.start(rank, command, env)
        codes = ranks.wait(seconds)
        text = ranks.text()
        via_plugin = args.cpu or "NET/onebit" in text
        if any(code != 0 for code in codes) or not via_plugin:
            print(f"ddp step check: {optimizer}: exit codes {codes}, NET/onebit in NCCL's log: {via_plugin}")
            print(ranks.tails(30))
            return None
        results = []
        for rank in range(2):
            with open(os.path.join(tmp, f"rank{rank}.json")) as f:
                result = json.load(f)
            result["wire"] = wire_bytes(os.path.join(tmp, f"net-stats{rank}.txt"))
            if result["wire"] is not None:
                with open(os.path.join(tmp, f"net-stats{rank}.txt")) as f:
                    print(f"ddp step check: {optimizer}: rank {rank}'s ONEBIT_NET_STATS_FILE:\n{f.read().rstrip()}")
            results.append(result)
        return results


def megabytes(wire, key):
    return "n/a" if wire is None else f"{wire[key] / 1e6:.1f}"


def report(where, args, results):
    """The runs' table; the ratio and the wire bytes' comparison when both ran. Returns 1 when a
    run is missing or OnebitAdam's ranks disagree or compressed other than every timed step."""
    adam, one = results.get("adam") or [], results["onebit"]
    print(f"ddp step check ({where}; {one[0]['params'] / 1e6:.1f} M parameters, 2 ranks, {args.warmup} warmup "
          f"steps, the first compressed one apart, {args.measured} timed):")
    print(f"  {'optimizer':<24} {'rank':>4} {'1st compressed':>15} {'min':>9} {'median':>9} {'max':>9} "
          f"{'MB sent':>9} {'MB recv':>9} {'equal':>6}")
    for name, runs in (("DDP + Adam", adam), ("DDP + hook + OnebitAdam", one)):
        for r in runs:
            first = "-" if name == "DDP + Adam" else f"{r['first_compressed_s'] * 1e3:.1f} ms"
            print(f"  {name:<24} {r['rank']:>4} {first:>15} {r['min_s'] * 1e3:>6.1f} ms {r['median_s'] * 1e3:>6.1f} ms "
                  f"{r['max_s'] * 1e3:>6.1f} ms {megabytes(r['wire'], 'sent'):>9} {megabytes(r['wire'], 'received'):>9} "
                  f"{str(r['ranks_equal']):>6}")
    want = args.measured + 1
    bad = [r for r in one if not r["ranks_equal"] or r["compressed_calls"] != want]
    for r in bad:
        print(f"  FAIL: OnebitAdam rank {r['rank']}: ranks equal {r['ranks_equal']}, compressed calls "
              f"{r['compressed_calls']} (want {want})")
    if not adam:
        print("  FAIL: the Adam run failed or ran out of time (its rank logs say why): no ratio")
        return 1
    ratio = statistics.median(r["median_s"] for r in adam) / statistics.median(r["median_s"] for r in one)
    line = f"  median step-time ratio Adam / OnebitAdam: {ratio:.2f}x"
    if all(r["wire"] is not None for r in adam + one):
        sent = [sum(r["wire"]["sent"] for r in runs) for runs in (adam, one)]
        line += (f"; bytes on the wire, whole run, both ranks (NET plugin, measured): Adam {sent[0] / 1e6:.1f} MB, "
                 f"OnebitAdam {sent[1] / 1e6:.1f} MB ({sent[0] / max(sent[1], 1):.1f}x; the {args.warmup} warmup "
                 f"steps are full precision in both)")
    print(line)
    return 0 if not bad else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("build", nargs="?")
    parser.add_argument("--rank-config")
    parser.add_argument("--link", help="emulated link rate (e.g. 10gbit); needs root and network namespaces")
    parser.add_argument("--width", type=int, default=2880)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--measured", type=int, default=8)
    parser.add_argument("--logs", help="folder for rank0.log and rank1.log (appended); default: a temporary one")
    parser.add_argument("--timeout", type=float, default=150, help="seconds both runs may take in all")
    parser.add_argument("--cpu", action="store_true", help="CPU ranks over gloo (a check of this script, not a measurement)")
    args = parser.parse_args()
    if args.rank_config:
        rank_main(json.loads(args.rank_config))
        return 0
    deadline = time.monotonic() + args.timeout
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
        # OnebitAdam first: it is what the check is for, and a slow start-up of the first run then
        # costs the Adam run, whose table rows alone say less. Each run gets its share of what is
        # left: the first half, the second all of it.
        for index, optimizer in enumerate(("onebit", "adam")):
            seconds = (deadline - time.monotonic()) / (2 - index)
            results[optimizer] = launch(build, optimizer, args, seconds, emulation)
            if results[optimizer] is None and optimizer == "onebit":
                return 1
    finally:
        if emulation is not None:
            emulation.__exit__(None, None, None)
    return report(where, args, results)


if __name__ == "__main__":
    sys.exit(main())
