#!/bin/sh
# model_batch.sh — continuous batching and prefix reuse of the in-process
# engine, through its API (`mdl_tool serve` / `followup`), on the
# Qwen2.5-0.5B-shaped random-weight files of bench/model_bench.sh.
#
# Figures, each a ratio of runs made in the same round, rounds interleaved
# (ROUNDS of them; the machine is shared, so medians are printed):
#   - aggregate decode tok/s of 4 and of 8 concurrent streams vs 1 stream
#     (decode = tokens after the first, over the span from the first stream's
#     first token to the last stream's end);
#   - the same as tokens per CPU-second of the process (all tokens, over the
#     requests): what a step costs, which the wall clock hides when other
#     sessions hold the cores;
#   - decode alone per CPU-second: tokens after each stream's first over the
#     process CPU from the first stream's first token to the end (the
#     streams' prompts are prefilled together before any first token, so
#     the wall figure's window holds no prefill either; this one also leaves
#     out the host's share of the wall clock);
#   - time to first token of the 4th of 4 concurrent requests vs the 1st's;
#   - a follow-up turn's TTFT on a ~1,000-token conversation, with prefix
#     reuse (all slots taken by other conversations in between) vs without.
#
# usage: bench/model_batch.sh [BUILD_DIR]
# env:   ROUNDS=3 GEN=32 THREADS=1 TYPE=q8_0 (q4_0) MODEL_DIR=/tmp/sluice-model-bench
#        MAX_BATCH=8 (1: requests one after another, as before batching)
#        SLUICE_MDL_REPACK=0: without the repacked-weight GEMM (the older kernels)
set -eu
BUILD=${1:-build}
TOOL=$BUILD/tools/mdl_tool
DIR=${MODEL_DIR:-/tmp/sluice-model-bench}
ROUNDS=${ROUNDS:-3}
GEN=${GEN:-32}
THREADS=${THREADS:-1}
TYPE=${TYPE:-q8_0}
MAX_BATCH=${MAX_BATCH:-8}
F="$DIR/qwen2.5-0.5b-shape-$TYPE.gguf"
[ -s "$F" ] || { echo "no $F: run bench/model_bench.sh first (it generates the files)" >&2; exit 1; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT INT TERM

serve() { # serve STREAMS -> "agg_decode_tps ttft_first_ms ttft_last_ms tokens_per_cpu_s decode_tokens_per_cpu_s"
    "$TOOL" serve --model "$F" --streams "$1" --max-tokens "$GEN" --threads "$THREADS" \
        --max-batch "$MAX_BATCH" --temperature 0 | awk '
        /^stream=/ {
            for (i = 1; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
            n++; tok += f["completion_tokens"] - 1
            if (n == 1 || f["ttft_ms"] < t0) t0 = f["ttft_ms"]
            if (f["total_ms"] > t1) t1 = f["total_ms"]
            tt[f["stream"]] = f["ttft_ms"]
        }
        /^summary / {
            for (i = 1; i <= NF; i++) {
                split($i, kv, "=")
                if (kv[1] == "tokens_per_cpu_s") c = kv[2]
                if (kv[1] == "decode_tokens_per_cpu_s") d = kv[2]
            }
        }
        END { printf "%.3f %.1f %.1f %.2f %.2f\n", tok / ((t1 - t0) / 1000), tt[0], tt[n - 1], c, d }'
}

followup() { # followup EXTRA -> ttft of turn 2 in ms
    "$TOOL" followup --model "$F" --prompt-tokens 1000 --interleave 8 --max-batch "$MAX_BATCH" \
        --threads "$THREADS" --ctx 4096 "$@" | tr ' ' '\n' | sed -n 's/^turn2_ttft_ms=//p'
}

echo "# $(date -u +%Y-%m-%dT%H:%MZ) $TYPE, max_batch $MAX_BATCH, $THREADS thread(s), repack ${SLUICE_MDL_REPACK:-1}, load $(cut -d' ' -f1-3 /proc/loadavg), $ROUNDS rounds"
i=0
while [ $i -lt "$ROUNDS" ]; do
    s1=$(serve 1); s4=$(serve 4); s8=$(serve 8)
    if [ "${FOLLOWUP:-1}" = 1 ]; then
        fr=$(followup); fn=$(followup --no-reuse)
    else
        fr=1; fn=1 # FOLLOWUP=0: batching figures only (the follow-up ratio reads 1)
    fi
    echo "$s1 $s4 $s8 $fr $fn" >>"$out"
    echo "round $i: 1 stream [$s1]  4 streams [$s4]  8 streams [$s8]  follow-up TTFT ms reuse $fr / none $fn"
    i=$((i + 1))
done
# per-round ratios, then their medians
awk '{
    printf "%.3f %.3f %.3f %.4f %.3f %.3f %.3f %.3f\n", $6 / $1, $11 / $1, $8 / $7, $16 / $17, $9 / $4, $14 / $4,
        ($5 > 0 ? $10 / $5 : 0), ($5 > 0 ? $15 / $5 : 0)
}' "$out" >"$out.r"
med() {
    cut -d' ' -f"$1" "$out.r" | sort -n |
        awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
echo "median aggregate decode, 4 streams vs 1: $(med 1)x"
echo "median aggregate decode, 8 streams vs 1: $(med 2)x"
echo "median tokens per CPU-second, 4 streams vs 1: $(med 5)x, 8 streams vs 1: $(med 6)x"
echo "median decode tokens per CPU-second (first token to end), 4 streams vs 1: $(med 7)x, 8 streams vs 1: $(med 8)x"
echo "median TTFT of the 4th of 4 concurrent requests vs the 1st's: $(med 3)x"
echo "median follow-up TTFT with prefix reuse vs without (~1,000-token conversation): $(med 4)x"
rm -f "$out.r"
