#!/usr/bin/env python3
"""Convergence demo: a small character-level transformer trained on real English text (Debian's
`fortunes` package), W CPU ranks of torch.distributed (gloo) under libonebit-preload.so, onebit's
optimizers and the peers PyTorch ships, with the same seeds, initial weights and data order:

  adam          torch.optim.Adam, DDP's default allreduce
  fp16          torch.optim.Adam + DDP's fp16_compress_hook
  powersgd1/4   torch.optim.Adam + DDP's PowerSGD hook, rank 1 and 4, warm start and error
                feedback (its defaults), compressing from the freeze step on
  onebit        onebit.OnebitAdam (1-bit Adam), freezing after --warmup of the steps
  zero_one      onebit.ZeroOneAdam (0/1 Adam), var_freeze_step at the same step
  lamb          onebit.OnebitLamb (1-bit LAMB), freeze_step at the same step
  uncompressed  OnebitAdam never frozen: 1-bit Adam's rule in full precision
  auto          OnebitAdam with freeze_step="auto"

  1. Convergence (loopback): every optimizer for --steps steps, training and validation loss
     curves and wire bytes per rank → PNG, wire bytes from onebit.stats().
  2. Step time on emulated Ethernet (--link, needs root; tools/ethernet/onebit-ethernet's
     namespaces and tc tbf): each optimizer but the last two for --timing-steps steps, the mean
     and median step time after the freeze step, and the bytes each rank's interface really sent.

    /usr/bin/python3 tools/demo/onebit-demo.py [--ranks 4] [--steps 1000] [--warmup 0.15] [--link 1gbit]
    /usr/bin/python3 tools/demo/onebit-demo.py --quick     # the CI version: 2 ranks, 40 steps, no emulation

Writes OUT/demo.json (every figure) and OUT/loss.png; prints a summary.
"""
import argparse
import glob
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
FORTUNES = "/usr/share/games/fortunes"


# ---------------------------------------------------------------- data and model (rank side)

def load_text():
    """Every fortune file of the package (not the .dat indexes or .u8 links), ASCII only."""
    files = sorted(f for f in glob.glob(os.path.join(FORTUNES, "*"))
                   if os.path.isfile(f) and not f.endswith((".dat", ".u8")))
    if not files:
        raise SystemExit(f"onebit-demo: no text in {FORTUNES}: apt-get install fortunes")
    parts = []
    for f in files:
        with open(f, encoding="latin-1") as handle:
            parts.append("\n".join(line for line in handle.read().splitlines() if line.strip() != "%"))
    text = "\n".join(parts)
    return "".join(c for c in text if c == "\n" or 32 <= ord(c) < 127)


def build_model(torch, vocab, width, layers, context):
    nn = torch.nn

    class CharTransformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, width)
            self.position = nn.Parameter(torch.randn(context, width) * 0.02)
            layer = nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
            self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(width)
            self.head = nn.Linear(width, vocab)
            self.register_buffer("mask", torch.triu(torch.full((context, context), float("-inf")), diagonal=1))

        def forward(self, x):
            h = self.embed(x) + self.position[: x.shape[1]]
            h = self.blocks(h, mask=self.mask[: x.shape[1], : x.shape[1]])
            return self.head(self.norm(h))

    return CharTransformer()


