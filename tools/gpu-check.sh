#!/usr/bin/env bash
# The GPU path, unattended, on a bare GPU machine: one that has the CUDA toolkit, CMake, ninja and a
# pip PyTorch with its nvidia-nccl wheel, and nothing installable (no apt, no pip, no network).
#
#   tools/gpu-check.sh --out DIR [--gtest-source DIR] [--nccl-home DIR] [--arch 90] [--build-dir DIR]
#                      [--link 10gbit|none] [--budget SECONDS] [--build-only]
#
#   1. build the GPU targets (Release, sm_90 by default; GoogleTest from --gtest-source, or
#      .deps/googletest, or /usr/src/googletest, when none is installed; no Google Benchmark, no
#      gloo; NCCL's header and libnccl.so.2 from the nvidia-nccl wheel that torch loads);
#   2. the CUDA kernel tests against the scalar CPU oracle, once;
#   3. each CUDA kernel's bytes/s against a device-to-device copy (goal >= 0.8);
#   4. the NCCL_NET plugin's ABI test, and the NCCL front door's load test against the wheel's NCCL;
#   5. a 2-rank torch NCCL job on the one GPU through NET/onebit with the NCCL preload: tagged
#      results against the float64 reference, untagged exact, NaN and re-tag behaviour;
#   6. DDP + Adam vs DDP + onebit.ddp_comm_hook + OnebitAdam on a ~100 M parameter model: median
#      step time, wire bytes — over loopback, then over an emulated link (--link, default 10gbit)
#      when this machine allows network namespaces.
# Every step has a timeout inside the whole budget (default 470 s). Logs and summary.md land in
# --out as 8 small files. Exit 0 when nothing failed (skips are not failures, and say why).
set -uo pipefail
cd "$(dirname "$0")/.."

out="" gtest_source="${ONEBIT_GTEST_SOURCE_DIR:-}" nccl_home="${NCCL_HOME:-}" arch=90 build=build/gpu
link=10gbit budget=470 build_only=0 python=${PYTHON:-python3}
usage() { sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=$2; shift 2 ;;
    --gtest-source) gtest_source=$2; shift 2 ;;
    --nccl-home) nccl_home=$2; shift 2 ;;
    --arch) arch=$2; shift 2 ;;
    --build-dir) build=$2; shift 2 ;;
    --link) link=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --build-only) build_only=1; shift ;;
    -h|--help) usage ;;
    *) echo "gpu-check: unknown argument '$1'" >&2; usage ;;
  esac
done
[ -n "$out" ] || { echo "gpu-check: --out DIR is required" >&2; usage; }
mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd)
summary=$out/summary.md
deadline=$((SECONDS + budget))
failed=0
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }

# run_step NAME MAX_SECONDS LOG COMMAND...: runs COMMAND under the smaller of MAX_SECONDS and what
# is left of the budget, appending to LOG; sets step_rc (124: timed out, 125: no time left).
run_step() {
  local name=$1 max=$2 log=$out/$3
  shift 3
  local left=$((deadline - SECONDS - 5))
  [ "$left" -lt "$max" ] && max=$left
  if [ "$max" -lt 10 ]; then
    step_rc=125
    echo "== $name: not run, the budget is spent" >>"$log"
    return
  fi
  local start=$SECONDS
  echo "== $name (timeout ${max}s): $*" >>"$log"
  timeout --kill-after=10 "$max" "$@" >>"$log" 2>&1
  step_rc=$?
  echo "== $name: exit $step_rc after $((SECONDS - start))s" >>"$log"
}

# verdict LABEL: one summary line from step_rc (0 pass, 77 skipped, else FAIL).
verdict() {
  case $step_rc in
    0) note "| $1 | pass |" ;;
    77) note "| $1 | skipped: $2 |" ;;
    124|137) note "| $1 | FAIL: timed out |"; failed=1 ;;
    125) note "| $1 | not run: budget spent |"; failed=1 ;;
    *) note "| $1 | FAIL (exit $step_rc, see its log) |"; failed=1 ;;
  esac
}

