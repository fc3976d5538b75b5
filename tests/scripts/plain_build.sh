#!/usr/bin/env bash
# The build as distribution packagers and most users type it — no preset, CMake's default generator
# (Unix Makefiles) — configures, and builds the targets Make alone could break: the ones made from
# custom commands' outputs (the CUDA stand-in's lowered sources, whose folder Make does not create)
# and the library. (The whole default build, serial as Make runs it, takes 4.5 minutes on 2 cores:
# checked by hand from a clean clone, not here.)
#   plain_build.sh SOURCE_DIR WORK_DIR
set -euo pipefail
source_dir=$1 work=$2
rm -rf "$work"
cmake -S "$source_dir" -B "$work" -G "Unix Makefiles" > "$work.configure.log" 2>&1 || { cat "$work.configure.log"; exit 1; }
cmake --build "$work" --target onebit_cuda_stand_in onebit -- -j"$(nproc)"
echo "OK: the default generator builds onebit_cuda_stand_in and onebit"