def rank_main(config):
    import numpy as np
    import torch
    import torch.distributed as dist
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import onebit

    torch.set_num_threads(1)
    rank, world = config["rank"], config["world"]
    if config["backend"] == "onebit":  # pip torch: onebit's torch.distributed backend over gloo
        onebit.register_backend()
    dist.init_process_group(config["backend"] if config["backend"] == "onebit" else "gloo",
                            init_method=f"file://{config['store']}", rank=rank, world_size=world)
    text = load_text()
    chars = sorted(set(text))
    data = torch.from_numpy(np.frombuffer(text.encode("ascii"), dtype=np.uint8).astype(np.int64))
    lookup = torch.zeros(128, dtype=torch.long)
    lookup[[ord(c) for c in chars]] = torch.arange(len(chars))
    data = lookup[data]
    split = int(0.9 * len(data))
    train, val = data[:split], data[split:]
    context, batch = config["context"], config["batch"]

    torch.manual_seed(config["seed"])  # the same initial model on every rank, for both optimizers
    model = build_model(torch, len(chars), config["width"], config["layers"], context)
    net = torch.nn.parallel.DistributedDataParallel(model)
    steps, freeze = config["steps"], config["freeze"]
    lr = config["lr"]
    name = config["optimizer"]
    if name == "zero_one":
        # DeepSpeed's defaults but two, scaled to a short run: the variance stage ends at the freeze
        # step, and local_step_interval doubles every tenth of the run (DeepSpeed: 32678 steps).
        optimizer = onebit.ZeroOneAdam(model.parameters(), lr=lr, var_freeze_step=freeze,
                                       local_step_scaler=max(1, steps // 10))
        net.register_comm_hook(optimizer, onebit.ddp_comm_hook)
    elif name == "lamb":
        lr = config["lamb_lr"]
        optimizer = onebit.OnebitLamb(model.parameters(), lr=lr, freeze_step=freeze)
        net.register_comm_hook(optimizer, onebit.ddp_comm_hook)
    elif name in ("fp16", "powersgd1", "powersgd4"):
        optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        if name == "fp16":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            net.register_comm_hook(None, default_hooks.fp16_compress_hook)
        else:
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
            state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=int(name[-1]),
                                                start_powerSGD_iter=max(2, freeze))
            net.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    elif name in ("onebit", "uncompressed", "auto"):
        # "uncompressed": OnebitAdam that never freezes — 1-bit Adam's update rule (no bias
        # correction) with full-precision gradients throughout, to tell the rule from the compression.
        # "auto": freeze_step="auto" with its defaults: the variance says when.
        chosen = {"onebit": freeze, "uncompressed": steps + 1, "auto": "auto"}[config["optimizer"]]
        optimizer = onebit.OnebitAdam(model.parameters(), lr=lr, freeze_step=chosen)
        net.register_comm_hook(optimizer, onebit.ddp_comm_hook)
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=lr)

    def lr_at(step):  # the same schedule for both: linear warmup, cosine decay to 10 %
        ramp = max(1, steps // 20)
        if step < ramp:
            return lr * (step + 1) / ramp
        progress = (step - ramp) / max(1, steps - ramp)
        return lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))

    batches = np.random.default_rng(config["seed"] * 1000 + rank)  # this rank's data order
    val_rng = np.random.default_rng(12345)
    val_starts = val_rng.integers(0, len(val) - context - 1, size=config["val_batches"] * batch)
    val_x = torch.stack([val[s:s + context] for s in val_starts])
    val_y = torch.stack([val[s + 1:s + context + 1] for s in val_starts])

    def validation_loss():
        with torch.no_grad():
            losses = [torch.nn.functional.cross_entropy(model(val_x[i:i + batch]).flatten(0, 1),
                                                        val_y[i:i + batch].flatten())
                      for i in range(0, len(val_x), batch)]
        value = torch.stack(losses).mean().reshape(1)
        dist.all_reduce(value)  # a metric: untagged, never compressed
        return value.item() / world

    log = {"train": [], "val": [], "step_seconds": [], "kinds": "", "grad_norms": []}
    for step in range(steps):
        begin = time.perf_counter()
        if name == "zero_one":
            log["kinds"] += "VCLS"[optimizer.next_step_kind()]
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        starts = batches.integers(0, len(train) - context - 1, size=batch)
        x = torch.stack([train[s:s + context] for s in starts])
        y = torch.stack([train[s + 1:s + context + 1] for s in starts])
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(x).flatten(0, 1), y.flatten())
        loss.backward()
        if config.get("clip"):  # as HF Trainer's max_grad_norm: on the gradients the backward pass left
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config["clip"]).item()
            log["grad_norms"].append(norm)
        optimizer.step()
        log["step_seconds"].append(time.perf_counter() - begin)
        mean = loss.detach().reshape(1).clone()
        dist.all_reduce(mean)  # a metric: untagged, never compressed
        log["train"].append(mean.item() / world)
        if (step + 1) % config["eval_every"] == 0 or step + 1 == steps:
            log["val"].append((step + 1, validation_loss()))
    log["stats"] = onebit.stats()
    log["freeze_step"] = getattr(optimizer, "freeze_step", None)  # "auto": where it fired (None: it did not)
    log["parameters"] = sum(p.numel() for p in model.parameters())
    log["buckets_bytes"] = 4 * log["parameters"]
    if config.get("interface"):
        with open(f"/sys/class/net/{config['interface']}/statistics/tx_bytes") as f:
            log["interface_tx_bytes"] = int(f.read())
    with open(os.path.join(config["out"], f"{config['optimizer']}-rank{rank}.json"), "w") as f:
        json.dump(log, f)
    if hasattr(optimizer, "close"):
        optimizer.close()
    # DDP's reducer first, while the process group is alive and idle: letting interpreter teardown
    # destroy it can deadlock torch 1.13 (the group's destructor joins a worker thread that waits
    # for the GIL to free a tensor). docs/usage/optimizers.md notes it for users of the DDP hook.
    del net
    import gc
    gc.collect()
    dist.destroy_process_group()


