#!/bin/sh
# check_exports.sh LIBRARY PREFIX [SYMBOL...]: every dynamic symbol LIBRARY defines starts with
# PREFIX or is one of the SYMBOLs (mangled), and there is at least one.
set -eu
lib=$1 prefix=$2
shift 2
symbols=$(nm -D --defined-only "$lib" | awk '{print $3}' | sort)
[ -n "$symbols" ] || { echo "FAIL: $lib exports nothing"; exit 1; }
stray=$(printf '%s\n' "$symbols" | grep -v "^$prefix" || true)
for allowed in "$@"; do
  stray=$(printf '%s\n' "$stray" | grep -vx "$allowed" || true)
done
if [ -n "$stray" ]; then
  echo "FAIL: $lib exports symbols outside the ABI ($prefix*):"
  printf '%s\n' "$stray"
  exit 1
fi
printf 'OK: %s exports %s symbols, all %s*\n' "$lib" "$(printf '%s\n' "$symbols" | wc -l)" "$prefix"
