#!/usr/bin/env bash
# The GPU path, unattended, on a bare GPU machine: one that has the CUDA toolkit, CMake, ninja and a
# pip PyTorch with its nvidia-nccl wheel, and nothing installable (no apt, no pip, no network).
#
#   tools/gpu-check.sh --out DIR [--gtest-source DIR] [--no-gtest] [--nccl-home DIR] [--arch 90]
#                      [--build-dir DIR] [--link 10gbit|none] [--budget SECONDS] [--build-only]
#
#   1. build the GPU targets (Release, sm_90 by default; GoogleTest installed, or from --gtest-source,
#      .deps/googletest or /usr/src/googletest; with none of them, or --no-gtest, only the targets
#      that need no GoogleTest, and the GoogleTest steps are skipped, named in summary.md; no Google
#      Benchmark, no gloo; NCCL's header and libnccl.so.2 from the nvidia-nccl wheel torch loads);
#   2. the CUDA kernel tests against the scalar CPU oracle, once (GoogleTest);
#   3. each CUDA kernel's bytes/s on random data against a device-to-device copy, median of 7
#      repetitions, pass/fail against the 0.8 goal (quoted in summary.md);
#   4. the NCCL_NET plugin's ABI test (GoogleTest), and the NCCL front door's load test against the
#      wheel's NCCL;
#   5. a 2-rank torch NCCL job on the one GPU through NET/onebit with the NCCL preload: tagged
#      results against the float64 reference, untagged exact, NaN and re-tag behaviour;
#   6. DDP + Adam vs DDP + onebit.ddp_comm_hook + OnebitAdam: a ~25 M parameter model over loopback,
#      then a ~100 M one over an emulated link (--link, default 10gbit: netns + veth + bridge + tc
#      tbf, probed first) when this machine allows it and the budget has time; step times of both
#      ranks and the wire bytes the NET plugin measured (ONEBIT_NET_STATS_FILE).
# Every step has a timeout inside the whole budget (default 470 s), and every wait inside a step is
# shorter than the step's. A progress line per step on stdout. At most 8 files land in --out:
# summary.md, build.log, cuda.log, nccl.log, ddp.log and rank0.log / rank1.log (the python checks'
# ranks, unbuffered, so a hang leaves its last lines; summary.md quotes them on a timeout).
# Exit 0 when nothing failed (skips are not failures, and say why).
set -uo pipefail
cd "$(dirname "$0")/.."

out="" gtest_source="${ONEBIT_GTEST_SOURCE_DIR:-}" no_gtest=0 nccl_home="${NCCL_HOME:-}" arch=90 build=build/gpu
link=10gbit budget=470 build_only=0 python=${PYTHON:-python3}
usage() { sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=$2; shift 2 ;;
    --gtest-source) gtest_source=$2; shift 2 ;;
    --no-gtest) no_gtest=1; shift ;;
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
case $build in /*) ;; *) build=$PWD/$build ;; esac  # absolute: the steps below run from other folders too
summary=$out/summary.md
deadline=$((SECONDS + budget))
failed=0
skipped=()
timeouts=$(mktemp)
trap 'rm -f "$timeouts"' EXIT
: >"$summary"
: >"$out/rank0.log"
: >"$out/rank1.log"
# The checks read NCCL's log from their ranks' output: it must not go to a file.
unset NCCL_DEBUG_FILE
note() { echo "$*" | tee -a "$summary"; }
progress() { echo "[gpu-check $(date +%H:%M:%S)] $*"; }

# limit MAX: the smaller of MAX and what is left of the budget (less 5 s to write the summary).
limit() {
  local left=$((deadline - SECONDS - 5))
  if [ "$left" -lt "$1" ]; then echo "$left"; else echo "$1"; fi
}

# inner STEP_SECONDS: the time a python check's own waits may take inside a step of STEP_SECONDS.
inner() { echo $(($1 > 45 ? $1 - 25 : $1 * 2 / 3)); }

# run_step NAME MAX_SECONDS LOG COMMAND...: runs COMMAND under limit MAX_SECONDS, appending to LOG;
# sets step_rc (124: timed out, 125: no time left). A timed-out step's rank log tails go to summary.md,
# after the table (finish).
run_step() {
  local name=$1 max log=$out/$3
  max=$(limit "$2")
  shift 3
  if [ "$max" -lt 10 ]; then
    step_rc=125
    echo "== $name: not run, the budget is spent" >>"$log"
    progress "step $name: not run, the budget is spent"
    return
  fi
  local start=$SECONDS
  progress "step $name (timeout ${max}s, ${log##*/})"
  echo "== $name (timeout ${max}s): $*" >>"$log"
  timeout --kill-after=10 "$max" "$@" >>"$log" 2>&1
  step_rc=$?
  echo "== $name: exit $step_rc after $((SECONDS - start))s" >>"$log"
  progress "step $name: exit $step_rc after $((SECONDS - start))s"
  if [ "$step_rc" -eq 124 ] || [ "$step_rc" -eq 137 ]; then
    local rank
    for rank in 0 1; do
      [ -s "$out/rank$rank.log" ] || continue
      { echo ""; echo "$name timed out; the last 20 lines of rank$rank.log:"; echo '```'
        tail -20 "$out/rank$rank.log"; echo '```'; } >>"$timeouts"
    done
  fi
}

