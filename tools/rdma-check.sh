#!/usr/bin/env bash
# The verbs transport (ONEBIT_TRANSPORT=ibverbs) on a host with an RDMA device: InfiniBand, RoCE,
# or soft-RoCE (as root: modprobe rdma_rxe; rdma link add rxe0 type rxe netdev eth0). It has not
# run on such a host yet (docs/benchmarks/hardware.md says so); this is what to run first when one exists.
#
#   tools/rdma-check.sh [--out DIR] [--build-dir DIR] [--ranks N] [--hca DEV[:PORT]] [--gid-index I]
#
#   1. build Release with -DONEBIT_WITH_IBVERBS=ON;
#   2. show the devices (ibv_devinfo when rdma-core's utilities are there);
#   3. the verbs transport's own tests (tests/ibverbs), which skip without a device — here they must
#      run, so a skip is a failure;
#   4. the engine tests (ranks as processes, through the C API) with ONEBIT_TRANSPORT=ibverbs;
#   5. onebit-bench, N local ranks, every result checked: the same sweep over onebit's TCP mesh and
#      over verbs, side by side (the ratio is what to record).
# Logs and summary.md land in --out (default rdma-check-out). Exit 0 when every step passed.
set -uo pipefail
cd "$(dirname "$0")/.."

out=rdma-check-out build=build/rdma ranks=2
usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=$2; shift 2 ;;
    --build-dir) build=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --hca) export ONEBIT_IB_HCA=$2; shift 2 ;;
    --gid-index) export ONEBIT_IB_GID_INDEX=$2; shift 2 ;;
    -h|--help) usage ;;
    *) echo "rdma-check: unknown argument '$1'" >&2; usage ;;
  esac
done
mkdir -p "$out"
summary="$out/summary.md"
echo "# rdma-check $(date -u +%FT%TZ) on $(hostname)" > "$summary"
failed=0
step() {  # step NAME LOG COMMAND...: runs it, records PASS/FAIL
  local name=$1 log=$2
  shift 2
  if "$@" > "$out/$log" 2>&1; then
    echo "- PASS $name" >> "$summary"
  else
    echo "- FAIL $name (rc $?, $out/$log)" >> "$summary"
    failed=1
  fi
}

step "build (ONEBIT_WITH_IBVERBS=ON)" build.log bash -c "
  cmake -S . -B '$build' -G Ninja -DCMAKE_BUILD_TYPE=Release -DONEBIT_WITH_IBVERBS=ON && cmake --build '$build'"
[ $failed -eq 0 ] || { cat "$summary"; exit 1; }

step "devices" devices.log bash -c 'if command -v ibv_devinfo >/dev/null; then ibv_devinfo; else ls /sys/class/infiniband; fi'

# The device tests must run here, not skip: a skip means this host has no usable device.
step "verbs transport tests" verbs-tests.log env ONEBIT_TRANSPORT=ibverbs "$build/tests/onebit_ibverbs_tests"
if grep -q '\[  SKIPPED \]' "$out/verbs-tests.log"; then
  echo "- FAIL verbs transport tests skipped: $(grep -m1 -A1 Skipped "$out/verbs-tests.log" | tail -1)" >> "$summary"
  failed=1
fi

step "engine tests over verbs" engine-tests.log env ONEBIT_TRANSPORT=ibverbs "$build/tests/onebit_engine_tests"

bench=("$build/tools/onebit-bench" --ranks "$ranks" -b 1M -e 64M -f 4 -n 5 -c 1 --algo compressed,ring)
step "onebit-bench over TCP" bench-tcp.log env ONEBIT_TRANSPORT=tcp "${bench[@]}"
step "onebit-bench over verbs" bench-verbs.log env ONEBIT_TRANSPORT=ibverbs "${bench[@]}"
{
  echo
  echo "## onebit-bench, $ranks ranks, 64 MiB (us): TCP then verbs"
  grep -E '^ +67108864 ' "$out/bench-tcp.log" | awk '{print "- tcp   " $10 ": " $6}'
  grep -E '^ +67108864 ' "$out/bench-verbs.log" | awk '{print "- verbs " $10 ": " $6}'
} >> "$summary"
cat "$summary"
exit $failed