# ---------------------------------------------------------------- launcher (parent side)

def launch(config, ranks, out, preload, emulation=None):
    """Runs one optimizer's job; returns every rank's log."""
    if not os.path.exists(preload):
        raise SystemExit(f"onebit-demo: {preload} is missing: run tools/build.sh release")
    store = tempfile.mktemp(prefix="onebit-demo-store-")
    procs = []
    for rank in range(ranks):
        rank_config = dict(config, rank=rank, world=ranks, store=store, out=out)
        if config["backend"] == "onebit":
            env = dict(os.environ, ONEBIT_LIBRARY=os.path.join(os.path.dirname(preload), "libonebit.so"),
                       MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS="1")
            env.pop("LD_PRELOAD", None)
        else:
            env = dict(os.environ, LD_PRELOAD=preload, MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS="1")
        env.pop("ONEBIT_FREEZE_STEP", None)
        command = [sys.executable, os.path.abspath(__file__), "--rank-config", json.dumps(rank_config)]
        if emulation is not None:
            rank_config["interface"] = "eth0"
            command[-1] = json.dumps(rank_config)
            env["GLOO_SOCKET_IFNAME"] = "eth0"
            # The onebit backend's own TCP bootstrap: rank 0's address inside the emulation.
            env.update(MASTER_ADDR=emulation.address(0), ONEBIT_SOCKET_IFNAME="eth0")
            command = ["ip", "netns", "exec", emulation.rank_ns[rank]] + command
        procs.append(subprocess.Popen(command, env=env))
    codes = [p.wait() for p in procs]
    if os.path.exists(store):
        os.remove(store)
    if any(codes):
        raise SystemExit(f"onebit-demo: {config['optimizer']} ranks exited with {codes}")
    logs = []
    for rank in range(ranks):
        with open(os.path.join(out, f"{config['optimizer']}-rank{rank}.json")) as f:
            logs.append(json.load(f))
    return logs


def clipped(log, freeze, clip):
    """With --clip, rank 0's share of steps whose gradient norm exceeded `clip`, and its median
    norm, before and from the freeze step (None without --clip)."""
    norms = log.get("grad_norms") or []
    if not clip or not norms:
        return None
    stages = {"before_freeze": norms[:freeze], "from_freeze": norms[freeze:]}
    return {stage: {"clipped_share": sum(n > clip for n in values) / len(values),
                    "median_norm": statistics.median(values)} for stage, values in stages.items() if values}


def wire_bytes(log, ranks):
    """Bytes one rank put on the wire, from onebit.stats(): gloo's ring sends 2(W-1)/W of each
    forwarded buffer; onebit's compressed calls count what they sent."""
    s = log["stats"]
    return 2 * (ranks - 1) / ranks * s["forwarded_bytes"] + s["compressed_bytes_sent"]


NAMES = {"adam": "Adam (DDP allreduce)", "fp16": "Adam + DDP fp16 hook", "powersgd1": "Adam + PowerSGD rank 1",
         "powersgd4": "Adam + PowerSGD rank 4", "onebit": "1-bit Adam (OnebitAdam)", "zero_one": "0/1 Adam (ZeroOneAdam)",
         "lamb": "1-bit LAMB (OnebitLamb)", "uncompressed": "OnebitAdam never frozen (same rule, fp32)",
         "auto": "OnebitAdam, freeze_step='auto'"}
COLORS = {"adam": "tab:blue", "fp16": "tab:cyan", "powersgd1": "tab:olive", "powersgd4": "tab:brown",
          "onebit": "tab:red", "zero_one": "tab:purple", "lamb": "tab:orange", "uncompressed": "tab:gray",
          "auto": "tab:green"}
OPTIMIZERS = list(NAMES)
TIMED = ["adam", "fp16", "powersgd1", "powersgd4", "onebit", "zero_one", "lamb"]


