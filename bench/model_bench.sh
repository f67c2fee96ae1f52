#!/bin/sh
# model_bench.sh — speed of the in-process model engine on random-weight
# files with the exact shapes of Qwen2.5-0.5B (hidden 896, 24 layers, 14/2
# heads, ffn 4864, vocab 151936; speed does not depend on the values), in
# Q8_0 (tied head, like the official q8_0 file) and Q4_0 (separate Q8_0
# head, like the official q4_0 file).
#
# For each file x threads (1, 2) x kernels (avx512, avx2, scalar): decode
# tokens/s (mean over GEN tokens, and the best window of 8 tokens, which
# shows the engine's speed when other processes leave it the core), prefill
# tokens/s of a PROMPT-token prompt, time to first token, and decode as a
# fraction of this machine's read bandwidth measured in the same run (bytes
# of weights per token / STREAM-style read rate, best of 5).
#
# usage: bench/model_bench.sh [BUILD_DIR]          (default: build)
# env:   MODEL_DIR  where the generated files go (default /tmp/sluice-model-bench;
#                   0.53 + 0.36 GB, kept between runs, never committed)
#        GEN=32 PROMPT=200 SCALAR_PROMPT=16 THREADS="1 2" KERNELS="avx512 avx2 scalar"
#        TYPES="q8_0 q4_0" (also q4_k_m: a Q4_K_M-like mix)
# Needs /usr/bin/python3 with python3-numpy (the generator).
set -eu
BUILD=${1:-build}
TOOL=$BUILD/tools/mdl_tool
DIR=${MODEL_DIR:-/tmp/sluice-model-bench}
GEN=${GEN:-32}
PROMPT=${PROMPT:-200}
SCALAR_PROMPT=${SCALAR_PROMPT:-16}
THREADS=${THREADS:-"1 2"}
KERNELS=${KERNELS:-"avx512 avx2 scalar"}
TYPES=${TYPES:-"q8_0 q4_0"}
HERE=$(cd "$(dirname "$0")/.." && pwd)

[ -x "$TOOL" ] || { echo "no $TOOL: make BUILD=$BUILD $TOOL" >&2; exit 1; }
mkdir -p "$DIR"
for t in $TYPES; do
    f="$DIR/qwen2.5-0.5b-shape-$t.gguf"
    [ -s "$f" ] && continue
    echo "generating $f ..." >&2
    case $t in
    q8_0) args="wtype='Q8_0'" ;;
    q4_0) args="wtype='Q4_0', untied=True, head_type='Q8_0'" ;;
    # what a Q4_K_M file of the 0.5B holds: mostly Q5_0 (896-wide rows are not
    # a multiple of 256), Q8_0 embeddings and attn_v, K-quant ffn_down
    q4_k_m) args="wtype='Q5_0', embd_type='Q8_0', mix={'ffn_down.weight': 'Q4_K', 'attn_v.weight': 'Q8_0'}" ;;
    *) echo "unknown type $t" >&2; exit 1 ;;
    esac
    (cd "$HERE/tests/model" && /usr/bin/python3 -c "
import gguf_writer as W
W.make_model('$f.tmp', $args, embd=896, layers=24, heads=14, kv_heads=2, ff=4864,
             vocab=151936, n_merges=50, ctx=32768, name='qwen2.5-0.5b-shape-$t')")
    mv "$f.tmp" "$f"
done

field() { # field NAME LINE
    echo "$2" | tr ' ' '\n' | sed -n "s/^$1=//p"
}

echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) vCPU, load $(cut -d' ' -f1-3 /proc/loadavg)"
# best of two measurements (before and after the runs would be better, but
# the table is printed as it goes): the machine may be shared
membw() {
    a=$(field read_GBps "$("$TOOL" membw --threads "$1" --mib 1024)")
    b=$(field read_GBps "$("$TOOL" membw --threads "$1" --mib 1024)")
    echo "$a $b" | awk '{ print ($1 > $2 ? $1 : $2) }'
}
bw1=$(membw 1)
bw2=$(membw 2)
echo "# read bandwidth (best of 20 passes over 1 GiB): $bw1 GB/s (1 thread), $bw2 GB/s (2 threads)"
echo
echo "| file | threads | kernels | decode tok/s (best 8) | ceiling tok/s | % of ceiling (best 8) | prefill tok/s (prompt) | TTFT ms |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
for t in $TYPES; do
    f="$DIR/qwen2.5-0.5b-shape-$t.gguf"
    for th in $THREADS; do
        bw=$bw1
        [ "$th" = 1 ] || bw=$bw2
        for k in $KERNELS; do
            p=$PROMPT
            [ "$k" = scalar ] && p=$SCALAR_PROMPT
            line=$("$TOOL" bench --model "$f" --threads "$th" --kernels "$k" \
                --prompt-tokens "$p" --gen "$GEN")
            dec=$(field decode_tps "$line")
            best=$(field decode_best8_tps "$line")
            pre=$(field prefill_tps "$line")
            ttft=$(field ttft_ms "$line")
            mb=$(field bytes_per_token "$line" | sed 's/MB$//')
            echo "$t $th $k $dec $pre $ttft $mb $bw $best" | awk '{
                ceil = $8 * 1000 / $7;
                printf "| %s | %s | %s | %.1f (%.1f) | %.1f | %.0f%% (%.0f%%) | %.1f (%s) | %.0f |\n",
                    $1, $2, $3, $4, $9, ceil, 100 * $4 / ceil, 100 * $9 / ceil, $5, "'"$p"'", $6 }'
        done
    done
done