# verdict LABEL [SKIP_REASON]: one summary line from step_rc (0 pass, 77 skipped, else FAIL).
verdict() {
  case $step_rc in
    0) note "| $1 | pass |" ;;
    77) note "| $1 | skipped: $2 |"; skipped+=("$1: $2") ;;
    124|137) note "| $1 | FAIL: timed out |"; failed=1 ;;
    125) note "| $1 | not run: budget spent |"; failed=1 ;;
    *) note "| $1 | FAIL (exit $step_rc, see its log) |"; failed=1 ;;
  esac
}

# skip LABEL REASON: a step not run, and why.
skip() { step_rc=77; verdict "$1" "$2"; }

# probe_link: nothing when this machine can make tools/ethernet/onebit-ethernet's emulated link (a
# network namespace, a veth pair into it, a bridge, a tc tbf qdisc), else what is missing. Leaves
# nothing behind.
probe_link() {
  [ "$(id -u)" -eq 0 ] || { echo "not root"; return; }
  command -v ip >/dev/null || { echo "no ip (iproute2)"; return; }
  command -v tc >/dev/null || { echo "no tc (iproute2)"; return; }
  local ns=onebit-gpu-probe missing=""
  ip netns del "$ns" 2>/dev/null
  ip netns add "$ns" 2>/dev/null || { echo "no network namespaces (ip netns add failed)"; return; }
  if ! ip link add onebit-probe0 type veth peer name eth0 netns "$ns" 2>/dev/null; then
    missing="no veth pairs (ip link add type veth failed)"
  elif ! ip -n "$ns" link add br-probe type bridge 2>/dev/null; then
    missing="no bridges (ip link add type bridge failed)"
  elif ! tc -n "$ns" qdisc add dev eth0 root tbf rate 10gbit burst 1mb latency 10ms 2>/dev/null; then
    missing="no tc tbf qdisc (sch_tbf)"
  fi
  ip link del onebit-probe0 2>/dev/null
  ip netns del "$ns" 2>/dev/null
  echo "$missing"
}

progress "start: budget ${budget}s, out $out"
note "# tools/gpu-check.sh, $(date -u +%Y-%m-%dT%H:%MZ)"
note ""
note '```'
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,compute_mode,memory.total --format=csv 2>&1 | tee -a "$summary"
  note "nvidia-smi: $(nvidia-smi 2>/dev/null | grep -o 'CUDA Version: [0-9.]*' | head -1)"
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

# GoogleTest: installed, or a source tree; without either (or with --no-gtest) the targets that need none.
gtest_args=()
have_gtest=1 gtest_why=""
if [ "$no_gtest" -eq 1 ]; then
  have_gtest=0 gtest_why="--no-gtest"
elif [ -z "$gtest_source" ] && [ ! -e /usr/include/gtest/gtest.h ]; then
  for candidate in .deps/googletest /usr/src/googletest; do
    [ -f "$candidate/CMakeLists.txt" ] && { gtest_source=$candidate; break; }
  done
  [ -n "$gtest_source" ] ||
    have_gtest=0 gtest_why="none installed, no source tree in .deps/googletest, /usr/src/googletest or --gtest-source"
fi
if [ "$have_gtest" -eq 0 ]; then
  gtest_args=(-DONEBIT_TESTS_WITHOUT_GTEST=ON -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON)
  note "GoogleTest: not used ($gtest_why): the GoogleTest steps are skipped"
