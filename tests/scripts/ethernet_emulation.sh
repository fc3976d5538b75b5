#!/bin/sh
# ethernet_emulation.sh DRIVER: as root, the emulation sets up namespaces, links and shaping, and
# removes all of it (the driver's --self-test); as anyone else, it refuses with a clear message.
set -u
driver=$1
if [ "$(id -u)" -ne 0 ]; then
  out=$("$driver" --self-test 2>&1); rc=$?
  echo "$out"
  [ "$rc" -eq 77 ] && case "$out" in *"needs root"*) exit 77 ;; esac  # skipped, and the message is right
  echo "FAIL: expected exit 77 and 'needs root' when not root"; exit 1
fi
before=$(ip netns list | grep -c onebit-eth- || true)
"$driver" --self-test || exit 1
after=$(ip netns list | grep -c onebit-eth- || true)
[ "$after" -le "$before" ] || { echo "FAIL: namespaces left behind"; ip netns list; exit 1; }
# Not root: the same driver refuses with a message that says why. nobody runs a copy in a
# directory of its own, from /: the checkout may live where nobody cannot read (a clone under
# /root, any 0700 directory), and that must not decide the outcome.
if command -v setpriv >/dev/null 2>&1; then
  copy=$(mktemp -d)
  trap 'rm -rf "$copy"' EXIT
  cp "$driver" "$copy/onebit-ethernet"
  chmod 755 "$copy" "$copy/onebit-ethernet"
  out=$(cd / && setpriv --reuid=65534 --regid=65534 --clear-groups "$copy/onebit-ethernet" --self-test 2>&1); rc=$?
  [ "$rc" -eq 77 ] || { echo "FAIL: as nobody, exit $rc: $out"; exit 1; }
  case "$out" in *"needs root"*) ;; *) echo "FAIL: as nobody: $out"; exit 1 ;; esac
fi
echo "OK: emulation set up, checked and removed; non-root refused"
