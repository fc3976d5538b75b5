#!/usr/bin/env bash
# The Python package's lint and type check: ruff and mypy, pinned, over python/onebit with the
# settings in python/pyproject.toml. Both must be clean. The tools live in a venv of their own
# (ONEBIT_LINT_VENV, default /var/cache/onebit/lint), made from PyPI on first use. Exit 77 (a skip
# for ctest) when it cannot be made (no registry).
#
#   tools/lint.sh
set -uo pipefail
cd "$(dirname "$0")/.."
venv=${ONEBIT_LINT_VENV:-/var/cache/onebit/lint}
ruff_version=0.17.6
mypy_version=2.4.1
if ! "$venv/bin/ruff" --version 2>/dev/null | grep -qx "ruff $ruff_version" ||
   ! "$venv/bin/mypy" --version 2>/dev/null | grep -q "^mypy $mypy_version "; then
  echo "tools/lint.sh: making $venv with ruff $ruff_version and mypy $mypy_version"
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  if ! /usr/bin/python3 -m venv "$venv" ||
     ! timeout 600 "$venv/bin/pip" install -q --disable-pip-version-check "ruff==$ruff_version" "mypy==$mypy_version"; then
    rm -rf "$venv"
    echo "tools/lint.sh: SKIP: could not install ruff and mypy from PyPI into $venv" >&2
    exit 77
  fi
fi
cd python
export RUFF_CACHE_DIR=$venv/cache/ruff MYPY_CACHE_DIR=$venv/cache/mypy  # nothing written into the checkout
status=0
"$venv/bin/ruff" check onebit || status=1
"$venv/bin/mypy" onebit || status=1
exit $status