note "# tools/gpu-check.sh, $(date -u +%Y-%m-%dT%H:%MZ)"
note ""
note '```'
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$summary"
else
  note "nvidia-smi: not found"
fi
"$python" -c "import torch, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available(), 'nccl', '.'.join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else '-'); print('python', sys.version.split()[0])" 2>&1 | tee -a "$summary"
{ command -v nvcc >/dev/null && nvcc --version | tail -1; } | tee -a "$summary"
note '```'
note ""

# NCCL: the wheel torch loads (site-packages/nvidia/nccl/{include/nccl.h,lib/libnccl.so.2}).
if [ -z "$nccl_home" ]; then
  nccl_home=$("$python" - <<'EOF' 2>/dev/null
import glob, os
import torch
site = os.path.dirname(os.path.dirname(torch.__file__))
for candidate in sorted(glob.glob(os.path.join(site, "nvidia", "nccl*"))) + sorted(glob.glob(os.path.join(site, "nvidia", "*", "nccl"))):
    if os.path.exists(os.path.join(candidate, "include", "nccl.h")) and glob.glob(os.path.join(candidate, "lib", "libnccl.so*")):
        print(candidate)
        break
EOF
)
fi
nccl_args=()
nccl_lib=""
if [ -n "$nccl_home" ]; then
  nccl_lib=$(ls "$nccl_home"/lib/libnccl.so* 2>/dev/null | head -1)
  nccl_args=(-DNCCL_HOME="$nccl_home" -DNCCL_INCLUDE_DIR="$nccl_home/include" -DNCCL_LIBRARY="$nccl_lib")
  note "NCCL: $nccl_home ($(grep -m1 -E '#define NCCL_(MAJOR|VERSION_CODE)' "$nccl_home/include/nccl.h" | tr -s ' '); library $nccl_lib)"
else
  note "NCCL: no nvidia-nccl wheel found next to torch; CMake searches NCCL_HOME and /usr/local/cuda"
fi

# GoogleTest: installed, or a source tree.
gtest_args=()
if [ -z "$gtest_source" ] && [ ! -e /usr/include/gtest/gtest.h ]; then
  for candidate in .deps/googletest /usr/src/googletest; do
    [ -f "$candidate/CMakeLists.txt" ] && { gtest_source=$candidate; break; }
  done
fi
if [ -n "$gtest_source" ]; then
  gtest_source=$(cd "$gtest_source" && pwd)
  gtest_args=(-DONEBIT_GTEST_SOURCE_DIR="$gtest_source" -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON)
  note "GoogleTest: built from $gtest_source"
else
  note "GoogleTest: the installed one"
fi
note "CUDA architectures: $arch (CMAKE_CUDA_ARCHITECTURES; '90' = sm_90 machine code + compute_90 PTX)"
note ""
note "| step | result |"
note "| --- | --- |"

targets=(onebit_cuda_tests onebit-cuda-bench nccl-net-onebit onebit_nccl_net_tests onebit-nccl-preload nccl_preload_check)
run_step "configure" 120 build.log cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DONEBIT_WITH_CUDA=ON -DONEBIT_WITH_NCCL=ON -DONEBIT_WITH_GLOO=OFF -DONEBIT_WITH_IBVERBS=OFF \
  -DONEBIT_BUILD_BENCHMARKS=OFF -DCMAKE_DISABLE_FIND_PACKAGE_benchmark=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" "${nccl_args[@]}" "${gtest_args[@]}"
if [ "$step_rc" -eq 0 ]; then
  run_step "build" 300 build.log cmake --build "$build" -j "$(nproc)" --target "${targets[@]}"
fi
verdict "configure and build (${targets[*]})"
if [ "$step_rc" -ne 0 ]; then
  note ""; note "build failed: the last lines of build.log:"; tail -20 "$out/build.log" | tee -a "$summary"
  exit 1
