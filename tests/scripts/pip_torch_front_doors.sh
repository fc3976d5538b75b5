#!/bin/sh
# pip_torch_front_doors.sh BUILD_DIR: the LD_PRELOAD front doors under PyPI's torch (tools/pip-torch.sh).
#   - libonebit-preload.so (built for the system libgloo.so.0) is refused with a message at
#     `import onebit` (nothing would be compressed), and a job that never imports onebit runs
#     untouched, with a WARN line, instead of crashing in torch's own bundled gloo;
#   - libonebit-nccl-preload.so loads into pip's torch, and against the nvidia-nccl wheel's own
#     libnccl.so.2 it forwards, defers and maps errors as tests/nccl_preload checks (no GPU needed);
#     onebit.tag of a CPU tensor there is refused (nothing under that door would compress it).
# Skips (77) without the venv.
set -u
build=$1
venv=${ONEBIT_PIP_TORCH_VENV:-/var/cache/onebit/pip-torch}
python=$venv/bin/python
if ! "$python" -W ignore -c "import torch" 2>/dev/null; then
  echo "SKIP: no venv with PyPI's torch at $venv (tools/pip-torch.sh makes it; it needs PyPI)"
  exit 77
fi
here=$(cd "$(dirname "$0")/../.." && pwd)
fail() { echo "FAIL: $*"; exit 1; }

out=$(LD_PRELOAD=$build/libonebit-preload.so PYTHONPATH=$here/python "$python" -W ignore -c "import torch, onebit" 2>&1)
rc=$?
[ "$rc" -ne 0 ] || fail "libonebit-preload.so under pip's torch: import onebit must refuse"
case "$out" in *"bundles its own gloo"*"onebit.register_backend()"*) ;; *) fail "the refusal lacks its reason: $out" ;; esac
echo "OK: libonebit-preload.so under pip's torch is refused at import, naming the backend to use"

# A job that never imports onebit: the preload must pass everything to the bundled gloo, not crash
# it (it once brought the system libgloo.so.0 into the global scope, whose symbols shadowed the
# bundled gloo's: init_process_group died with SIGSEGV or "double free").
store=$(mktemp -u)
job="
import sys, torch, torch.distributed as dist
rank = int(sys.argv[1])
dist.init_process_group('gloo', init_method='file://$store', rank=rank, world_size=2)
t = torch.full((1000,), float(rank + 1))
dist.all_reduce(t)
assert t.eq(3.0).all(), t[:3]
dist.destroy_process_group()
"
LD_PRELOAD=$build/libonebit-preload.so "$python" -W ignore -c "$job" 0 > "$store.0.log" 2>&1 & first=$!
LD_PRELOAD=$build/libonebit-preload.so "$python" -W ignore -c "$job" 1 > "$store.1.log" 2>&1; second=$?
wait $first; first=$?
if [ "$first" -ne 0 ] || [ "$second" -ne 0 ]; then
  cat "$store".*.log; rm -f "$store"*; fail "a gloo job of pip's torch under libonebit-preload.so exited $first and $second"
fi
grep -q "every allreduce goes to it untouched" "$store.0.log" || { cat "$store.0.log"; rm -f "$store"*; fail "no WARN saying so"; }
rm -f "$store"*
echo "OK: a gloo job of pip's torch under libonebit-preload.so (no import onebit) runs, untouched, and is told why"

if [ -f "$build/libonebit-nccl-preload.so" ] && [ -x "$build/tests/nccl_preload_check" ]; then
  nccl=$("$python" -W ignore -c "import glob, os, torch; print((glob.glob(os.path.join(os.path.dirname(os.path.dirname(torch.__file__)), 'nvidia', 'nccl', 'lib', 'libnccl.so*')) + [''])[0])")
  [ -n "$nccl" ] || fail "no nvidia-nccl wheel next to pip's torch"
  LD_PRELOAD=$build/libonebit-nccl-preload.so "$build/tests/nccl_preload_check" "$nccl" || fail "the NCCL front door against $nccl"
  out=$(LD_PRELOAD=$build/libonebit-nccl-preload.so PYTHONPATH=$here/python "$python" -W ignore -c "
import ctypes, torch, onebit
s = onebit.stats()
assert s['compressed_calls'] == 0 and s['forwarded_calls'] == 0, s
assert hasattr(ctypes.CDLL(None), 'ncclAllReduce')
# The wrong door for a CPU tensor: its all_reduce would go to gloo, so the tag is refused, naming why.
try:
    onebit.tag(torch.zeros(16), 'm')
    raise SystemExit('onebit.tag of a CPU tensor under the NCCL door succeeded, though nothing would compress it')
except ValueError as error:
    assert 'CUDA tensors only' in str(error) and 'onebit backend' in str(error), error
print('torch', torch.__version__, 'cuda available:', torch.cuda.is_available(), '; a CPU tag refused')
" 2>&1) || fail "libonebit-nccl-preload.so in pip's torch: $out"
  echo "$out"
  echo "OK: libonebit-nccl-preload.so loads into pip's torch and works against the wheel's NCCL ($nccl)"
fi
