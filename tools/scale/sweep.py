#!/usr/bin/python3
"""The scale sweep recorded in docs/scale.md: every algorithm simulated with SimGrid on a two-level
non-blocking fat-tree at W = 16 ... 1,024 ranks, n = 25 M and 250 M fp32 elements, 10 and 25 GbE, one
core per rank (the cost model's at_scale machine), next to the cost model's time. One JSON row per
point, appended as it is done, so an interrupted sweep keeps what it has; points already in OUT are
skipped. A point whose simulation runs past --budget seconds of wall time is recorded with
"sim": null (the model's time stands alone there, and docs/scale.md says so).

    /usr/bin/python3 tools/scale/sweep.py --out build/scale/sweep.jsonl            # hours at 1,024
    /usr/bin/python3 tools/scale/sweep.py --out build/scale/sweep.jsonl --max-ranks 256
    /usr/bin/python3 tools/scale/report.py build/scale/sweep.jsonl --plot docs/img/scale.png
"""
import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model as M
import sim as S

WORLDS = [16, 32, 64, 128, 256, 512, 1024]
SIZES = [25_000_000, 250_000_000]
LINKS = ["10gbit", "25gbit"]
# the hierarchical call with 8 ranks per host (8 GPUs a server), the flat call, and the baselines
ALGOS = [("compressed", 1), ("hierarchical", 8), ("ring_bf16", 1), ("ring_fp32", 1)]


def points(max_ranks, only=None):
    todo = [(algo, local, n, w, link) for w in WORLDS if w <= max_ranks for n in SIZES for link in LINKS
            for algo, local in ALGOS if w % local == 0 and w // local >= 2]
    if only:  # "algo:n:W:link" patterns, "*" for any
        def match(p):
            return any(all(want in ("*", str(have)) for want, have in zip(o.split(":"), (p[0], p[2], p[3], p[4])))
                       for o in only)
        todo = [p for p in todo if match(p)]
    # cheap first: the flows grow as W^2 (flat) or W * steps (rings)
    return sorted(todo, key=lambda p: (p[3], p[0] == "compressed", p[2]))


def simulate_with_budget(spec_args, budget):
    algo, local, n, w, link, machine = spec_args
    spec = json.dumps({"algo": algo, "n": n, "world": w, "local": local, "rate": M.LINKS_REAL[link],
                       "machine": machine.__dict__, "topology": "fattree", "procs": None})
    try:
        done = subprocess.run([sys.executable, S.__file__, "--spec", spec], capture_output=True, text=True,
                              timeout=budget, check=False)
    except subprocess.TimeoutExpired:
        return None, budget
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    row = json.loads(done.stdout.strip().splitlines()[-1])
    return row["seconds"], row["wall"]


def sweep(out, max_ranks, budget, latency, only=None):
    machine = M.at_scale(M.FITTED, latency)
    seen = set()
    if os.path.exists(out):
        with open(out) as fh:
            for line in fh:
                r = json.loads(line)
                seen.add((r["algo"], r["local"], r["n"], r["world"], r["link"]))
    for algo, local, n, w, link in points(max_ranks, only):
        if (algo, local, n, w, link) in seen:
            continue
        t_model = M.time_of(algo, n, w, local, link, machine, M.LINKS_REAL)
        started = time.time()
        t_sim, wall = simulate_with_budget((algo, local, n, w, link, machine), budget)
        row = {"algo": algo, "local": local, "n": n, "world": w, "link": link, "model": t_model, "sim": t_sim,
               "wall": wall if t_sim is not None else time.time() - started, "alpha": machine.alpha,
               "gamma": machine.gamma, "latency": machine.latency}
        with open(out, "a") as fh:
            fh.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)


def plot(rows, png):
    """Speed-up over the bf16 ring against W (report.py --plot: rows merged, the model where a point
    was not simulated)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    styles = {"compressed": ("flat compressed", "C0"), "hierarchical": ("hierarchical, 8 per host", "C2")}
    for ax, n in zip(axes, SIZES):
        for link, dash in (("10gbit", "-"), ("25gbit", "--")):
            for algo, (label, color) in styles.items():
                for base, marker in (("ring_bf16", "o"), ("ring_fp32", "s")):
                    xs, ys = [], []
                    for w in WORLDS:
                        a = [r for r in rows if r["algo"] == algo and r["n"] == n and r["world"] == w
                             and r["link"] == link]
                        b = [r for r in rows if r["algo"] == base and r["n"] == n and r["world"] == w
                             and r["link"] == link]
                        if a and b:
                            ta = a[0]["sim"] if a[0]["sim"] is not None else a[0]["model"]
                            tb = min(x for x in (b[0]["sim"], b[0]["model"]) if x is not None)
                            xs.append(w)
                            ys.append(tb / ta)
                    if xs and base == "ring_bf16":
                        ax.plot(xs, ys, dash, color=color, marker=marker,
                                label=f"{label} vs bf16 ring, {link.replace('gbit', ' GbE')}")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xlabel("ranks W")
        ax.set_title(f"n = {n / 1e6:.0f} M fp32 elements per call")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("speed-up over an ideal bf16 ring (x)")
    axes[0].legend(fontsize=7)
    fig.suptitle("SimGrid, non-blocking fat-tree, one core per rank (onebit's fitted CPU and message costs)")
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out")
    parser.add_argument("--max-ranks", type=int, default=1024)
    parser.add_argument("--budget", type=float, default=1800, help="wall seconds per simulated point")
    parser.add_argument("--latency", type=float, default=10e-6, help="one-way network latency (s)")
    parser.add_argument("--only", action="append", help="ALGO:N:W:LINK, '*' for any (repeatable)")
    args = parser.parse_args()
    return sweep(args.out, args.max_ranks, args.budget, args.latency, args.only)


if __name__ == "__main__":
    main()
