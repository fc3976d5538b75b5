#!/usr/bin/env bash
# A venv with the current PyTorch from PyPI, made the way docs/usage/pytorch.md tells a user to make one
# (python3 -m venv; pip install torch ./python; and safetensors), for the end-to-end tests that run
# against pip's torch as well as Debian's. Reused while it imports (it is 5 GB: torch and its CUDA wheels); the
# first run needs PyPI and a few minutes. Exit 77 with a message when PyPI cannot be reached, so
# the tests that need it skip with that message instead of failing.
#   tools/pip-torch.sh            # ONEBIT_PIP_TORCH_VENV, default /var/cache/onebit/pip-torch
set -uo pipefail
cd "$(dirname "$0")/.."
venv=${ONEBIT_PIP_TORCH_VENV:-/var/cache/onebit/pip-torch}
if ! "$venv/bin/python" -W ignore -c "import torch, numpy, matplotlib" 2>/dev/null; then
  echo "tools/pip-torch.sh: making $venv with PyPI's torch (a few minutes, about 5 GB)"
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  if ! /usr/bin/python3 -m venv "$venv" || ! timeout 2400 "$venv/bin/pip" install -q --disable-pip-version-check torch numpy matplotlib; then
    rm -rf "$venv"
    echo "tools/pip-torch.sh: SKIP: could not install torch from PyPI into $venv (no network, or no wheel for this" \
         "Python); the tests against pip's torch will skip" >&2
    exit 77
  fi
fi
# safetensors: parameter_moves_check.py saves tied weights with it (a venv made before it was
# needed gains it here; without PyPI that one case skips, saying so).
"$venv/bin/python" -W ignore -c "import safetensors" 2>/dev/null ||
  "$venv/bin/pip" install -q --disable-pip-version-check safetensors ||
  echo "tools/pip-torch.sh: could not install safetensors; its check will skip" >&2
# The trainers trainers_check.py runs onebit inside, at the versions it was written against (a venv
# made before gains them here; without PyPI their cases skip, saying so).
"$venv/bin/python" -W ignore -c "import transformers, accelerate, lightning" 2>/dev/null ||
  "$venv/bin/pip" install -q --disable-pip-version-check transformers==5.25.0 accelerate==1.16.0 lightning==2.6.6 ||
  echo "tools/pip-torch.sh: could not install transformers, accelerate and lightning; their checks will skip" >&2
# The wheel's build backend and auditwheel: packaging.wheel_installed builds the wheel with this
# venv's Python (pip wheel --no-build-isolation) and records `auditwheel show` (without PyPI it skips).
"$venv/bin/python" -W ignore -c "import scikit_build_core, auditwheel" 2>/dev/null ||
  "$venv/bin/pip" install -q --disable-pip-version-check scikit-build-core auditwheel ||
  echo "tools/pip-torch.sh: could not install scikit-build-core and auditwheel; the wheel's check will skip" >&2
# expecttest: torch.testing._internal imports it, and tests/python/c10d_suite.py runs PyTorch's own
# distributed suite from there (without PyPI python.c10d_suite_pip skips, saying so).
"$venv/bin/python" -W ignore -c "import expecttest" 2>/dev/null ||
  "$venv/bin/pip" install -q --disable-pip-version-check expecttest ||
  echo "tools/pip-torch.sh: could not install expecttest; PyTorch's distributed suite will skip" >&2
# The pure-Python shim of python/ (the tests here load the build tree's libraries through
# ONEBIT_LIBRARY); the wheel of the repository root is tested in a venv of its own.
"$venv/bin/pip" install -q --disable-pip-version-check --no-deps --no-build-isolation ./python >/dev/null || exit 1
echo "tools/pip-torch.sh: $("$venv/bin/python" -W ignore -c 'import torch; print("torch", torch.__version__)') in $venv"