fi
cuobjdump=$(command -v cuobjdump || echo "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")/cuobjdump")
if [ -x "$cuobjdump" ]; then
  library=$build/libonebit-nccl-preload.so
  note "| device code in libonebit-nccl-preload.so | $("$cuobjdump" --list-elf "$library" 2>/dev/null | grep -o 'sm_[0-9]*' | sort -u | tr '\n' ' ')$("$cuobjdump" --list-ptx "$library" 2>/dev/null | grep -o 'compute_[0-9]*' | sort -u | tr '\n' ' ') |"
else
  note "| device code | not listed: no cuobjdump in this toolkit |"
fi
[ "$build_only" -eq 1 ] && { note ""; note "--build-only: stopped after the build"; exit "$failed"; }

# 2. Kernel tests, once; a skip (no device) is reported as such.
run_step "CUDA kernel tests" 120 kernel-tests.log "$build/tests/onebit_cuda_tests"
[ "$step_rc" -eq 0 ] && grep -q '\[  SKIPPED \]' "$out/kernel-tests.log" && step_rc=77
verdict "CUDA kernels vs the scalar oracle" "no CUDA device (see kernel-tests.log)"

# 3. Kernels vs a device-to-device copy.
run_step "CUDA kernel bench" 90 kernel-bench.log "$build/tools/onebit-cuda-bench"
verdict "CUDA kernels vs D2D copy (kernel-bench.log)" "no CUDA device"
[ "$step_rc" -eq 0 ] && grep -E 'ratio|copy|worker|server|unpack' "$out/kernel-bench.log" | sed 's/^/    /' >>"$summary"

# 4. The NCCL_NET plugin's ABI, and the front door loading against the wheel's NCCL.
run_step "NCCL_NET plugin ABI test" 120 net-abi.log "$build/tests/onebit_nccl_net_tests" --gtest_brief=1
verdict "NCCL_NET plugin ABI, two processes"
if [ -n "$nccl_lib" ]; then
  run_step "NCCL preload against the wheel's NCCL" 30 preload.log \
    env LD_PRELOAD="$PWD/$build/libonebit-nccl-preload.so" "$build/tests/nccl_preload_check" "$nccl_lib"
  verdict "NCCL front door loads, forwards, defers (wheel's libnccl.so.2)"
fi

# 5. and 6. need torch with CUDA.
if "$python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  run_step "torch NCCL job through NET/onebit" 240 nccl-job.log "$python" tools/gpu/nccl_job_check.py "$build"
  verdict "torch NCCL job: NET/onebit + ncclAllReduce preload (nccl-job.log)"
  run_step "DDP step time, loopback" 180 ddp-step.log "$python" tools/gpu/ddp_step_check.py "$build"
  verdict "DDP Adam vs OnebitAdam, loopback (ddp-step.log)"
  grep -A4 '^ddp step check' "$out/ddp-step.log" | sed 's/^/    /' >>"$summary"
  if [ "$link" != none ]; then
    if [ "$(id -u)" -eq 0 ] && command -v ip >/dev/null && command -v tc >/dev/null && ip netns add onebit-gpu-probe 2>/dev/null; then
      ip netns del onebit-gpu-probe
      run_step "DDP step time, emulated $link" 180 ddp-step.log "$python" tools/gpu/ddp_step_check.py "$build" --link "$link"
      verdict "DDP Adam vs OnebitAdam, emulated $link (ddp-step.log)"
      grep -A4 "^ddp step check (emulated" "$out/ddp-step.log" | sed 's/^/    /' >>"$summary"
    else
      step_rc=77
      verdict "DDP Adam vs OnebitAdam, emulated $link" "needs root, ip and tc, and network namespaces here"
    fi
  fi
else
  step_rc=77
  verdict "torch NCCL job and DDP step time" "$python has no torch with CUDA"
fi

note ""
note "total $((SECONDS))s of a ${budget}s budget; logs in $out"
exit "$failed"
