#!/usr/bin/env bash
# bench/nonce_rss.sh — does a sluice process give the nonce store's memory
# back after a peak of signed requests (issue #21 item 5: RSS back within
# 1.2x of the pre-peak figure a minute after the peak's nonces expired)?
#
# One sluice per binary (this build and, optionally, NR_BASE_BIN, both in
# the same run, loaded at once), each with tokens + signatures, the
# in-process nonce store and a short signature window (NR_WINDOW, default
# 30s) so that a peak's nonces expire within a minute. Per binary:
#   pre-peak  RSS after a light signed warm-up (wrk -c1, 5 s) and a quiet
#             spell of a window and a bucket (its nonces expired)
#   peak      the highest RSS sampled during NR_PEAK_S (default 60) s of
#             wrk -c32 with fresh signatures
#   after     RSS NR_AFTER_S (default 60) s after the last peak nonce
#             expired (window + 8 s bucket + 2 s grace past the peak's end),
#             with no traffic at all (nothing but the gateway's tick)
# RSS is VmRSS from /proc. Ports from BENCH_PORT_BASE (default 22000).
# Wall-clock load: run it alone, it takes ~4 minutes.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SLUICE_BIN=${NR_BIN:-$ROOT/build/sluice}
NGINX_BIN=${NGINX_BIN:-$(command -v nginx || echo /usr/sbin/nginx)}
WINDOW=${NR_WINDOW:-30}
PEAK_S=${NR_PEAK_S:-60}
AFTER_S=${NR_AFTER_S:-60}
PORT_BASE=${BENCH_PORT_BASE:-22000}
UP_PORT=$((PORT_BASE + 1))

WORK=$(mktemp -d /tmp/sluice-noncerss.XXXXXX)
. "$ROOT/bench/lib.sh"

declare -A BIN PORT
BIN[this]=$SLUICE_BIN
PORT[this]=$((PORT_BASE + 10))
NAMES=(this)
if [ -n "${NR_BASE_BIN:-}" ]; then
    BIN[base]=$NR_BASE_BIN
    PORT[base]=$((PORT_BASE + 11))
    NAMES=(base this)
fi
for n in "${NAMES[@]}"; do cp "${BIN[$n]}" "$WORK/sluice-$n"; done
ports_free "$UP_PORT" $(for n in "${NAMES[@]}"; do echo "${PORT[$n]}"; done)

nginx_fixed_upstream "$UP_PORT" "${NR_LOAD_CPU:-0-1}"

export SLUICE_BENCH_TOKEN_SECRET=bench-token-secret-0123456789abcdef0123
export SLUICE_BENCH_SIGNING_SECRET=bench-signing-secret-0123456789abcdef01
for n in "${NAMES[@]}"; do
    {
        bench_sluice_conf "${PORT[$n]}" "$UP_PORT"
        bench_auth_conf true | sed "s/window: 300s/window: ${WINDOW}s/"
    } >"$WORK/$n.yaml"
    "$WORK/sluice-$n" -t -c "$WORK/$n.yaml" >/dev/null
done
TOKENS=$WORK/tokens.txt
for i in $(seq 16); do
    "$WORK/sluice-this" token --sub "rss-user-$i" --ttl 1h -c "$WORK/this.yaml" |
        awk '/^access_token:/ { t = $2 } /^signing_key:/ { k = $2 } END { print t, k }'
done >"$TOKENS"

declare -A PID
for n in "${NAMES[@]}"; do
    spawn "$WORK/sluice-$n" -c "$WORK/$n.yaml" 2>"$WORK/$n.err"
    PID[$n]=$LAST
    wait_port "${PORT[$n]}" "$LAST"
done

rss_kb() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }

run_load() { # $1 conns, $2 seconds, $3 sample peak RSS (1/0)
    local n w=()
    for n in "${NAMES[@]}"; do
        BENCH_TOKENS=$TOKENS BENCH_SIGN=1 wrk -t1 -c"$1" -d"$2"s -s "$ROOT/bench/signed.lua" \
            "http://127.0.0.1:${PORT[$n]}/v1/chat/completions" >"$WORK/wrk.$n" 2>&1 &
        w+=($!)
    done
    declare -gA PEAK
    for n in "${NAMES[@]}"; do PEAK[$n]=0; done
    while kill -0 "${w[@]}" 2>/dev/null; do
        if [ "$3" = 1 ]; then
            for n in "${NAMES[@]}"; do
                r=$(rss_kb "${PID[$n]}")
                [ "$r" -gt "${PEAK[$n]}" ] && PEAK[$n]=$r
            done
        fi
        sleep 1
    done
    for p in "${w[@]}"; do wait "$p" || true; done
    for n in "${NAMES[@]}"; do
        r=$(rss_kb "${PID[$n]}")
        [ "$r" -gt "${PEAK[$n]}" ] && PEAK[$n]=$r
        grep -q "Non-2xx" "$WORK/wrk.$n" && { echo "bench: $n: non-2xx answers" >&2; cat "$WORK/wrk.$n" >&2; exit 1; }
    done
    true
}

declare -A PRE REQS
run_load 1 5 0
sleep $((WINDOW + 10))
for n in "${NAMES[@]}"; do PRE[$n]=$(rss_kb "${PID[$n]}"); done
run_load 32 "$PEAK_S" 1
for n in "${NAMES[@]}"; do
    REQS[$n]=$(awk '/requests in/ { print $1 }' "$WORK/wrk.$n")
done
sleep $((WINDOW + 10 + AFTER_S))

echo "nonce store RSS: $(date -u '+%Y-%m-%d %H:%M UTC'), commit" \
    "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'), window ${WINDOW}s," \
    "peak ${PEAK_S}s of wrk -c32 (fresh signatures), after = ${AFTER_S}s past the last expiry"
echo
echo "| binary | peak requests | RSS pre-peak (MiB) | RSS peak (MiB) | RSS after (MiB) | after / pre-peak |"
echo "| --- | ---: | ---: | ---: | ---: | ---: |"
for n in "${NAMES[@]}"; do
    a=$(rss_kb "${PID[$n]}")
    awk -v n="$n" -v q="${REQS[$n]}" -v p="${PRE[$n]}" -v k="${PEAK[$n]}" -v a="$a" 'BEGIN {
        printf "| %s | %s | %.1f | %.1f | %.1f | %.2f |\n", n, q, p / 1024, k / 1024, a / 1024, a / p }'
done
