#!/usr/bin/python3
"""docs/scale.md's tables from sweeps (sweep.py's JSON rows; a later file's row replaces an earlier
one's for the same point; a point no file has gets the model's time alone, "sim": null), the
crossovers, the bucket sizes and the auto decision table from the cost model, and the plot.

    /usr/bin/python3 tools/scale/report.py build/scale/sweep.jsonl [MORE.jsonl ...] [--plot docs/img/scale.png]
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import buckets as B  # noqa: E402
import model as M

NAMES = {"compressed": "flat", "hierarchical": "hier. 8/host", "ring_bf16": "bf16 ring", "ring_fp32": "fp32 ring"}


def tables(rows):
    by = {(r["algo"], r["n"], r["world"], r["link"]): r for r in rows}
    worlds = sorted({r["world"] for r in rows})
    for n in sorted({r["n"] for r in rows}):
        for link in sorted({r["link"] for r in rows}):
            print(f"\n**n = {n / 1e6:.0f} M elements ({n * 4 / 1e6:.0f} MB fp32), {link.replace('gbit', ' GbE')}** "
                  "— ms per call, simulated (model); speed-up = ring time / onebit time\n")
            print("| W | flat | hier. 8/host | bf16 ring | fp32 ring | flat vs bf16 | flat vs fp32 | hier. vs bf16 |")
            print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
            for w in worlds:
                cells, t = [], {}
                for algo in ("compressed", "hierarchical", "ring_bf16", "ring_fp32"):
                    r = by.get((algo, n, w, link))
                    if r is None:
                        cells.append("–")
                        continue
                    # the baselines at the lower of their simulated and modelled time: the pipelined
                    # rings simulate slower than the model at large W (docs/scale.md), and the
                    # speed-up should not gain from that
                    t[algo] = r["model"] if r["sim"] is None else (
                        min(r["sim"], r["model"]) if algo.startswith("ring") else r["sim"])
                    sim = f"{r['sim'] * 1e3:.1f}" if r["sim"] is not None else "n/s"
                    cells.append(f"{sim} ({r['model'] * 1e3:.1f})")

                def ratio(a, b, t=t):
                    return f"{t[b] / t[a]:.2f}x" if a in t and b in t else "–"
                print(f"| {w} | " + " | ".join(cells) + f" | {ratio('compressed', 'ring_bf16')} | "
                      f"{ratio('compressed', 'ring_fp32')} | {ratio('hierarchical', 'ring_bf16')} |")


# W on a grid of multiples of 8, about 9 % apart, to 16,384
GRID = sorted({max(8, round(2 ** (k / 8) / 8) * 8) for k in range(24, 113)})


def crossover(f):
    """The first W of GRID where f(W) holds, or None."""
    return next((w for w in GRID if f(w)), None)


def crossovers(m):
    print("\n| link | n | flat: message CPU > its wire time from W ≈ | with 8 ranks a host, flat loses to hier. from W ≈ | "
          "flat loses to bf16 ring from W ≈ | hier. 8/host loses to bf16 ring from W ≈ |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for link in ("1gbit", "10gbit", "25gbit"):
        rate = M.LINKS_REAL[link]
        for n in (25_000_000, 250_000_000):
            def t(algo, w, local=1, n=n, link=link):
                return M.time_of(algo, n, w, local, link, m, M.LINKS_REAL)

            def message_bound(w, n=n, rate=rate):
                s = M.schedule_flat(n, w)
                return m.alpha * s.messages > s.bytes / rate
            found = [crossover(message_bound),
                     crossover(lambda w: w >= 16 and t("compressed", w, 8) > t("hierarchical", w, 8)),
                     crossover(lambda w: t("compressed", w) > t("ring_bf16", w)),
                     crossover(lambda w: w >= 16 and t("hierarchical", w, 8) > t("ring_bf16", w))]
            cells = " | ".join(f"{w:,}" if w else "> 16,384" for w in found)
            print(f"| {link.replace('gbit', ' GbE')} | {n / 1e6:.0f} M | {cells} |")


def buckets(m):
    worlds = (2, 8, 16, 64, 256, 1024)
    print("\n| link | algorithm | " + " | ".join(f"W = {w}" for w in worlds) + " |")
    print("| --- | --- | " + " | ".join("---:" for _ in worlds) + " |")
    for link in ("1gbit", "10gbit", "25gbit"):
        for algo, local in (("compressed", 1), ("hierarchical", 8), ("ring", 1)):
            cells = []
            for w in worlds:
                if w % local or w // local < 2:
                    cells.append("–")
                    continue
                n = B.smallest_bucket(algo, w, local, link, m)
                cells.append(f"{n * 4 / 1e6:,.1f} MB" if n else "> 550 GB")
            name = {"compressed": "flat", "hierarchical": "hier. 8/host", "ring": "fp32 ring (engine)"}[algo]
            print(f"| {link.replace('gbit', ' GbE')} | {name} | " + " | ".join(cells) + " |")


def auto_table(m, link="10gbit"):
    """Which compressed algorithm the model finds faster per (W, ranks per host, n), and by how much."""
    sizes = (262_144, 4_000_000, 25_000_000, 250_000_000)
    print("\n| W | L | " + " | ".join(f"n = {n / 1e6:g} M" if n >= 1e6 else f"n = {n >> 10} Ki" for n in sizes) + f" |   ({link.replace('gbit', ' GbE')})")
    print("| ---: | ---: | " + " | ".join("---" for _ in sizes) + " |")
    for w, local in ((4, 2), (8, 2), (8, 4), (16, 8), (64, 8), (256, 8), (1024, 8), (16, 1), (1024, 1)):
        cells = []
        for n in sizes:
            flat = M.time_of("compressed", n, w, local, link, m, M.LINKS_REAL)
            if local == 1:
                cells.append(f"flat ({flat * 1e3:.1f} ms)")
                continue
            hier = M.time_of("hierarchical", n, w, local, link, m, M.LINKS_REAL)
            best, other = ("hierarchical", flat / hier) if hier < flat else ("flat", hier / flat)
            cells.append(f"{best} ({other:.2f}x)")
        print(f"| {w} | {local} | " + " | ".join(cells) + " |")


def load(paths, latency=10e-6):
    import sweep as SW
    rows = {}
    for path in paths:
        with open(path) as fh:
            for line in fh:
                r = json.loads(line)
                rows[(r["algo"], r["local"], r["n"], r["world"], r["link"])] = r
    m = M.at_scale(M.FITTED, latency)
    for algo, local, n, w, link in SW.points(max(SW.WORLDS)):
        rows.setdefault((algo, local, n, w, link), {
            "algo": algo, "local": local, "n": n, "world": w, "link": link, "sim": None, "latency": latency,
            "model": M.time_of(algo, n, w, local, link, m, M.LINKS_REAL)})
    return list(rows.values())


def main():
    args = sys.argv[1:]
    png = None
    if "--plot" in args:
        png = args[args.index("--plot") + 1]
        del args[args.index("--plot"):args.index("--plot") + 2]
    rows = load(args)
    if png:
        import sweep as SW
        return SW.plot(rows, png)
    tables(rows)
    m = M.at_scale(M.FITTED, rows[0]["latency"] if rows else 10e-6)
    crossovers(m)
    buckets(m)
    auto_table(m, "10gbit")
    auto_table(m, "25gbit")


if __name__ == "__main__":
    main()
