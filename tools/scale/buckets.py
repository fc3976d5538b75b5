"""Bucket guidance from the cost model (docs/scale.md): for each algorithm, world size W and link
rate, the smallest tagged tensor per call (fp32 elements, on a grid of 2^(k/4)) whose call stays
within 10 % of the algorithm's own bandwidth bound — the time per element it approaches for large calls, whatever bounds
it there (the link at 1 GbE; the CPU passes at 10 and 25 GbE, where they cost more than the wire).
Below that size the per-message costs (α per message, λ per stage) take more than a tenth of the
call. The cluster of docs/scale.md's "At scale": each rank its own core, the fitted α = 14.7 µs,
λ = 10 µs, real link rates; the hierarchical call with 8 ranks a host.

    /usr/bin/python3 tools/scale/buckets.py [--within 0.1] [--markdown]

Prints one line per (algorithm, link, W); --markdown the table docs/usage/optimizers.md holds.
report.py's bucket table in docs/scale.md (MB, with the engine's fp32 ring) comes from here too.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model  # noqa: E402

WORLDS = (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
LINKS = ("1gbit", "10gbit", "25gbit")
ALGOS = (("compressed", 1), ("hierarchical", 8))
LARGE = 1 << 36  # elements: the per-element time is taken between LARGE and 2 LARGE


def seconds(algo, n, world, local, link, m):
    return model.time_of(algo, n, world, local, link, m, links=model.LINKS_REAL)


def grid():
    """The sizes tried, ascending: 2^(k/4) elements rounded down to a multiple of 64, 1 Ki to 2^37."""
    return [int(2 ** (k / 4)) // 64 * 64 for k in range(40, 4 * 37 + 1)]


def per_element(algo, world, local, link, m):
    """The time per element a large call approaches: the slope between LARGE and 2 LARGE (a call's
    fixed costs cancel; at W = 1,024 even 2^31 elements still carry 5 % of them)."""
    return (seconds(algo, 2 * LARGE, world, local, link, m) - seconds(algo, LARGE, world, local, link, m)) / LARGE


def smallest_bucket(algo, world, local, link, m, within=0.1):
    """The smallest n of grid() whose call takes at most (1 + within) times n at the large call's time
    per element; None if none does."""
    slope = per_element(algo, world, local, link, m)
    return next((n for n in grid() if seconds(algo, n, world, local, link, m) <= (1 + within) * slope * n), None)


def table(within):
    m = model.at_scale()
    rows = []
    for algo, local in ALGOS:
        for link in LINKS:
            for world in WORLDS:
                if world < 2 * local and algo == "hierarchical":
                    continue  # one host: no link in the call
                rows.append((algo, link, world, smallest_bucket(algo, world, local, link, m, within)))
    return rows


def millions(n):
    """`n` elements in millions, two significant digits ("0.79", "6.3", "810"); "—" for none."""
    if n is None:
        return "—"
    m = n / 1e6
    return f"{m:.2g}" if m < 100 else f"{round(m, -1):.0f}"


def markdown(rows):
    """The table docs/usage/optimizers.md holds: a row a world size, a column an algorithm and link."""
    columns = [(algo, link) for algo, _ in ALGOS for link in LINKS]
    names = {"compressed": "flat", "hierarchical": "hier. (8 a host)"}
    cells = {(algo, link, world): n for algo, link, world, n in rows}
    lines = ["| W | " + " | ".join(f"{names[a]}, {lk.replace('gbit', ' GbE')}" for a, lk in columns) + " |",
             "| ---: | " + " | ".join("---:" for _ in columns) + " |"]
    for world in WORLDS:
        lines.append(f"| {world} | " + " | ".join(millions(cells[(a, lk, world)]) if (a, lk, world) in cells else ""
                                                  for a, lk in columns) + " |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--within", type=float, default=0.1)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    rows = table(args.within)
    if args.markdown:
        print(markdown(rows))
    else:
        for algo, link, world, n in rows:
            print(f"{algo:12s} {link:7s} W={world:5d} smallest tagged call {millions(n)} M elements")
    return 0


if __name__ == "__main__":
    sys.exit(main())