elif [ -n "$gtest_source" ]; then
  gtest_source=$(cd "$gtest_source" && pwd)
  gtest_args=(-DONEBIT_GTEST_SOURCE_DIR="$gtest_source" -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON -DONEBIT_TESTS_WITHOUT_GTEST=OFF)
  note "GoogleTest: built from $gtest_source"
else
  gtest_args=(-DONEBIT_TESTS_WITHOUT_GTEST=OFF)
  note "GoogleTest: the installed one"
fi
no_gtest_reason="no GoogleTest ($gtest_why)"
note "CUDA architectures: $arch (CMAKE_CUDA_ARCHITECTURES; '90' = sm_90 machine code + compute_90 PTX)"
note ""
note "| step | result |"
note "| --- | --- |"

finish() {
  if [ -s "$timeouts" ]; then
    cat "$timeouts" | tee -a "$summary"
  fi
  if [ "${#skipped[@]}" -gt 0 ]; then
    note ""
    note "Skipped steps:"
    local line
    for line in "${skipped[@]}"; do note "- $line"; done
  fi
  note ""
  note "total $((SECONDS))s of a ${budget}s budget; logs in $out"
  progress "done: exit $failed"
  exit "$failed"
}

# The targets every run needs first, then the GoogleTest ones as a step of their own: a GoogleTest
# that does not configure, or suites that do not build, cost their own steps (skipped, named),
# not the run.
targets=(onebit-cuda-bench nccl-net-onebit onebit-nccl-preload nccl_preload_check)
gtest_targets=(onebit_cuda_tests onebit_nccl_net_tests)
configure() {
  run_step "$1" 120 build.log cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DONEBIT_WITH_CUDA=ON -DONEBIT_WITH_NCCL=ON -DONEBIT_WITH_GLOO=OFF -DONEBIT_WITH_IBVERBS=OFF \
    -DONEBIT_BUILD_BENCHMARKS=OFF -DCMAKE_DISABLE_FIND_PACKAGE_benchmark=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" \
    "${nccl_args[@]}" "${gtest_args[@]}"
}
configure "configure"
# A configure that failed (not one that ran out of time) is tried once more without GoogleTest.
if [ "$have_gtest" -eq 1 ] && [ "$step_rc" -ne 0 ] && [ "$step_rc" -ne 124 ] && [ "$step_rc" -ne 125 ] &&
  [ "$step_rc" -ne 137 ]; then
  have_gtest=0 no_gtest_reason="the configure with GoogleTest failed (build.log)"
  gtest_args=(-DONEBIT_TESTS_WITHOUT_GTEST=ON -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON)
  note "Configure failed with GoogleTest (see build.log): configured again without it"
  configure "configure without GoogleTest"
fi
if [ "$step_rc" -eq 0 ]; then
  run_step "build" 300 build.log cmake --build "$build" -j "$(nproc)" --target "${targets[@]}"
fi
verdict "configure and build (${targets[*]})"
if [ "$step_rc" -ne 0 ]; then
  note ""; note "build failed: the last lines of build.log:"; tail -20 "$out/build.log" | tee -a "$summary"
  exit 1
fi
if [ "$have_gtest" -eq 1 ]; then
  run_step "build the GoogleTest suites" 240 build.log cmake --build "$build" -j "$(nproc)" --target "${gtest_targets[@]}"
  verdict "build (${gtest_targets[*]})"
  if [ "$step_rc" -ne 0 ]; then
    have_gtest=0 no_gtest_reason="the GoogleTest suites did not build (build.log)"
    tail -20 "$out/build.log" | tee -a "$summary"
  fi
fi
cuobjdump=$(command -v cuobjdump || echo "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")/cuobjdump")
if [ -x "$cuobjdump" ]; then
  library=$build/libonebit-nccl-preload.so
  note "| device code in libonebit-nccl-preload.so | $("$cuobjdump" --list-elf "$library" 2>/dev/null | grep -o 'sm_[0-9]*' | sort -u | tr '\n' ' ')$("$cuobjdump" --list-ptx "$library" 2>/dev/null | grep -o 'compute_[0-9]*' | sort -u | tr '\n' ' ') |"
else
  note "| device code | not listed: no cuobjdump in this toolkit |"
fi
if [ "$build_only" -eq 1 ]; then
  # What a full run would skip for want of GoogleTest, said here too.
  if [ "$have_gtest" -eq 0 ]; then
    skip "CUDA kernels vs the scalar oracle" "$no_gtest_reason"
    skip "NCCL_NET plugin ABI, two processes" "$no_gtest_reason"
  fi
  note ""; note "--build-only: stopped after the build"
  finish
