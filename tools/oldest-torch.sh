#!/bin/bash
# tools/oldest-torch.sh [TORCH_VERSION] [BUILD_DIR]: the onebit backend on the oldest torch onebit
# supports (default below), as docs/usage/pytorch.md ("Which torch") states it. Not part of the test
# command (a second torch is a few GB from PyPI and the comparison takes ~10 minutes on 2 cores);
# docs/benchmarks/torch-suites.md, "Older torch", records its last run.
#
# Makes /var/cache/onebit/torch-VERSION (a venv with that torch from PyPI, numpy and expecttest) once,
# then, with BUILD_DIR's libonebit.so (default build/release; built by tools/build.sh when absent):
#   1. tests/python/native_backend_check.py: the native backend covers every virtual of that torch's
#      c10d Backend.hpp, builds at first use, and a module prebuilt for that torch serves;
#   2. tests/python/backend_object_check.py native: gloo's calls, Work and groups, exact against a
#      plain gloo group of the same job;
#   3. tests/python/torch_backend_check.py at 2 and 3 ranks: tagged all_reduce against the float64
#      reference, DDP + OnebitAdam;
#   4. tests/python/c10d_suite.py --subset on gloo and on onebit, then --compare: every test of that
#      torch's own DistributedTest subset that passes on gloo passes on onebit (bar the tests that
#      assert the backend's name, and the monitored_barrier tests on a torch whose monitored_barrier
#      refuses every backend not named gloo — read from that torch's source, and said).
# Exit 0 when every step passed; each step's log is kept under build/oldest-torch-VERSION/.
set -uo pipefail
cd "$(dirname "$0")/.."
version=${1:-2.5.1}
build=${2:-build/release}
venv=/var/cache/onebit/torch-$version
logs=build/oldest-torch-$version
if ! "$venv/bin/python" -W ignore -c "import torch, numpy, expecttest" 2>/dev/null; then
  echo "tools/oldest-torch.sh: making $venv with PyPI's torch $version (a few minutes, a few GB)"
  rm -rf "$venv"
  /usr/bin/python3 -m venv "$venv" &&
    "$venv/bin/pip" install -q --disable-pip-version-check "torch==$version" numpy expecttest || {
      echo "tools/oldest-torch.sh: could not install torch $version from PyPI into $venv" >&2
      exit 1
    }
fi
[ -e "$build/libonebit.so" ] || tools/build.sh release || exit 1
mkdir -p "$logs"
export ONEBIT_PIP_TORCH_VENV=$venv
run=tests/scripts/with_pip_torch.sh
failed=0
step() {  # step NAME COMMAND...: runs it, its output in $logs/NAME.log, one line of verdict
  local name=$1
  shift
  if "$@" >"$logs/$name.log" 2>&1; then
    echo "PASS $name"
  else
    echo "FAIL $name (exit $?; $logs/$name.log):"
    tail -n 15 "$logs/$name.log" | sed 's/^/    /'
    failed=1
  fi
}
record() {  # record NAME COMMAND...: as step, but its exit code is no verdict (the suite's runs: --compare judges)
  local name=$1
  shift
  "$@" >"$logs/$name.log" 2>&1
  echo "ran  $name: $(tail -n 1 "$logs/$name.log")"
}
echo "torch $("$venv/bin/python" -W ignore -c 'import torch; print(torch.__version__)') from $venv, onebit from $build"
step native_backend "$run" tests/python/native_backend_check.py "$build"
step backend_object "$run" tests/python/backend_object_check.py "$build" native
step torch_backend "$run" tests/python/torch_backend_check.py "$build" 2 3
record suite_gloo "$run" tests/python/c10d_suite.py --subset --backend gloo --json "$logs/gloo.json"
record suite_onebit "$run" tests/python/c10d_suite.py --subset --backend onebit --build "$build" --json "$logs/onebit.json"
# What this torch refuses to every backend not named "gloo", before any call reaches a backend (read
# from its own source, so each torch is judged by what it does): excepted, and said.
refuses=()
c10d=$("$venv/bin/python" -W ignore -c "import torch.distributed.distributed_c10d as m; print(m.__file__)")
if grep -q "monitored_barrier is only implemented for GLOO backend" "$c10d"; then
  refuses=(--torch-refuses test_monitored_barrier_gloo,test_monitored_barrier_gloo_subgroup)
  echo "note: this torch's monitored_barrier refuses every backend not named gloo ($c10d): its tests are excepted"
fi
step suite_compare "$run" tests/python/c10d_suite.py --compare "$logs/gloo.json" "$logs/onebit.json" "${refuses[@]}"
grep -h "pass; onebit\|excepted\|passes on gloo, not" "$logs/suite_compare.log" 2>/dev/null
exit $failed
