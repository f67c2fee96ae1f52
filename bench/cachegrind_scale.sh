#!/usr/bin/env bash
# bench/cachegrind_scale.sh — user-space instructions and cache misses per
# request at a few client concurrencies (issue #21 item 4), counted by
# valgrind's callgrind with its cache simulator: immune to the machine's
# load, so a cold line that misses at 5,000 connections and not at 32 shows
# by function and by line where the wall-clock scale bench only shows noise.
#
# bench/scale.sh's workload: scale.sh's sluice conf (workers 1, defaults
# but the upstream pool's keepalive_timeout, below), bench/post.lua, an
# nginx `return 200` upstream. Per binary and concurrency, sluice runs under
# callgrind with instrumentation off; wrk runs CG_WARM + CG_WINDOW + 5 s;
# after CG_WARM s instrumentation is switched on for CG_WINDOW s and off
# again, and the counts are divided by sluice's own sluice_requests_total
# over that window (read just before and after it). The new upstream
# connections in the window are shown too (the pool's churn: a connect and
# a close cost as much as a few requests).
#
# Under valgrind sluice serves 150-300 requests a second, so at 5,000
# connections every one has a request waiting (seconds of latency): the
# warm-up must outlast wrk's first wave and the window be long against that
# latency, or the count is off by whole waves (30 s and 40 s do). The load
# so comes in waves seconds apart, and the default pool (keepalive_timeout
# 4 s) shrank and regrew between them: 43 % of requests opened an upstream
# connection at 5,000, against 0.4-4.8 % in bench/scale.sh's runs at full
# speed. So the pool keeps its connections CG_UP_KEEPALIVE (300s).
#
# CG_NGINX=1 adds nginx as the proxy, measured the same way (scale.sh's
# nginx proxy conf, one worker and no master under callgrind; its requests
# counted by stub_status, the two status reads taken off): the baseline in
# lines, not only in µs. Its new upstream connections are not counted ("-").
#
#   SLUICE_BIN (default build/sluice), SLUICE_BASE_BIN (optional: the same
#   figures for that binary, in the same run, interleaved), CG_CONNS
#   (default "32 5000"), CG_WARM (s, default 30), CG_WINDOW (s, default 40),
#   CG_UP_KEEPALIVE (300s), CG_SIM ("--cache-sim=yes --LL=524288,8,64" by
#   default; empty for Ir only, faster), CG_ENV (variables for sluice, e.g.
#   GLIBC_TUNABLES=glibc.malloc.tcache_count=2000), BENCH_PORT_BASE (default
#   29100), BENCH_KEEP=1 keeps the callgrind files (callgrind_annotate
#   --show=Ir,D1mr,D1mw,DLmr,DLmw --auto=yes them).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SLUICE_BIN=${SLUICE_BIN:-$ROOT/build/sluice}
SLUICE_BASE_BIN=${SLUICE_BASE_BIN:-}
NGINX_BIN=${NGINX_BIN:-$(command -v nginx || echo /usr/sbin/nginx)}
CONNS=${CG_CONNS:-"32 5000"}
WARM=${CG_WARM:-30}
WINDOW=${CG_WINDOW:-40}
# LL as the core's own 512 KiB L2 (callgrind takes the host's L3, which
# reads as 256 MiB direct-mapped in this VM: nothing would miss it).
SIM=${CG_SIM---cache-sim=yes --LL=524288,8,64}
PORT_BASE=${BENCH_PORT_BASE:-29100}
UP_PORT=$((PORT_BASE + 1))
PORT=$((PORT_BASE + 10))
ADMIN=$((PORT_BASE + 20))

for c in wrk valgrind callgrind_control curl "$NGINX_BIN" "$SLUICE_BIN"; do
    command -v "$c" >/dev/null || { echo "bench: $c not found" >&2; exit 1; }
done
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"

WORK=$(mktemp -d /tmp/sluice-cgscale.XXXXXX)
cp "$SLUICE_BIN" "$WORK/sluice-this"
BINS="this"
if [ -n "$SLUICE_BASE_BIN" ]; then
    cp "$SLUICE_BASE_BIN" "$WORK/sluice-base"
    BINS="base this"
fi
[ "${CG_NGINX:-0}" = 1 ] && BINS="$BINS nginx"
. "$ROOT/bench/lib.sh"
ports_free "$UP_PORT" "$PORT" "$ADMIN"

scale_upstream_conf "$WORK/up" "$UP_PORT"
spawn "$NGINX_BIN" -p "$WORK/up/" -e "$WORK/up/error.log" -c "$WORK/up/nginx.conf"
wait_port "$UP_PORT" "$LAST"

