#!/bin/sh
# bench_smoke.sh ONEBIT_BENCH PLOT_SCRIPT: three local ranks, every algorithm (and the compressed one
# over Gloo's pairs), every result checked (#wrong must be 0, which the bench's exit code says), then
# the plot drawn from its JSON.
set -eu
bench=$1 plot=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$bench" --ranks 3 -b 4K -e 1M -f 16 -n 1 -w 1 -c 1 --algo all,compressed-gloo --json "$dir/rows.jsonl" --csv "$dir/rows.csv" | tee "$dir/out.txt"
grep -q "^# Avg bus bandwidth (compressed)" "$dir/out.txt"
grep -q "^# Avg bus bandwidth (gloo)" "$dir/out.txt"
grep -q "^# Avg bus bandwidth (compressed-gloo)" "$dir/out.txt"
rows=$(wc -l < "$dir/rows.jsonl")
[ "$rows" -eq 12 ] || { echo "FAIL: expected 12 JSON rows (3 sizes x 4 algorithms), got $rows"; exit 1; }
csv_lines=$(wc -l < "$dir/rows.csv")
[ "$csv_lines" -eq 13 ] || { echo "FAIL: expected a CSV header and 12 rows, got $csv_lines lines"; exit 1; }
/usr/bin/python3 "$plot" "$dir/rows.jsonl" "$dir/plot.png"
[ -s "$dir/plot.png" ] || { echo "FAIL: no plot"; exit 1; }
echo "OK: bench ran, checked every result, and plotted"
