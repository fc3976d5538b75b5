#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine: installs what is missing (Debian packages,
# and a venv with PyPI's torch: tools/pip-torch.sh), then builds and
# runs ctest in each preset — release (everything), asan (everything under AddressSanitizer +
# UndefinedBehaviorSanitizer), tsan (the multi-threaded and multi-process engine tests and the soak
# under ThreadSanitizer) and fuzz (each libFuzzer target for 30 s, clang), each in its own build
# tree. Name presets to run fewer: tools/test.sh release
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
presets=("$@")
[ ${#presets[@]} -gt 0 ] || presets=(release asan tsan fuzz)
# PyTorch from PyPI for the release tree's tests against pip's torch (reused once made; without
# PyPI those tests skip, saying so).
if [[ " ${presets[*]} " == *" release "* ]]; then
  tools/pip-torch.sh || echo "tools/test.sh: continuing without pip's torch"
fi
for preset in "${presets[@]}"; do
  echo "=== tests: $preset ==="
  tools/build.sh "$preset"
  ctest --preset "$preset" -j "$(nproc)"
done
