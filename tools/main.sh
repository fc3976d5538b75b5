#!/usr/bin/env bash
# onebit's main job on one machine. For now: the CPU kernel benchmark (each kernel's memory rate
# against memcpy, measured side by side); the Ethernet allreduce benchmark replaces it when it lands.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
tools/build.sh release
build/release/tools/onebit-info
build/release/tools/onebit-kernel-bench --benchmark_min_time=0.5 "$@"
