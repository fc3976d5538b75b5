#!/bin/sh
# venv_install.sh SOURCE_DIR WORK_DIR: the PyTorch shim installs with pip into a venv that sees
# Debian's torch (docs/usage/pytorch.md), imports from there, and says how to load onebit when it is not.
set -eu
src=$1 work=$2
rm -rf "$work/venv" "$work/shim"
/usr/bin/python3 -m venv --system-site-packages "$work/venv"
cp -r "$src/python" "$work/shim"   # pip builds in place; keep the source tree clean
# A build/ left by an earlier setuptools build in the checkout would be copied with newer times
# than the sources and installed instead of them.
rm -rf "$work/shim/build" "$work/shim/onebit.egg-info"
"$work/venv/bin/pip" install --no-build-isolation --no-deps --quiet "$work/shim"
cd "$work"
"$work/venv/bin/python" - <<'PY'
import os, warnings
import onebit, onebit.onebit_adam
assert onebit.__file__.startswith("%s" % __import__("sys").prefix), onebit.__file__
try:
    onebit.stats()
except onebit.OnebitNotLoaded as error:
    assert "LD_PRELOAD=" in str(error), error
else:
    raise AssertionError("stats() without the preload must raise OnebitNotLoaded")
assert onebit.OnebitAdam is onebit.onebit_adam.OnebitAdam
assert os.path.isfile(os.path.join(os.path.dirname(onebit.__file__), "py.typed")), "py.typed not installed (PEP 561)"
with warnings.catch_warnings(record=True) as said:  # 0.2's module name: an alias that says it is deprecated
    warnings.simplefilter("always")
    import onebit.optim
assert onebit.optim.OnebitAdam is onebit.OnebitAdam and onebit.optim.ddp_comm_hook is onebit.ddp_comm_hook
assert any(issubclass(w.category, DeprecationWarning) for w in said), said
print("OK: pip-installed shim imports in a --system-site-packages venv and explains the missing preload")
PY
