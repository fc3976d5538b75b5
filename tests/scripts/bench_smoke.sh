#!/bin/sh
# bench_smoke.sh ONEBIT_BENCH PLOT_SCRIPT: three local ranks, every algorithm (and the compressed one
# over Gloo's pairs; then 2 x 2 ranks, flat and hierarchical), every result checked (#wrong must be 0, which the bench's exit code says), then
# the plot drawn from its JSON.
set -eu
bench=$1 plot=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$bench" --ranks 3 -b 4K -e 1M -f 16 -n 1 -w 1 -c 1 --algo all,compressed-gloo --json "$dir/rows.jsonl" --csv "$dir/rows.csv" | tee "$dir/out.txt"
# nccl-tests' table: its columns in its order (the algorithm after #wrong), its footer lines.
grep -Eq "^# +size +count +type +redop +root +time +algbw +busbw +#wrong +algo " "$dir/out.txt"
grep -Eq "^ +4096 +1024 +float +avg +-1 +[0-9.]+ +[0-9.]+ +[0-9.]+ +0 +compressed " "$dir/out.txt"
grep -q "^# Out of bounds values : 0 OK$" "$dir/out.txt"
# What the kernel times depend on, in the header: the SIMD set that ran and the CPUs the ranks share.
grep -Eq "^# kernels: (scalar|avx2|avx512) \(ONEBIT_SIMD chooses\) on [^;]+; this rank may run on [0-9]+ CPU" "$dir/out.txt"
# The compressed rows warm up until a call's time settles, and say how many calls that took.
grep -Eq "^#   compressed stages on rank 0 .*; after [0-9]+ warm-up call\(s\)" "$dir/out.txt"
grep -Eq "^#   compressed warm-up calls \(us\):( [0-9]+){2,}$" "$dir/out.txt"
# ONEBIT_SIMD=scalar is what the header then names.
ONEBIT_SIMD=scalar "$bench" --ranks 2 -b 4K -e 4K -n 1 --algo compressed | grep -q "^# kernels: scalar "
grep -Eq "^# Avg bus bandwidth    : [0-9.e+-]+  \(compressed\)$" "$dir/out.txt"
grep -Eq "^# Avg bus bandwidth    : [0-9.e+-]+  \(gloo\)$" "$dir/out.txt"
grep -Eq "^# Avg bus bandwidth    : [0-9.e+-]+  \(compressed-gloo\)$" "$dir/out.txt"
# 2 "hosts" of 2 ranks: flat and hierarchical side by side, each checked against its reference.
"$bench" --ranks 4 --local-size 2 -b 64K -e 1M -f 16 -n 1 -c 1 --algo compressed,hierarchical | tee "$dir/hier.txt"
grep -Eq "^# onebit-bench: 4 ranks \(2 per host\)" "$dir/hier.txt"
grep -Eq "^ +1048576 +262144 +float +avg +-1 +[0-9.]+ +[0-9.]+ +[0-9.]+ +0 +hierarchical " "$dir/hier.txt"
grep -Eq "^# At 1048576 bytes: hierarchical time / compressed time = [0-9.]+;" "$dir/hier.txt"
# Without ranks per host the hierarchical algorithm is refused, by name.
if "$bench" --ranks 2 -b 4K -e 4K -n 1 --algo hierarchical 2> "$dir/refused.txt"; then
  echo "FAIL: --algo hierarchical ran without ranks per host"; exit 1
fi
grep -q "needs several ranks per host" "$dir/refused.txt"
rows=$(wc -l < "$dir/rows.jsonl")
[ "$rows" -eq 12 ] || { echo "FAIL: expected 12 JSON rows (3 sizes x 4 algorithms), got $rows"; exit 1; }
csv_lines=$(wc -l < "$dir/rows.csv")
[ "$csv_lines" -eq 13 ] || { echo "FAIL: expected a CSV header and 12 rows, got $csv_lines lines"; exit 1; }
/usr/bin/python3 "$plot" "$dir/rows.jsonl" "$dir/plot.png"
[ -s "$dir/plot.png" ] || { echo "FAIL: no plot"; exit 1; }
echo "OK: bench ran, checked every result, and plotted"
