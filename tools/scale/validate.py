#!/usr/bin/python3
"""The SimGrid simulation and the cost model against the emulated runs (measure.sh's output): every
tools/ethernet point (W <= 8, 1 and 10 GbE) simulated on a star of hosts with the emulation's rates
and its two shared cores (each rank's core at 1 / oversub of a core), and printed as a Markdown table
of measured, model and simulated time.

    /usr/bin/python3 tools/scale/validate.py build/scale/meas [--json OUT]
"""
import argparse
import json
import os
import sys
from dataclasses import replace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fit as F
import model as M
import sim as S


def emulation_machine(where):
    return replace(M.FITTED, gamma=M.FITTED.gamma if where == "eth" else M.GAMMA_LOOPBACK,
                   burst=M.TBF_BURST if where == "eth" else 0.0)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory")
    parser.add_argument("--json")
    args = parser.parse_args()
    points = {k: v for k, v in F.load(args.directory).items() if k[0] == "eth"}
    rows = []
    print("| link | W | L | algorithm | MiB | measured ms | model ms | simulated ms | model/meas. | sim./meas. |")
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for key in sorted(points, key=lambda k: (k[1], k[4], k[2], k[3], k[5])):
        where, link, world, local, algo, n = key
        m = emulation_machine(where)
        t = points[key]
        t_model = M.time_of(algo, n, world, local, link, m, M.LINKS_TBF)
        t_sim = S.simulate(algo, n, world, local, link, m, M.LINKS_TBF, topology="star")
        rows.append({"link": link, "world": world, "local": local, "algo": algo, "n": n, "measured": t,
                     "model": t_model, "sim": t_sim})
        print(f"| {link} | {world} | {local} | {algo} | {n * 4 >> 20} | {t * 1e3:.1f} | {t_model * 1e3:.1f} | "
              f"{t_sim * 1e3:.1f} | {t_model / t:.2f} | {t_sim / t:.2f} |", flush=True)
    for what in ("model", "sim"):
        within = sum(abs(r[what] / r["measured"] - 1) <= 0.2 for r in rows)
        print(f"# {what}: within 20 % of the measurement at {within} of {len(rows)} points")
    within = sum(abs(r["sim"] / r["model"] - 1) <= 0.2 for r in rows)
    print(f"# simulation within 20 % of the model at {within} of {len(rows)} points")
    if args.json:
        with open(args.json, "w") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in rows)


if __name__ == "__main__":
    main()
