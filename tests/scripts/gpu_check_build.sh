#!/usr/bin/env bash
# tools/gpu-check.sh's build, as on a bare GPU machine: NCCL only as the nvidia-nccl wheel lays it
# out (nvidia/nccl/include/nccl.h, lib/libnccl.so.2, no unversioned libnccl.so), GoogleTest from
# a source tree — or, with GTEST_SOURCE_DIR `none`, no GoogleTest at all (--no-gtest: as on a
# machine with neither an installed one nor a source tree) — Google Benchmark and gloo not used.
# Passes when the script configures and builds every GPU target it can and says what it built and,
# without GoogleTest, which steps it skips and why.
#   gpu_check_build.sh SOURCE_DIR WORK_DIR NCCL_H LIBNCCL_SO_2 GTEST_SOURCE_DIR|none
set -euo pipefail
source_dir=$1 work=$2 nccl_h=$3 libnccl=$4 gtest=$5
rm -rf "$work"
wheel=$work/site-packages/nvidia/nccl
mkdir -p "$wheel/include" "$wheel/lib"
ln -s "$nccl_h" "$wheel/include/nccl.h"
ln -s "$(readlink -f "$libnccl")" "$wheel/lib/libnccl.so.2"
if [ "$gtest" = none ]; then
  gtest_args=(--no-gtest)
  built=(libonebit-nccl-preload.so libnccl-net-onebit.so tools/onebit-cuda-bench tests/nccl_preload_check)
  absent=(tests/onebit_cuda_tests tests/onebit_nccl_net_tests)
else
  gtest_args=(--gtest-source "$gtest")
  built=(libonebit-nccl-preload.so libnccl-net-onebit.so tests/onebit_cuda_tests tools/onebit-cuda-bench
    tests/onebit_nccl_net_tests tests/nccl_preload_check)
  absent=()
fi
"$source_dir/tools/gpu-check.sh" --out "$work/out" --nccl-home "$wheel" "${gtest_args[@]}" \
  --build-dir "$work/build" --build-only
cat "$work/out/summary.md"
grep -q '| configure and build (.*) | pass |' "$work/out/summary.md"
grep -q "NCCL: $wheel" "$work/out/summary.md"
if [ "$gtest" = none ]; then
  grep -q "GoogleTest: not used (--no-gtest): the GoogleTest steps are skipped" "$work/out/summary.md"
  grep -q 'onebit: ONEBIT_TESTS_WITHOUT_GTEST' "$work/out/build.log"
  grep -q '^Skipped steps:' "$work/out/summary.md"
  grep -q '^- CUDA kernels vs the scalar oracle: no GoogleTest (--no-gtest)' "$work/out/summary.md"
  grep -q '^- NCCL_NET plugin ABI, two processes: no GoogleTest (--no-gtest)' "$work/out/summary.md"
else
  grep -q "GoogleTest: built from $gtest" "$work/out/summary.md"
  grep -q 'onebit: GoogleTest built from' "$work/out/build.log"
fi
for target in "${built[@]}"; do
  [ -e "$work/build/$target" ] || { echo "missing: $target"; exit 1; }
done
for target in "${absent[@]}"; do
  [ ! -e "$work/build/$target" ] || { echo "built without GoogleTest: $target"; exit 1; }
done
files=$(find "$work/out" -type f | wc -l)
[ "$files" -le 8 ] || { echo "$files files in --out, more than 8"; exit 1; }
echo "gpu-check builds as on a bare GPU machine (GoogleTest: $gtest)"
