#!/bin/sh
# expect_failure.sh TEXT COMMAND...: COMMAND must exit non-zero and print TEXT (stdout or stderr).
set -u
text=$1
shift
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -eq 0 ]; then echo "FAIL: expected a non-zero exit"; exit 1; fi
case "$out" in
  *"$text"*) echo "OK: exit $rc with the expected message" ;;
  *) echo "FAIL: output lacks: $text"; exit 1 ;;
esac
