#!/usr/bin/env bash
# tools/gpu-check.sh's build, as on a bare GPU machine: NCCL only as the nvidia-nccl wheel lays it
# out (nvidia/nccl/include/nccl.h, lib/libnccl.so.2, no unversioned libnccl.so), GoogleTest from
# a source tree, Google Benchmark and gloo not used. Passes when the script configures and builds
# every GPU target and says what it built.
#   gpu_check_build.sh SOURCE_DIR WORK_DIR NCCL_H LIBNCCL_SO_2 GTEST_SOURCE_DIR
set -euo pipefail
source_dir=$1 work=$2 nccl_h=$3 libnccl=$4 gtest=$5
rm -rf "$work"
wheel=$work/site-packages/nvidia/nccl
mkdir -p "$wheel/include" "$wheel/lib"
ln -s "$nccl_h" "$wheel/include/nccl.h"
ln -s "$(readlink -f "$libnccl")" "$wheel/lib/libnccl.so.2"
"$source_dir/tools/gpu-check.sh" --out "$work/out" --nccl-home "$wheel" --gtest-source "$gtest" \
  --build-dir "$work/build" --build-only
cat "$work/out/summary.md"
grep -q '| configure and build (.*) | pass |' "$work/out/summary.md"
grep -q "NCCL: $wheel" "$work/out/summary.md"
grep -q "GoogleTest: built from $gtest" "$work/out/summary.md"
grep -q 'onebit: GoogleTest built from' "$work/out/build.log"
for target in libonebit-nccl-preload.so libnccl-net-onebit.so tests/onebit_cuda_tests tools/onebit-cuda-bench; do
  [ -e "$work/build/$target" ] || { echo "missing: $target"; exit 1; }
done
echo "gpu-check builds as on a bare GPU machine"
