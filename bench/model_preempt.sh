#!/bin/sh
# model_preempt.sh — does a second compute thread still help when the other
# core is busy? Runs `mdl_tool bench` with 1 and 2 threads, interleaved,
# ROUNDS times, while a busy loop (started here, stopped by its pid) keeps
# one core occupied; prints decode and prefill tok/s per run and the ratio
# of the 2-thread median to the 1-thread median. The machine is shared:
# other sessions' load adds noise, so read the ratio of medians.
#
# usage: bench/model_preempt.sh [BUILD_DIR]   env: ROUNDS=5 GEN=32 PROMPT=32
#        TYPE=q8_0 BUSY=1 (0: no busy loop, for the quiet-core figure)
set -eu
BUILD=${1:-build}
TOOL=$BUILD/tools/mdl_tool
DIR=${MODEL_DIR:-/tmp/sluice-model-bench}
ROUNDS=${ROUNDS:-5}
GEN=${GEN:-32}
PROMPT=${PROMPT:-32}
TYPE=${TYPE:-q8_0}
BUSY=${BUSY:-1}
F="$DIR/qwen2.5-0.5b-shape-$TYPE.gguf"
[ -s "$F" ] || { echo "no $F: run bench/model_bench.sh first (it generates the files)" >&2; exit 1; }
spin=
cleanup() { [ -n "$spin" ] && kill "$spin" 2>/dev/null; true; }
trap cleanup EXIT INT TERM
if [ "$BUSY" = 1 ]; then
    sh -c 'while :; do :; done' &
    spin=$!
fi
echo "# $(date -u +%H:%MZ) load $(cut -d' ' -f1-3 /proc/loadavg), busy loop: $BUSY, $TYPE, $ROUNDS rounds"
out=$(mktemp)
i=0
while [ $i -lt "$ROUNDS" ]; do
    for th in 1 2; do
        line=$("$TOOL" bench --model "$F" --threads $th --prompt-tokens "$PROMPT" --gen "$GEN" 2>/dev/null)
        dec=$(echo "$line" | tr ' ' '\n' | sed -n 's/^decode_tps=//p')
        pre=$(echo "$line" | tr ' ' '\n' | sed -n 's/^prefill_tps=//p')
        echo "$th $dec $pre" >>"$out"
        echo "round $i threads $th decode_tps $dec prefill_tps $pre"
    done
    i=$((i + 1))
done
med() { # med THREADS COLUMN
    awk -v t="$1" -v c="$2" '$1 == t { print $c }' "$out" | sort -n |
        awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
d1=$(med 1 2); d2=$(med 2 2); p1=$(med 1 3); p2=$(med 2 3)
echo "median decode tok/s: 1 thread $d1, 2 threads $d2, ratio $(echo "$d2 $d1" | awk '{ printf "%.2f", $1 / $2 }')"
echo "median prefill tok/s: 1 thread $p1, 2 threads $p2, ratio $(echo "$p2 $p1" | awk '{ printf "%.2f", $1 / $2 }')"
rm -f "$out"
