#!/bin/sh
# model_peer.sh — sluice's engine against llama.cpp (node-llama-cpp's
# prebuilt library; installed by npm into PEER_DIR on first use, bench only,
# never CI) on the same 0.5B-shaped GGUF files: prefill tok/s of a
# PROMPT-token prompt and greedy decode tok/s, THREADS threads, rounds
# interleaved (sluice, peer, sluice, peer ...); prints each run and the
# median of the per-round ratios sluice / llama.cpp. The machine is shared:
# read the ratios, not the absolute rates.
#
# usage: bench/model_peer.sh [BUILD_DIR]
# env:   ROUNDS=3 PROMPT=256 GEN=32 THREADS=1 TYPES="q8_0 q4_0"
#        PEER_DIR=/tmp/sluice-llama-peer MODEL_DIR=/tmp/sluice-model-bench
set -eu
BUILD=${1:-build}
TOOL=$BUILD/tools/mdl_tool
HERE=$(cd "$(dirname "$0")" && pwd)
DIR=${MODEL_DIR:-/tmp/sluice-model-bench}
PEER=${PEER_DIR:-/tmp/sluice-llama-peer}
ROUNDS=${ROUNDS:-3}
PROMPT=${PROMPT:-256}
GEN=${GEN:-32}
THREADS=${THREADS:-1}
TYPES=${TYPES:-"q8_0 q4_0"}
if [ ! -d "$PEER/node_modules/node-llama-cpp" ]; then
    mkdir -p "$PEER"
    echo '{"name":"sluice-llama-peer","private":true,"type":"module"}' >"$PEER/package.json"
    (cd "$PEER" && npm install --no-audit --no-fund node-llama-cpp@3.22.1 >/dev/null)
fi
cp "$HERE/model_peer.mjs" "$PEER/"
field() { echo "$2" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
med() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo "# $(date -u +%Y-%m-%dT%H:%MZ) prompt $PROMPT, gen $GEN, $THREADS thread(s), load $(cut -d' ' -f1-3 /proc/loadavg)"
for t in $TYPES; do
    f="$DIR/qwen2.5-0.5b-shape-$t.gguf"
    [ -s "$f" ] || { echo "no $f: run bench/model_bench.sh first" >&2; exit 1; }
    r=$(mktemp)
    i=0
    while [ $i -lt "$ROUNDS" ]; do
        a=$("$TOOL" bench --model "$f" --threads "$THREADS" --prompt-tokens "$PROMPT" --gen "$GEN" 2>/dev/null)
        b=$(cd "$PEER" && node model_peer.mjs "$f" "$PROMPT" "$GEN" "$THREADS" 2>/dev/null | tail -1)
        ap=$(field prefill_tps "$a"); ad=$(field decode_tps "$a")
        bp=$(field prefill_tps "$b"); bd=$(field decode_tps "$b")
        echo "$t round $i: sluice prefill $ap decode $ad | llama.cpp prefill $bp decode $bd"
        echo "$ap $bp $ad $bd" | awk '{ printf "%.3f %.3f\n", $1 / $2, $3 / $4 }' >>"$r"
        i=$((i + 1))
    done
    echo "$t median ratio sluice/llama.cpp: prefill $(cut -d' ' -f1 "$r" | med)x, decode $(cut -d' ' -f2 "$r" | med)x"
    rm -f "$r"
done
