#!/usr/bin/env python3
"""Fits the cost model's constants (model.Machine: cpu_scale, alpha, gamma on emulated links and on
loopback) to onebit-bench runs made by measure.sh, and prints the model against every measured
point as a Markdown table.

    /usr/bin/python3 tools/scale/fit.py build/scale/meas [--table]   # needs numpy and scipy (Debian's)

Each point (link, W, ranks per host, algorithm, size) keeps the lowest time of its repetitions: the
machine is shared, and noise only ever adds time. The fit minimises the squared log ratio
model/measured over every point, so a 2x miss on a 2 ms call weighs as much as on a 2 s one.
"""
import glob
import json
import math
import os
import re
import sys
from dataclasses import replace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model as M

LOOPBACK = 1e15  # bytes/s: loopback has no link, only the TCP stack's CPU (gamma)


def load(directory):
    best = {}
    for path in glob.glob(os.path.join(directory, "**", "*.jsonl"), recursive=True):
        where, world, local = re.match(r"(eth|lo)-w(\d+)-l(\d+)\.jsonl", os.path.basename(path)).groups()
        with open(path) as fh:
            for line in fh:
                r = json.loads(line)
                link = r["link"] if where == "eth" else "loopback"
                key = (where, link, int(world), int(local), r["algo"], r["count"])
                best[key] = min(best.get(key, math.inf), r["time_us"] * 1e-6)
    return best


def predict(key, params):
    where, link, world, local, algo, n = key
    scale, alpha, gamma_eth, gamma_lo, host = params
    m = replace(M.FITTED, cpu_scale=scale, alpha=alpha, host_scale=host, gamma=gamma_eth if where == "eth" else gamma_lo,
                burst=M.TBF_BURST if where == "eth" else 0.0)
    links = dict(M.LINKS_TBF, loopback=LOOPBACK)
    return M.time_of(algo, n, world, local, link, m, links)


def fit(points):
    import numpy as np
    from scipy.optimize import minimize
    keys = list(points)
    measured = np.array([points[k] for k in keys])

    def loss(x):
        params = np.exp(x)
        pred = np.array([predict(k, params) for k in keys])
        return float(np.sum(np.log(pred / measured) ** 2))
    x0 = np.log([1.2, 20e-6, 0.5e-9, 0.3e-9, 1.5])
    result = minimize(loss, x0, method="Nelder-Mead", options={"maxiter": 4000, "xatol": 1e-4, "fatol": 1e-6})
    return tuple(float(v) for v in np.exp(result.x)), math.sqrt(result.fun / len(keys))


def main():
    directory = sys.argv[1]
    points = load(directory)
    params, rms = fit(points)
    print(f"# {len(points)} points; cpu_scale {params[0]:.3f}, alpha {params[1] * 1e6:.1f} us/message, "
          f"gamma {params[2] * 1e9:.3f} ns/byte (emulated links), {params[3] * 1e9:.3f} ns/byte (loopback), "
          f"host_scale {params[4]:.2f}; "
          f"rms log error {rms:.3f}")
    print("| where | link | W | L | algorithm | MiB | measured ms | model ms | model/measured |")
    print("| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |")
    within = 0
    for key in sorted(points, key=lambda k: (k[0], k[1], k[4], k[2], k[3], k[5])):
        where, link, world, local, algo, n = key
        t, p = points[key], predict(key, params)
        within += abs(p / t - 1) <= 0.2
        print(f"| {where} | {link} | {world} | {local} | {algo} | {n * 4 >> 20} | {t * 1e3:.1f} | {p * 1e3:.1f} | "
              f"{p / t:.2f} |")
    print(f"# within 20 %: {within} of {len(points)}")
    with open(os.path.join(directory, "fitted.json"), "w") as fh:
        json.dump({"cpu_scale": params[0], "alpha": params[1], "gamma_eth": params[2], "gamma_lo": params[3],
                   "host_scale": params[4]}, fh)


if __name__ == "__main__":
    main()
