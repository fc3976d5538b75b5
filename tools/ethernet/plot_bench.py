#!/usr/bin/env python3
"""Plots onebit-bench JSON rows (onebit-bench --json / onebit-ethernet --json): algbw against size,
one line per algorithm and one panel per link rate; below, compressed's speedup over Gloo and over
onebit's own ring.

    /usr/bin/python3 tools/ethernet/plot_bench.py RESULTS.jsonl OUT.png
"""
import collections
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    if len(sys.argv) != 3:
        sys.stderr.write(__doc__)
        return 2
    rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    if not rows:
        sys.stderr.write(f"plot_bench: no rows in {sys.argv[1]}\n")
        return 1
    by_link = collections.OrderedDict()
    for row in rows:
        key = (row["link"] or "loopback", row["ranks"])
        by_link.setdefault(key, collections.defaultdict(dict))[row["algo"]][row["size"]] = row
    fig, axes = plt.subplots(2, len(by_link), figsize=(6 * len(by_link), 8), squeeze=False)
    for col, ((link, ranks), algos) in enumerate(by_link.items()):
        top, bottom = axes[0][col], axes[1][col]
        for algo, points in sorted(algos.items()):
            sizes = sorted(points)
            top.plot(sizes, [points[s]["algbw"] for s in sizes], marker="o", label=algo)
        top.set(xscale="log", yscale="log", xlabel="message size (bytes)", ylabel="algbw (GB/s)",
                title=f"allreduce, {ranks} ranks, {link}")
        top.grid(True, which="both", alpha=0.3)
        top.legend()
        compressed = algos.get("compressed", {})
        for base in ("gloo", "ring"):
            if base not in algos:
                continue
            sizes = sorted(set(compressed) & set(algos[base]))
            bottom.plot(sizes, [algos[base][s]["time_us"] / compressed[s]["time_us"] for s in sizes], marker="o",
                        label=f"compressed vs {base}")
        bottom.set(xscale="log", xlabel="message size (bytes)", ylabel="speedup (time ratio)",
                   title=f"speedup of the compressed allreduce, {link}")
        bottom.grid(True, which="both", alpha=0.3)
        bottom.legend()
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)
    print(f"plot_bench: wrote {sys.argv[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
