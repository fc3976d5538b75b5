#!/bin/sh
# usage_pip_torch.sh SOURCE_DIR BUILD_DIR: docs/usage/pytorch.md's "PyTorch from pip" script, copied out of
# the page and run as the page says (torchrun, 2 ranks) with the pip-torch venv (tools/pip-torch.sh,
# made by the page's own `python3 -m venv` + `pip install torch ./python`). Skips (77) without it.
set -u
source_dir=$1 build=$2
venv=${ONEBIT_PIP_TORCH_VENV:-/var/cache/onebit/pip-torch}
[ -x "$venv/bin/torchrun" ] || { echo "SKIP: no venv with PyPI's torch at $venv (tools/pip-torch.sh makes it)"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# The heredoc between "cat > train.py <<'PY'" and "PY" in the page.
sed -n "/^cat > train.py <<'PY'$/,/^PY$/p" "$source_dir/docs/usage/pytorch.md" | sed '1d;$d' > "$dir/train.py"
[ -s "$dir/train.py" ] || { echo "FAIL: no train.py script in docs/usage/pytorch.md"; exit 1; }
cd "$dir" || exit 1
out=$(ONEBIT_LIBRARY=$build/libonebit.so timeout 300 "$venv/bin/torchrun" --nproc-per-node 2 --master-port 29533 train.py 2>&1)
rc=$?
echo "$out" | grep -v Warning
[ "$rc" -eq 0 ] || { echo "FAIL: torchrun exited $rc"; exit 1; }
# The two ranks print to one pipe; torchrun leaves stdout unbuffered, so print()'s text and its
# newline are separate writes and one rank's line can land inside the other's: match the reports,
# not lines.
reports=$(echo "$out" | grep -o 'rank [01]: loss [0-9.]*, [0-9]* compressed calls')
[ "$(echo "$reports" | grep -c .)" -eq 2 ] || { echo "FAIL: want both ranks' reports"; exit 1; }
echo "$reports" | grep -qv ' 20 compressed calls' && { echo "FAIL: want 20 compressed calls per rank"; exit 1; }
echo "OK: docs/usage/pytorch.md's pip-torch script ran as written: 2 ranks, 20 compressed calls each"
