#!/bin/sh
# check_env_doc.sh ONEBIT_INFO DOC: DOC contains, verbatim, the table `onebit-info --env-markdown`
# prints — so docs/env.md cannot drift from common/params.h.
set -eu
info=$1 doc=$2
table=$(mktemp)
trap 'rm -f "$table"' EXIT
"$info" --env-markdown > "$table"
if ! python3 - "$table" "$doc" <<'PY'
import sys
table = open(sys.argv[1]).read()
doc = open(sys.argv[2]).read()
sys.exit(0 if table in doc else 1)
PY
then
  echo "FAIL: $doc does not contain the current table. Regenerate it with:"
  echo "  $info --env-markdown"
  echo "--- expected table:"
  cat "$table"
  exit 1
fi
echo "OK: $doc matches common/params.h"