def plot(results, path, title, wire):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, bars) = plt.subplots(1, 2, figsize=(13, 5.2), gridspec_kw={"width_ratios": [3, 2]})
    for name, logs in results.items():
        style = "--" if name == "uncompressed" else "-"
        steps, val = zip(*logs[0]["val"])
        ax.plot(steps, val, color=COLORS[name], marker="o", markersize=3, linestyle=style, label=NAMES[name])
    freeze = results["onebit"][0].get("freeze")
    ax.axvline(freeze, color="tab:red", alpha=0.3, linewidth=1)
    if results.get("auto") and results["auto"][0].get("freeze_step"):
        ax.axvline(results["auto"][0]["freeze_step"], color="tab:green", alpha=0.3, linewidth=1)
    ax.set_xlabel("step")
    ax.set_ylabel("validation cross-entropy (nats/char)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    names = [n for n in results if n != "uncompressed"]
    values = [wire[n] / 1e6 for n in names]
    bars.barh(range(len(names)), values, color=[COLORS[n] for n in names])
    bars.set_yticks(range(len(names)))
    bars.set_yticklabels([NAMES[n] for n in names], fontsize=8)
    bars.invert_yaxis()
    bars.set_xscale("log")
    bars.set_xlabel("MB on the wire per rank, whole run (log scale)")
    for k, v in enumerate(values):
        bars.text(v, k, f" {v:.1f}", va="center", fontsize=8)
    bars.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rank-config", help=argparse.SUPPRESS)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--warmup", type=float, default=0.15, help="OnebitAdam's freeze step, as a fraction of --steps")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--lamb-lr", type=float, default=2e-2,
                        help="OnebitLamb's learning rate: LAMB's is relative (a step moves a layer by about lr x |p|), "
                             "so Adam's does not carry over; 0.02 was the best of 0.005, 0.01, 0.02, 0.04 on the "
                             "full run (docs/benchmarks/demo.md)")
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8, help="sequences per rank per step")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--val-batches", type=int, default=8)
    parser.add_argument("--link", action="append", help="emulated link for the step-time runs (1gbit, 10gbit)")
    parser.add_argument("--timing-steps", type=int, default=40)
    parser.add_argument("--timing-width", type=int, default=256,
                        help="model width of the step-time runs: wider than the convergence runs, so that a step's "
                             "gradient (1.6 M parameters at 256) is large enough for the link to matter")
    parser.add_argument("--no-emulation", action="store_true", help="skip the step-time runs")
    parser.add_argument("--clip", type=float, default=None,
                        help="clip the gradients' norm to this before each step, as HF Trainer's max_grad_norm "
                             "(torch.nn.utils.clip_grad_norm_ on what the backward pass left: DDP's average, or in "
                             "onebit's compression stage each rank's own); reports how often it bit, per stage")
    parser.add_argument("--out", default=os.path.join(ROOT, "build", "demo"))
    parser.add_argument("--preload", default=os.path.join(ROOT, "build", "release", "libonebit-preload.so"))
    parser.add_argument("--quick", action="store_true", help="CI: 2 ranks, 40 steps, small model, no emulation")
    parser.add_argument("--backend", choices=("auto", "preload", "onebit"), default="auto",
                        help="preload: gloo under libonebit-preload.so (a torch linked with the system libgloo, "
                             "Debian's); onebit: onebit's torch.distributed backend (torch >= 2.0, pip's); auto: "
                             "preload unless this torch bundles its own gloo")
    args = parser.parse_args()
    if args.rank_config:
        rank_main(json.loads(args.rank_config))
        return 0
    if args.quick:
        args.ranks, args.steps, args.width, args.eval_every, args.val_batches, args.link = 2, 40, 64, 10, 2, []
    os.makedirs(args.out, exist_ok=True)
    if args.backend == "auto":
        import torch  # noqa: F401 (onebit asks the imported torch)
        sys.path.insert(0, os.path.join(ROOT, "python"))
        import onebit
        args.backend = "onebit" if onebit._torch_bundles_gloo() else "preload"
    freeze = max(1, int(round(args.warmup * args.steps)))
    base = dict(backend=args.backend, steps=args.steps, freeze=freeze, lr=args.lr, width=args.width, layers=args.layers,
                context=args.context, batch=args.batch, seed=args.seed, eval_every=args.eval_every,
                val_batches=args.val_batches, lamb_lr=args.lamb_lr, clip=args.clip)
    print(f"# onebit-demo: {args.ranks} ranks ({args.backend}), {args.steps} steps, OnebitAdam freezes at step {freeze} "
          f"({100 * freeze / args.steps:.0f} %), text from {FORTUNES}", flush=True)
    results = {}
    for name in OPTIMIZERS:
        started = time.time()
        results[name] = launch(dict(base, optimizer=name), args.ranks, args.out, args.preload)
        results[name][0]["freeze"] = freeze
        print(f"#   {name}: {args.steps} steps in {time.time() - started:.0f} s", flush=True)
    summary = {"ranks": args.ranks, "steps": args.steps, "freeze_step": freeze, "config": base,
               "parameters": results["adam"][0]["parameters"]}
    for name, logs in results.items():
        train = logs[0]["train"]
        summary[name] = {"final_val_loss": logs[0]["val"][-1][1], "first_train_loss": train[0],
                         "final_train_loss": sum(train[-10:]) / len(train[-10:]),
                         "wire_bytes_per_rank": wire_bytes(logs[0], args.ranks),
                         "compressed_calls": logs[0]["stats"]["compressed_calls"],
                         "forwarded_calls": logs[0]["stats"]["forwarded_calls"],
                         "nan": any(not math.isfinite(v) for v in train),
                         "val_curve": logs[0]["val"], "train_curve": train,
                         "freeze_step": logs[0].get("freeze_step"), "kinds": logs[0].get("kinds", ""),
                         "clipped": clipped(logs[0], freeze, args.clip)}
    summary["val_loss_ratio"] = summary["onebit"]["final_val_loss"] / summary["adam"]["final_val_loss"]
    summary["val_loss_ratio_vs_uncompressed"] = (summary["onebit"]["final_val_loss"] /
                                                 summary["uncompressed"]["final_val_loss"])
    summary["wire_bytes_ratio"] = summary["adam"]["wire_bytes_per_rank"] / summary["onebit"]["wire_bytes_per_rank"]
    plot(results, os.path.join(args.out, "loss.png"),
         f"char transformer on fortunes, {args.ranks} ranks, {args.steps} steps (freeze / PowerSGD start at step {freeze})",
         {name: summary[name]["wire_bytes_per_rank"] for name in results})

    timing = {}
    links = [] if args.no_emulation else args.link if args.link is not None else ["1gbit"]
    if links and os.geteuid() != 0:
        print("# step times on emulated Ethernet skipped: needs root (network namespaces)")
        links = []
    if links:
        import importlib.machinery
        ethernet = importlib.machinery.SourceFileLoader(
            "onebit_ethernet", os.path.join(ROOT, "tools", "ethernet", "onebit-ethernet")).load_module()
        ethernet.remove_stale()
        timing_freeze = max(1, args.timing_steps // 4)
        for link in links:
            timing[link] = {}
            for name in TIMED:
                with ethernet.Emulation(args.ranks, link) as emulation:
                    logs = launch(dict(base, optimizer=name, steps=args.timing_steps, freeze=timing_freeze,
                                       width=args.timing_width, eval_every=10 ** 9, clip=None),  # --clip: losses only
                                  args.ranks, args.out, args.preload, emulation)
                seconds = logs[0]["step_seconds"][timing_freeze + 2:]  # the compression stage, past its first calls
                timing[link][name] = {"median_step_s": statistics.median(seconds), "mean_step_s": statistics.mean(seconds),
                                      "interface_tx_bytes": [log["interface_tx_bytes"] for log in logs],
                                      "wire_bytes_from_stats": wire_bytes(logs[0], args.ranks),
                                      "parameters": logs[0]["parameters"]}
            timing[link]["step_time_ratio"] = timing[link]["adam"]["median_step_s"] / timing[link]["onebit"]["median_step_s"]
            timing[link]["mean_step_time_ratio_vs_adam"] = {
                name: timing[link]["adam"]["mean_step_s"] / timing[link][name]["mean_step_s"] for name in TIMED}
        summary["timing"] = dict(timing, steps=args.timing_steps, freeze_step=timing_freeze, width=args.timing_width)

    with open(os.path.join(args.out, "demo.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(f"\n# {'optimizer':<12} {'val loss':>9} {'train loss':>10} {'wire MB/rank':>13} {'compressed':>10} {'forwarded':>9}"
          f" {'freeze':>6}")
    for name in OPTIMIZERS:
        s = summary[name]
        print(f"  {name:<12} {s['final_val_loss']:>9.4f} {s['final_train_loss']:>10.4f} "
              f"{s['wire_bytes_per_rank'] / 1e6:>13.2f} {s['compressed_calls']:>10} {s['forwarded_calls']:>9}"
              f" {str(s['freeze_step'] if s['freeze_step'] is not None else '-'):>6}")
    if args.clip:
        print(f"# --clip {args.clip}, rank 0: share of steps clipped (median gradient norm) before / from step {freeze}:")
        for name in OPTIMIZERS:
            c = summary[name]["clipped"]
            print(f"  {name:<12} " + "  ".join(f"{c[stage]['clipped_share']:>5.0%} ({c[stage]['median_norm']:.3f})"
                                               for stage in ("before_freeze", "from_freeze") if stage in c))
    print(f"# validation loss OnebitAdam / Adam after {args.steps} steps: {summary['val_loss_ratio']:.4f}; "
          f"OnebitAdam / the same rule uncompressed: {summary['val_loss_ratio_vs_uncompressed']:.4f}")
    print(f"# wire bytes Adam / OnebitAdam: {summary['wire_bytes_ratio']:.2f}x")
    for link, t in timing.items():
        print(f"# {link}, width {args.timing_width} ({t['adam']['parameters'] / 1e6:.2f} M parameters): compression-stage step {t['adam']['median_step_s'] * 1e3:.1f} ms (Adam) vs "
              f"{t['onebit']['median_step_s'] * 1e3:.1f} ms (OnebitAdam): {t['step_time_ratio']:.2f}x; "
              f"rank 0 interface sent {t['adam']['interface_tx_bytes'][0] / 1e6:.1f} MB vs "
              f"{t['onebit']['interface_tx_bytes'][0] / 1e6:.1f} MB in {args.timing_steps} steps")
        print(f"# {link}, mean step after step {timing_freeze + 2} (ms; Adam / it; rank 0 interface MB in {args.timing_steps} steps):")
        for name in TIMED:
            print(f"  {name:<12} {t[name]['mean_step_s'] * 1e3:>8.1f} ms {t['mean_step_time_ratio_vs_adam'][name]:>6.2f}x"
                  f" {t[name]['interface_tx_bytes'][0] / 1e6:>8.1f} MB")
    print(f"# plot: {os.path.join(args.out, 'loss.png')}; figures: {os.path.join(args.out, 'demo.json')}")
    failed = False
    for name in OPTIMIZERS:
        s = summary[name]
        if s["nan"] or not s["final_train_loss"] < s["first_train_loss"]:
            print(f"FAIL: {name}: training loss {s['first_train_loss']:.4f} -> {s['final_train_loss']:.4f}"
                  f"{' with NaN' if s['nan'] else ''}: it must fall, with no NaN")
            failed = True
    auto_freeze = summary["auto"]["freeze_step"]
    if summary["auto"]["compressed_calls"] != (args.steps - auto_freeze if auto_freeze is not None else 0):
        print(f"FAIL: freeze_step='auto' fired at {auto_freeze} but ran {summary['auto']['compressed_calls']} compressed calls")
        failed = True
    kinds = summary["zero_one"]["kinds"]
    if summary["zero_one"]["compressed_calls"] != kinds.count("C") + kinds.count("S"):
        print(f"FAIL: ZeroOneAdam ran {summary['zero_one']['compressed_calls']} compressed calls, its schedule {kinds} has "
              f"{kinds.count('C') + kinds.count('S')}")
        failed = True
    if summary["lamb"]["compressed_calls"] != args.steps - freeze:
        print(f"FAIL: OnebitLamb ran {summary['lamb']['compressed_calls']} compressed calls, expected {args.steps - freeze}")
        failed = True
    for name in ("adam", "fp16", "powersgd1", "powersgd4"):
        if summary[name]["compressed_calls"] != 0:
            print(f"FAIL: {name} ran {summary[name]['compressed_calls']} compressed calls: it tags nothing")
            failed = True
    if summary["onebit"]["compressed_calls"] != args.steps - freeze:
        print(f"FAIL: {summary['onebit']['compressed_calls']} compressed calls, expected {args.steps - freeze}")
        failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