bench_sluice_conf "$PORT" "$UP_PORT" "$ADMIN" "keepalive_timeout: ${CG_UP_KEEPALIVE:-300s}" error \
    >"$WORK/sluice.yaml"
scale_proxy_conf "$WORK/px" "$PORT" "$UP_PORT" off

# "requests new-upstream-connections" so far ($1 nginx: stub_status's
# requests, this read not counted; no upstream count, "-")
requests() {
    if [ "${1:-}" = nginx ]; then
        curl -sf "http://127.0.0.1:$PORT/nginx_status" | awk 'NR == 3 { printf "%d -", $3 - 1 }'
        return
    fi
    curl -sf "http://127.0.0.1:$ADMIN/metrics" |
        awk '/^sluice_requests_total/ { s += $NF }
            /^sluice_upstream_connections_total\{.*reused="false"/ { u += $NF }
            END { printf "%d %d", s, u }'
}

# One run: $1 binary name, $2 connections; prints "Ir D1mr D1mw DLmr DLmw requests".
one() {
    local out=$WORK/cg.$1.c$2 n1 n2 u1 u2 pid
    if [ "$1" = nginx ]; then
        # shellcheck disable=SC2086
        spawn valgrind --tool=callgrind $SIM --instr-atstart=no --callgrind-out-file="$out" \
            "$NGINX_BIN" -p "$WORK/px/" -e "$WORK/px/error.log" -c "$WORK/px/nginx.conf" 2>"$out.log"
        pid=$LAST
        wait_port "$PORT" "$pid" 1200
    else
        # shellcheck disable=SC2086
        spawn env ${CG_ENV:-} valgrind --tool=callgrind $SIM --instr-atstart=no --callgrind-out-file="$out" \
            "$WORK/sluice-$1" -c "$WORK/sluice.yaml" 2>"$out.log"
        pid=$LAST
        wait_admin_slow "$ADMIN" "$pid"
    fi
    wrk -t1 -c"$2" -d"$((WARM + WINDOW + 5))s" --timeout 120s -s "$ROOT/bench/post.lua" \
        "http://127.0.0.1:$PORT/v1/chat/completions" >"$out.wrk" &
    local wrk_pid=$!
    sleep "$WARM"
    read -r n1 u1 <<<"$(requests "$1")"
    callgrind_control -i on "$pid" >/dev/null
    sleep "$WINDOW"
    callgrind_control -i off "$pid" >/dev/null
    read -r n2 u2 <<<"$(requests "$1")"
    wait "$wrk_pid" || true
    stop "$pid"
    grep -q 'errors=0 non2xx=0' "$out.wrk" || { echo "bench: wrk saw errors ($1, c=$2)" >&2; cat "$out.wrk" >&2; }
    # events: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw (cache sim) or Ir
    local u=-1
    [ "$u1" = - ] || u=$((u2 - u1))
    awk -v n=$((n2 - n1)) -v u="$u" '
        /^events:/ { for (i = 2; i <= NF; i++) col[$i] = i - 1 }
        /^totals:/ {
            printf "%d %d %d %d %d %d %d %d\n", n, u, $(col["Ir"] + 1),
                ("D1mr" in col) ? $(col["D1mr"] + 1) : 0, ("D1mw" in col) ? $(col["D1mw"] + 1) : 0,
                ("DLmr" in col) ? $(col["DLmr"] + 1) : 0, ("DLmw" in col) ? $(col["DLmw"] + 1) : 0,
                ("I1mr" in col) ? $(col["I1mr"] + 1) : 0
        }' "$out"
}

echo "callgrind per request by concurrency: $(date -u '+%Y-%m-%d %H:%M UTC'), commit" \
    "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'), ${WINDOW}s windows after ${WARM}s"
echo
echo "| binary | wrk -c | requests | new upstream connections | Ir / request | D1 misses (r+w) / request | LL misses (r+w) / request | I1 misses / request |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
for c in $CONNS; do
    for b in $BINS; do
        read -r n u ir d1r d1w llr llw i1 <<<"$(one "$b" "$c")"
        [ "$n" -gt 0 ] || { echo "bench: no requests in the window ($b, c=$c)" >&2; exit 1; }
        awk -v b="$b" -v c="$c" -v n="$n" -v ir="$ir" -v d1="$((d1r + d1w))" -v ll="$((llr + llw))" \
            -v i1="$i1" -v u="$u" 'BEGIN { printf "| %s | %s | %d | %s | %.0f | %.1f | %.2f | %.1f |\n",
                b, c, n, u < 0 ? "-" : u, ir / n, d1 / n, ll / n, i1 / n }'
    done
done
if [ "${BENCH_KEEP:-0}" = 1 ]; then ls "$WORK"/cg.*.c* | grep -v '\.' || true; fi
