#!/bin/sh
# The measurements the cost model is fitted on and the simulation is validated against: onebit-bench
# on emulated Ethernet links (tools/ethernet: one network namespace per host, tc tbf at the rate) at
# W = 2, 4, 8 for 1 and 10 GbE, flat compressed, fp32 ring and hierarchical, and on loopback up to
# W = 32. Every configuration runs REPS times (default 2); fit.py keeps the lower time of each point.
#
#   tools/scale/measure.sh OUTDIR [REPS]        # as root; about 10 minutes on 2 cores
set -eu
out=${1:?usage: measure.sh OUTDIR [REPS]}
reps=${2:-2}
here=$(cd "$(dirname "$0")/../.." && pwd)
bench=${ONEBIT_BENCH:-$here/build/release/tools/onebit-bench}
eth="$here/tools/ethernet/onebit-ethernet"
mkdir -p "$out"
args="-b 4M -e 64M -f 4 -n 3 -w 1"
for rep in $(seq 1 "$reps"); do
  for w in 2 4 8; do
    "$eth" --bench "$bench" --ranks "$w" --link 1gbit --link 10gbit --json "$out/eth-w$w-l1.jsonl" -- \
      $args --algo compressed,ring > "$out/eth-w$w-l1-rep$rep.txt"
  done
  for hl in 2x2 4x2 2x4; do
    h=${hl%x*}; l=${hl#*x}
    "$eth" --bench "$bench" --hosts "$h" --ranks-per-host "$l" --link 1gbit --link 10gbit \
      --json "$out/eth-w$((h * l))-l$l.jsonl" -- $args --algo hierarchical,compressed \
      > "$out/eth-w$((h * l))-l$l-rep$rep.txt"
  done
  for w in 2 4 8 16 32; do
    "$bench" --ranks "$w" -b 16M -e 16M -n 3 -w 1 --algo compressed,ring --json "$out/lo-w$w-l1.jsonl" \
      > "$out/lo-w$w-l1-rep$rep.txt"
  done
done
