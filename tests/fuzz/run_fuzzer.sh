#!/bin/sh
# run_fuzzer.sh FUZZER SEEDS SECONDS: runs a libFuzzer target from its seeds for SECONDS; fails on
# any crash, sanitizer report or timeout (a single input taking more than 10 s).
set -eu
fuzzer=$1 seeds=$2 seconds=$3
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
"$fuzzer" "$scratch" "$seeds" -max_total_time="$seconds" -timeout=10 -max_len=4096 -print_final_stats=1 \
  -artifact_prefix="$scratch/" 2>&1 | grep -v "^#[0-9]*.*\(NEW\|REDUCE\|pulse\)" || true
# libFuzzer's exit status is lost in the pipe above; a crash leaves an artifact behind.
if ls "$scratch"/crash-* "$scratch"/leak-* "$scratch"/timeout-* "$scratch"/oom-* >/dev/null 2>&1; then
  echo "FAIL: the fuzzer found a failing input:"; ls "$scratch"/crash-* "$scratch"/leak-* "$scratch"/timeout-* "$scratch"/oom-* 2>/dev/null
  exit 1
fi
echo "OK: $(basename "$fuzzer") ran ${seconds}s without a finding"