fi

# 2. Kernel tests, once; a skip (no device) is reported as such.
if [ "$have_gtest" -eq 1 ]; then
  run_step "CUDA kernel tests" 60 cuda.log "$build/tests/onebit_cuda_tests"
  [ "$step_rc" -eq 0 ] && grep -q '\[  SKIPPED \]' "$out/cuda.log" && step_rc=77
  verdict "CUDA kernels vs the scalar oracle" "no CUDA device (see cuda.log)"
else
  skip "CUDA kernels vs the scalar oracle" "$no_gtest_reason"
fi

# 3. Kernels vs a device-to-device copy; the bench exits 3 when a kernel is under the 0.8 goal.
run_step "CUDA kernel bench" 60 cuda.log "$build/tools/onebit-cuda-bench"
bench_rc=$step_rc
if [ "$bench_rc" -eq 3 ]; then
  note "| CUDA kernels vs D2D copy (cuda.log) | FAIL: a kernel under 0.8 of the copy's bytes/s |"
  failed=1
else
  verdict "CUDA kernels vs D2D copy, goal >= 0.8 (cuda.log)" "no CUDA device"
fi
if [ "$bench_rc" -eq 0 ] || [ "$bench_rc" -eq 3 ]; then
  { echo '```'; grep -E '^# onebit-cuda-bench|goal' "$out/cuda.log"; echo '```'; } >>"$summary"
fi

# 4. The NCCL_NET plugin's ABI, and the front door loading against the wheel's NCCL.
if [ "$have_gtest" -eq 1 ]; then
  run_step "NCCL_NET plugin ABI test" 90 nccl.log "$build/tests/onebit_nccl_net_tests" --gtest_brief=1
  verdict "NCCL_NET plugin ABI, two processes"
else
  skip "NCCL_NET plugin ABI, two processes" "$no_gtest_reason"
fi
if [ -n "$nccl_lib" ]; then
  run_step "NCCL preload against the wheel's NCCL" 30 nccl.log \
    env LD_PRELOAD="$build/libonebit-nccl-preload.so" "$build/tests/nccl_preload_check" "$nccl_lib"
  verdict "NCCL front door loads, forwards, defers (wheel's libnccl.so.2)"
else
  skip "NCCL front door against the wheel's NCCL" "no nvidia-nccl wheel next to torch"
fi

# 5. and 6. need torch with CUDA. Each script's own waits end before its step's timeout (inner).
if "$python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  max=$(limit 120)
  run_step "torch NCCL job through NET/onebit" "$max" nccl.log "$python" -u tools/gpu/nccl_job_check.py "$build" \
    --logs "$out" --timeout "$(inner "$max")"
  verdict "torch NCCL job: NET/onebit + ncclAllReduce preload (nccl.log)"
  max=$(limit 120)
  run_step "DDP step time, ~25 M parameters, loopback" "$max" ddp.log "$python" -u tools/gpu/ddp_step_check.py "$build" \
    --width 1440 --layers 12 --logs "$out" --timeout "$(inner "$max")"
  verdict "DDP Adam vs OnebitAdam, ~25 M parameters, loopback (ddp.log)"
  grep -A12 '^ddp step check (loopback' "$out/ddp.log" | sed 's/^/    /' >>"$summary"
  label="DDP Adam vs OnebitAdam, ~100 M parameters, emulated $link"
  if [ "$link" = none ]; then
    skip "$label" "--link none"
  elif missing=$(probe_link) && [ -n "$missing" ]; then
    skip "$label" "the emulated link needs root, ip, tc, network namespaces, veth, a bridge and tbf: $missing"
  elif [ "$(limit 150)" -lt 90 ]; then
    skip "$label" "$(limit 150)s of the budget left, under the 90s it needs"
  else
    max=$(limit 150)
    run_step "DDP step time, ~100 M parameters, emulated $link" "$max" ddp.log "$python" -u tools/gpu/ddp_step_check.py \
      "$build" --link "$link" --logs "$out" --timeout "$(inner "$max")"
    verdict "$label (ddp.log)"
    grep -A12 "^ddp step check (emulated" "$out/ddp.log" | sed 's/^/    /' >>"$summary"
  fi
else
  skip "torch NCCL job and DDP step time" "$python has no torch with CUDA"
fi

finish
