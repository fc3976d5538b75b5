#!/usr/bin/env bash
# onebit's main job on one machine. Needs root (network namespaces and tc).
#
#   tools/main.sh          the two headline figures, a few minutes once built: onebit's compressed
#                          allreduce against Gloo's (4 ranks, each in its own network namespace,
#                          linked through a bridge by veths shaped to 1 Gbit/s with tc tbf; 4 MiB to
#                          256 MiB of fp32, every result checked), and a DDP training step with
#                          OnebitAdam against Adam on the same emulated links (tools/step-bench: a
#                          25 M-parameter MLP whose fp32 allreduce dominates Adam's step). Prints
#                          both ratios and writes build/bench/headline.png.
#   tools/main.sh --full   then the rest, about 35 minutes more: the whole allreduce sweep (1 MiB to
#                          256 MiB, 1 and 10 GbE, onebit's fp32 ring too; build/bench/allreduce.png),
#                          flat against hierarchical compression on 2 hosts of 2 ranks, the step
#                          bench's every configuration (fp16 and PowerSGD hooks, ZeroOneAdam, the
#                          automatic freeze), 10 GbE and 2 ranks, and the convergence demo (Adam
#                          against onebit's optimizers on real text; build/demo/loss.png).
# With --full, further arguments go to the whole sweep's onebit-bench.
set -euo pipefail
cd "$(dirname "$0")/.."
full=0
if [ "${1:-}" = "--full" ]; then
  full=1
  shift
elif [ $# -gt 0 ]; then
  echo "usage: tools/main.sh [--full [onebit-bench arguments for the whole sweep]]" >&2
  exit 2
fi
tools/setup.sh
tools/build.sh release
tools/pip-torch.sh || echo "tools/main.sh: no pip torch venv: the step-time figure cannot be measured" >&2
mkdir -p build/bench
headline_allreduce=build/bench/headline-allreduce.jsonl
headline_step=build/bench/headline-step.jsonl
rm -f "$headline_allreduce" "$headline_step"

# 1. The allreduce, compressed against Gloo, at 1 GbE.
tools/ethernet/onebit-ethernet --ranks 4 --link 1gbit --json "$headline_allreduce" -- \
  -b 4M -e 256M -f 4 -n 3 -w 1 -c 1 --algo compressed,gloo
# 2. The training step, OnebitAdam against Adam, at 1 GbE (exit 77: no pip torch, said above).
step_status=0
tools/step-bench/onebit-step-bench --ranks 4 --link 1gbit --configs adam,onebit --steps 12 --freeze 4 \
  --json "$headline_step" || step_status=$?
headline_status=0
/usr/bin/python3 tools/headline/onebit-headline "$headline_allreduce" "$headline_step" build/bench/headline.png ||
  headline_status=$?

if [ "$full" = 0 ]; then
  echo
  echo "The rest (about 35 minutes more): tools/main.sh --full — the whole allreduce sweep at 1 and 10 GbE,"
  echo "hierarchical compression, every step-bench configuration (fp16, PowerSGD, ZeroOneAdam, auto freeze),"
  echo "10 GbE and 2 ranks, and the convergence demo. docs/benchmarks.md has recorded runs of each."
  exit "$headline_status"
fi

# The whole sweep: 1 MiB - 256 MiB at 1 and 10 GbE; compressed, onebit's fp32 ring and Gloo.
results=build/bench/results.jsonl
rm -f "$results" build/bench/hierarchical.jsonl build/step-bench/results.jsonl
tools/ethernet/onebit-ethernet --ranks 4 --link 1gbit --link 10gbit --json "$results" -- \
  -b 1M -e 256M -f 4 -n 3 -w 1 -c 1 "$@"
/usr/bin/python3 tools/ethernet/plot_bench.py "$results" build/bench/allreduce.png
# Hierarchical compression: 2 hosts of 2 ranks, one shaped link per host; flat compressed,
# hierarchical and Gloo side by side, at 1 GbE (256 MiB) and 100 Mbit/s (64 MiB).
tools/ethernet/onebit-ethernet --hosts 2 --ranks-per-host 2 --link 1gbit --json build/bench/hierarchical.jsonl -- \
  -b 256M -e 256M -n 3 -w 1 -c 1 --algo compressed,hierarchical,gloo
tools/ethernet/onebit-ethernet --hosts 2 --ranks-per-host 2 --link 100mbit --json build/bench/hierarchical.jsonl -- \
  -b 64M -e 64M -n 3 -w 1 -c 1 --algo compressed,hierarchical,gloo
# The step bench's other configurations, links and world sizes (build/step-bench/results.jsonl).
if [ "$step_status" != 77 ]; then
  tools/step-bench/onebit-step-bench --ranks 4 --link 1gbit --configs all --json build/step-bench/results.jsonl
  tools/step-bench/onebit-step-bench --ranks 4 --link 10gbit --json build/step-bench/results.jsonl
  tools/step-bench/onebit-step-bench --ranks 2 --link 1gbit --json build/step-bench/results.jsonl
fi
# The convergence demo: a char transformer on Debian's fortunes, 4 ranks, Adam vs onebit's
# optimizers; loss curves in build/demo/loss.png, every figure in build/demo/demo.json.
/usr/bin/python3 tools/demo/onebit-demo.py --ranks 4 --out build/demo
exit "$headline_status"
