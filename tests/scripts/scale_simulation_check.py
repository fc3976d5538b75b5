"""The scale tools' small case (run by scale_simulation.sh): tools/scale's schedules send the bytes the
engine sends, and its SimGrid simulation agrees with its cost model where the two must agree.

1. The wire bytes of model.schedule_flat and model.schedule_ring, averaged over ranks, equal what
   onebit-bench measures for the flat compressed call and the fp32 ring on loopback (W = 3 and 4,
   even and uneven chunks).
2. sim.py on a star of W = 4, 8, 16 hosts at 10 GbE, each rank its own core, 5 us latency:
   the flat compressed call, the engine's ring and the ideal bf16 ring within 15 % of model.py; the
   fat-tree platform (non-blocking) within 5 % of the star; the compressed call faster than the
   bf16 ring at W = 16 and 25 M elements.
3. The bucket guidance in docs/usage/optimizers.md is the table tools/scale/buckets.py prints from
   the model, and each of its sizes is the smallest of the grid within 10 %.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

src, bench = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(src, "tools", "scale"))
import buckets as B
import model as M
import sim as S

started = time.time()
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


# 1. Schedules against the engine's own byte counts.
for world, size in ((4, 1 << 20), (3, 1 << 20), (4, 12 << 20)):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.jsonl")
        subprocess.run([bench, "--ranks", str(world), "-b", str(size), "-e", str(size), "-n", "1", "-w", "1",
                        "--settle", "0", "--algo", "compressed,ring", "--json", out],
                       check=True, stdout=subprocess.DEVNULL)
        with open(out) as fh:
            rows = {r["algo"]: r for r in map(json.loads, fh)}
    n = size // 4
    flat = sum(M.schedule_flat(n, world, r).bytes for r in range(world)) / world
    # the bench's JSON prints 6 significant digits
    check(abs(rows["compressed"]["wire_bytes"] - flat) <= 5e-6 * flat,
          f"W={world} n={n}: flat schedule {flat:.0f} B/rank, engine {rows['compressed']['wire_bytes']:.0f}")
    ring = M.schedule_ring(n, world).bytes  # every rank sends all chunks but one: the same bytes when n % W == 0
    if n % world == 0:
        check(abs(rows["ring"]["wire_bytes"] - ring) <= 5e-6 * ring,
              f"W={world} n={n}: ring schedule {ring} B/rank, engine {rows['ring']['wire_bytes']:.0f}")

# 2. The simulation against the model.
machine = M.at_scale(M.FITTED, latency=5e-6)
for world in (4, 8, 16):
    for algo in ("compressed", "ring", "ring_bf16"):
        n = 25_000_000 if world == 16 else 4_000_000
        t_sim = S.simulate(algo, n, world, 1, "10gbit", machine, topology="star")
        t_model = M.time_of(algo, n, world, 1, "10gbit", machine, M.LINKS_REAL)
        check(abs(t_sim / t_model - 1) <= 0.15,
              f"{algo} W={world} n={n}: simulated {t_sim * 1e3:.2f} ms, model {t_model * 1e3:.2f} ms")
t_star = S.simulate("compressed", 25_000_000, 16, 1, "10gbit", machine, topology="star")
t_tree = S.simulate("compressed", 25_000_000, 16, 1, "10gbit", machine, topology="fattree")
check(abs(t_tree / t_star - 1) <= 0.05, f"compressed W=16: fat-tree {t_tree * 1e3:.2f} ms, star {t_star * 1e3:.2f} ms")
t_bf16 = S.simulate("ring_bf16", 25_000_000, 16, 1, "10gbit", machine, topology="fattree")
check(t_tree < t_bf16, f"W=16, 25 M elements, 10 GbE: compressed {t_tree * 1e3:.2f} ms < bf16 ring {t_bf16 * 1e3:.2f} ms")

# 3. The bucket guidance: the page holds the model's table; each size is the smallest within 10 %.
rows = B.table(0.1)
with open(os.path.join(src, "docs", "usage", "optimizers.md")) as fh:
    page = fh.read()
check(B.markdown(rows) in page, "docs/usage/optimizers.md holds the table tools/scale/buckets.py --markdown prints")
scale = M.at_scale()
sizes = B.grid()
for algo, link, world, n in rows:
    if n is None:
        continue  # said below
    local = dict(B.ALGOS)[algo]
    per_element = B.per_element(algo, world, local, link, scale)
    smaller = sizes[max(sizes.index(n) - 1, 0)]  # the grid's size below n (the first: itself, then not below)
    fits = B.seconds(algo, n, world, local, link, scale) <= 1.1 * per_element * n
    below = B.seconds(algo, smaller, world, local, link, scale) > 1.1 * per_element * smaller
    if not (fits and below):
        check(False, f"{algo} {link} W={world}: {n} elements is not the smallest within 10 %")
check(all(n is not None for *_, n in rows), f"a bucket size for each of the {len(rows)} cases")

print(f"{'FAILED' if failures else 'OK'}: {len(failures)} failure(s), {time.time() - started:.1f} s")
sys.exit(1 if failures else 0)
