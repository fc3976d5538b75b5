#!/bin/sh
# check_exports.sh LIBRARY PREFIX: every dynamic symbol LIBRARY defines starts with PREFIX, and there
# is at least one.
set -eu
lib=$1 prefix=$2
symbols=$(nm -D --defined-only "$lib" | awk '{print $3}' | sort)
[ -n "$symbols" ] || { echo "FAIL: $lib exports nothing"; exit 1; }
stray=$(printf '%s\n' "$symbols" | grep -v "^$prefix" || true)
if [ -n "$stray" ]; then
  echo "FAIL: $lib exports symbols outside the ABI ($prefix*):"
  printf '%s\n' "$stray"
  exit 1
fi
printf 'OK: %s exports %s symbols, all %s*\n' "$lib" "$(printf '%s\n' "$symbols" | wc -l)" "$prefix"
