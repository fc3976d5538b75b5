#!/bin/sh
# check_format.sh SOURCE_DIR [CLANG_FORMAT]: every C, C++ and CUDA source git tracks in SOURCE_DIR is
# as .clang-format says (clang-format 14: another version may format some lines differently).
# Exit 1 listing the files that are not, with the command that formats them.
set -eu
root=$1 tool=${2:-clang-format-14}
cd "$root"
files=$(git ls-files '*.h' '*.hpp' '*.cc' '*.cu' '*.cuh')
unformatted=""
for f in $files; do
  if ! "$tool" --dry-run --Werror "$f" >/dev/null 2>&1; then unformatted="$unformatted $f"; fi
done
if [ -n "$unformatted" ]; then
  echo "FAIL: not formatted:$unformatted"
  echo "Format them with: $tool -i$unformatted"
  exit 1
fi
echo "OK: $(echo "$files" | wc -w) files formatted as .clang-format says"
