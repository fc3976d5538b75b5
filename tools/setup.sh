#!/usr/bin/env bash
# Installs what building and testing onebit needs on Debian 12 (as root), and nothing when it is all
# there already. Called by tools/main.sh and tools/test.sh; safe to run again.
set -euo pipefail

packages=(
  cmake ninja-build g++ make python3 binutils      # build, and the test scripts
  libgtest-dev libbenchmark-dev                    # tests and benchmarks
  clang libclang-rt-14-dev                         # libFuzzer targets (the fuzz preset)
  clang-format-14                                  # the format check (.clang-format)
  libgloo-dev                                      # Gloo: the benchmark's external anchor, the Gloo front door
  libibverbs-dev                                   # the verbs transport's header (libibverbs.so.1 is loaded at run time)
  iproute2                                         # network namespaces and tc for the Ethernet emulation
  python3-matplotlib                               # the benchmark's plot (Debian's /usr/bin/python3)
  python3-simgrid                                  # tools/scale's simulation (SimGrid 3.32; docs/scale.md)
  python3-torch python3-numpy python3-venv         # the PyTorch front door's end-to-end tests
  fortunes                                         # real English text for the convergence demo
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "tools/setup.sh: missing Debian packages: ${missing[*]}" >&2
  echo "Run as root (or: sudo apt-get install -y ${missing[*]})." >&2
  exit 1
fi
echo "tools/setup.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
