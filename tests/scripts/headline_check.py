#!/usr/bin/env python3
"""tools/headline/onebit-headline, the main job's summary, on rows made here: the two ratios it
prints are the measured ones (largest common size; medians of the compression stage), the plot is
written, and a figure that is missing or failed its check (a wrong allreduce result, a loss that is
not finite and falling) is said so and fails the run — a fast but broken run is never a headline.

    /usr/bin/python3 tests/scripts/headline_check.py tools/headline/onebit-headline
"""
import json
import os
import subprocess
import sys
import tempfile


def allreduce_row(algo, size, seconds, wrong=0.0):
    return dict(link="1gbit", ranks=4, algo=algo, size=size, time_us=seconds * 1e6, wrong=wrong)


def step_row(config, median, falling=True):
    return dict(config=config, ranks=4, link="1gbit", params=25176064, median_seconds=median,
                loss_first=1.0061, loss_last=0.9893 if falling else float("nan"), loss_finite_and_falling=falling,
                breakdown=dict(compute=0.2, comm_wait=median / 2, compressed_allreduce=0.05, optimizer_rest=0.05))


def run(tool, folder, allreduce, step):
    paths = []
    for name, rows in (("allreduce.jsonl", allreduce), ("step.jsonl", step)):
        path = os.path.join(folder, name)
        if rows is not None:
            with open(path, "w") as f:
                f.write("".join(json.dumps(r) + "\n" for r in rows))
        elif os.path.exists(path):
            os.remove(path)
        paths.append(path)
    png = os.path.join(folder, "headline.png")
    if os.path.exists(png):
        os.remove(png)
    done = subprocess.run([sys.executable, tool, paths[0], paths[1], png], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    return done.returncode, done.stdout, os.path.exists(png)


def require(condition, what, output):
    if not condition:
        sys.exit(f"headline_check: FAILED: {what}\n--- output ---\n{output}")


def main():
    tool = sys.argv[1]
    good_allreduce = [allreduce_row("compressed", 64 << 20, 0.05), allreduce_row("gloo", 64 << 20, 0.9),
                      allreduce_row("compressed", 256 << 20, 0.16), allreduce_row("gloo", 256 << 20, 4.0),
                      allreduce_row("compressed", 1 << 30, 0.6)]  # no gloo row of 1 GiB: not the figure
    good_step = [step_row("adam", 1.6), step_row("onebit", 0.4)]
    with tempfile.TemporaryDirectory() as folder:
        code, out, png = run(tool, folder, good_allreduce, good_step)
        require(code == 0, f"exit {code} for good rows", out)
        require("256 MiB fp32: compressed 0.160 s, Gloo 4.000 s -> 25.00x Gloo" in out, "the allreduce figure", out)
        require("OnebitAdam 0.400 s, Adam 1.600 s" in out and "-> 4.00x Adam" in out, "the step figure", out)
        require(png, "no plot written", out)
        require(" on " not in out, "a CPU named for rows that name none", out)
        # Rows that name their CPU and SIMD set (the benchmarks' own since issue 47): the figures say them.
        named_allreduce = [dict(r, cpu="Some CPU 9000", kernels="avx2") for r in good_allreduce]
        named_step = [dict(r, cpu="Some CPU 9000", simd="avx2") for r in good_step]
        code, out, png = run(tool, folder, named_allreduce, named_step)
        require(code == 0 and out.count("; on Some CPU 9000, kernels avx2") == 2, "the CPU and SIMD set of each figure",
                out)

        wrong = good_allreduce[:3] + [allreduce_row("gloo", 256 << 20, 4.0, wrong=1e-3)]
        code, out, _ = run(tool, folder, wrong, good_step)
        require(code == 1 and "WRONG results from gloo" in out, "a wrong result is a headline", out)

        code, out, png = run(tool, folder, good_allreduce, None)
        require(code == 1 and "training step: not measured" in out, "a missing step figure passes", out)
        require(png and "25.00x Gloo" in out, "the measured figure is not kept when the other is missing", out)

        code, out, _ = run(tool, folder, good_allreduce, [step_row("adam", 1.6), step_row("onebit", 0.4, False)])
        require(code == 1 and "loss NOT finite and falling: onebit" in out, "a broken run is a headline", out)
    print("headline_check: 4 cases passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
