#!/bin/sh
# scale_simulation.sh SOURCE_DIR ONEBIT_BENCH: the scale tools' small case (tools/scale,
# docs/scale.md). Needs SimGrid's Python bindings, pinned to Debian's python3-simgrid 3.32 (PyPI's
# simgrid 4.1 is a source package that builds all of SimGrid, far too slow for a test); installs it
# with apt-get when missing and root, else exits 77 (a skip for ctest), as does a failed install
# (no registry).
set -eu
src=$1 bench=$2
pin=3.32
have() { /usr/bin/python3 -c "import simgrid, sys; sys.exit(0 if simgrid.simgrid_version.startswith('$pin') else 1)" 2>/dev/null; }
if ! have; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "SKIP: SimGrid $pin's Python bindings are missing (apt-get install python3-simgrid) and this is not root"
    exit 77
  fi
  if ! DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -qq "python3-simgrid=$pin*" >/dev/null 2>&1; then
    if ! { timeout 300 apt-get update -qq >/dev/null 2>&1 &&
           DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -qq "python3-simgrid=$pin*" >/dev/null 2>&1; }; then
      echo "SKIP: could not install python3-simgrid $pin (no package registry?)"
      exit 77
    fi
  fi
  have || { echo "FAIL: python3-simgrid installed, but not version $pin"; exit 1; }
fi
exec /usr/bin/python3 "$src/tests/scripts/scale_simulation_check.py" "$src" "$bench"
