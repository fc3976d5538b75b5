#!/usr/bin/env bash
# The GPU path on a machine with one NVIDIA GPU, PyTorch (CUDA) and NCCL, in a few minutes:
#   1. build (or reuse build/release when it was built elsewhere and carried here);
#   2. the CUDA kernel tests against the scalar CPU oracle;
#   3. each CUDA kernel's bytes/s against a device-to-device copy (goal ≥ 0.8);
#   4. a 2-rank torch.distributed NCCL job on the one GPU through libnccl-net-onebit.so, with
#      libonebit-nccl-preload.so: untagged all_reduces exact, tagged ones against the reference;
# then a summary table. Output is what docs/benchmarks.md records.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build/release}
declare -A result

if [ ! -x "$build/tests/onebit_cuda_tests" ] || [ ! -f "$build/libnccl-net-onebit.so" ] || [ ! -f "$build/libonebit-nccl-preload.so" ]; then
  echo "== build"
  cmake --preset release -DONEBIT_WITH_CUDA=ON >/dev/null && cmake --build --preset release -j "$(nproc)" \
    --target onebit_cuda_tests onebit-cuda-bench nccl-net-onebit onebit_nccl_net_tests onebit-nccl-preload || { echo "build failed"; exit 1; }
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true

echo "== CUDA kernel tests"
if timeout 300 "$build/tests/onebit_cuda_tests" --gtest_brief=1; then result[kernel_tests]=pass; else result[kernel_tests]=FAIL; fi
if "$build/tests/onebit_cuda_tests" --gtest_brief=0 2>&1 | grep -q "SKIPPED"; then result[kernel_tests]="skipped (no GPU?)"; fi

echo "== CUDA kernels vs device-to-device copy"
timeout 120 "$build/tools/onebit-cuda-bench"
case $? in 0) result[kernel_bench]=measured ;; 77) result[kernel_bench]="skipped (no GPU)" ;; *) result[kernel_bench]=FAIL ;; esac

echo "== NCCL_NET plugin ABI test (CPU)"
if timeout 300 "$build/tests/onebit_nccl_net_tests" --gtest_brief=1; then result[net_abi]=pass; else result[net_abi]=FAIL; fi

echo "== torch.distributed NCCL job through NET/onebit"
if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  if timeout 300 python3 tools/gpu/nccl_job_check.py "$build"; then result[nccl_job]=pass; else result[nccl_job]=FAIL; fi
else
  result[nccl_job]="skipped (no torch with CUDA)"
fi

echo
echo "== summary"
printf '  %-40s %s\n' "CUDA kernels vs scalar oracle" "${result[kernel_tests]}"
printf '  %-40s %s\n' "CUDA kernels vs D2D copy (table above)" "${result[kernel_bench]}"
printf '  %-40s %s\n' "NCCL_NET plugin ABI, two processes" "${result[net_abi]}"
printf '  %-40s %s\n' "NCCL job: NET/onebit + ncclAllReduce preload" "${result[nccl_job]}"
for v in "${result[@]}"; do [ "$v" = FAIL ] && exit 1; done
exit 0
