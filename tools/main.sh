#!/usr/bin/env bash
# onebit's main job on one machine: the allreduce benchmark on emulated commodity Ethernet, then
# the convergence demo (Adam vs OnebitAdam on real text, step times on emulated 1 GbE).
# 4 ranks, each in its own network namespace, linked through a bridge at 1 Gbit/s and then
# 10 Gbit/s (tc tbf); onebit's compressed allreduce, its full-precision ring and Gloo's allreduce,
# side by side, every result checked. Prints nccl-tests-style tables and writes
# build/bench/allreduce.png. Then flat against hierarchical compression on 2 hosts of 2 ranks.
# Needs root (namespaces); extra arguments go to the first onebit-bench sweep.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
tools/build.sh release
mkdir -p build/bench
results=build/bench/results.jsonl
rm -f "$results" build/bench/hierarchical.jsonl
tools/ethernet/onebit-ethernet --ranks 4 --link 1gbit --link 10gbit --json "$results" -- \
  -b 1M -e 256M -f 4 -n 3 -w 1 -c 1 "$@"
/usr/bin/python3 tools/ethernet/plot_bench.py "$results" build/bench/allreduce.png
# Hierarchical compression: 2 hosts of 2 ranks, one shaped link per host; flat compressed,
# hierarchical and Gloo side by side, at 1 GbE (256 MiB) and 100 Mbit/s (64 MiB).
tools/ethernet/onebit-ethernet --hosts 2 --ranks-per-host 2 --link 1gbit --json build/bench/hierarchical.jsonl -- \
  -b 256M -e 256M -n 3 -w 1 -c 1 --algo compressed,hierarchical,gloo
tools/ethernet/onebit-ethernet --hosts 2 --ranks-per-host 2 --link 100mbit --json build/bench/hierarchical.jsonl -- \
  -b 64M -e 64M -n 3 -w 1 -c 1 --algo compressed,hierarchical,gloo
# The convergence demo: a char transformer on Debian's fortunes, 4 ranks, Adam vs OnebitAdam;
# loss curves in build/demo/loss.png, every figure in build/demo/demo.json.
/usr/bin/python3 tools/demo/onebit-demo.py --ranks 4 --out build/demo
