#!/bin/sh
# with_pip_torch.sh SCRIPT ARGS...: runs a Python script with the pip-torch venv's python
# (tools/pip-torch.sh), or skips (exit 77) saying why when there is none.
venv=${ONEBIT_PIP_TORCH_VENV:-/var/cache/onebit/pip-torch}
if ! "$venv/bin/python" -W ignore -c "import torch" 2>/dev/null; then
  echo "SKIP: no venv with PyPI's torch at $venv (tools/pip-torch.sh makes it; it needs PyPI)"
  exit 77
fi
exec "$venv/bin/python" -W ignore "$@"
