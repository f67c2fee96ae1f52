#!/bin/bash
# bench/h2_bench.sh — HTTP/2 over TLS (issue 11): h2load against sluice and
# against nginx (http_v2, Debian's nginx-light) in the same run, both in
# front of build/tools/bench_upstream, both with one worker pinned to one
# core (the load generator and the upstream on the other).
#
#   1. proxy CPU per request, json answers, in three shapes (connections x
#      streams per connection): 1x1 (h2load -c 1 -m 1: one request at a
#      time, so mostly the cost of waking up), 32x1 (-c 32 -m 1: 32 clients
#      each with one request in flight, the proxy busy: the per-request
#      work) and 1x100 (-c 1 -m 100); interleaved rounds: nginx, sluice,
#      nginx, ...; CPU is the proxy's own (utime+stime of all its threads
#      from /proc over the round) divided by the requests h2load completed.
#   2. time to first SSE event over h2 added over direct: bench/h2_ttfe.py
#      on one warm connection per target (h2 over TLS to the proxies, plain
#      HTTP/1.1 keep-alive to the upstream itself), request written -> first
#      event's bytes, interleaved samples; the upstream writes the head and
#      the first event at once.
# Every figure is also printed as a ratio to nginx's of the same run.
# Both proxies keep up to 128 idle upstream connections (the streams one
# connection may have in flight): with 64, a 1x100 batch read at once made
# both open and close connections per batch.
# BENCH_BASE_BIN (optional): a second sluice binary (e.g. the commit before a
# change) run beside the first, same conf, same rounds, interleaved
# ("base", "base-h1"), so before/after is a ratio of the same run.
# Env: BENCH_ROUNDS (3), BENCH_N (requests per round, 20000), BENCH_SHAPES
# ("1x1 32x1 1x100"), BENCH_TTFE (1; 0 skips part 2),
# BENCH_TTFE_SAMPLES (60), BENCH_PORT_BASE (19400), SLUICE_BIN, BENCH_TOOLS,
# BENCH_NGINX_TLS (nginx's ssl_protocols, "TLSv1.2 TLSv1.3": both proxies on
# TLS 1.3, as sluice negotiates it; nginx 1.22's default stops at TLS 1.2).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SLUICE_BIN=${SLUICE_BIN:-$ROOT/build/sluice}
TOOLS=${BENCH_TOOLS:-$ROOT/build/tools}
NGINX_BIN=${NGINX_BIN:-$(command -v nginx || echo /usr/sbin/nginx)}
ROUNDS=${BENCH_ROUNDS:-3}
N=${BENCH_N:-20000}
SAMPLES=${BENCH_TTFE_SAMPLES:-60}
PORT_BASE=${BENCH_PORT_BASE:-19400}
PROXY_CPU=${BENCH_PROXY_CPU:-1}
LOAD_CPU=${BENCH_LOAD_CPU:-0}
UP_PORT=$((PORT_BASE + 1))
TTFE_PORT=$((PORT_BASE + 2))
NGINX_PORT=$((PORT_BASE + 10))
SLUICE_PORT=$((PORT_BASE + 20))
BASE_PORT=$((PORT_BASE + 21))
BASE_BIN=${BENCH_BASE_BIN:-}

for c in h2load curl openssl taskset python3 "$NGINX_BIN" "$SLUICE_BIN" "$TOOLS/bench_upstream"; do
    command -v "$c" >/dev/null || { echo "bench: $c missing" >&2; exit 1; }
done
WORK=$(mktemp -d /tmp/sluice-h2bench.XXXXXX)
. "$ROOT/bench/lib.sh"
CLK_TCK=$(getconf CLK_TCK)

bench_cert
BODY=$WORK/body.json
SBODY=$WORK/sbody.json
echo -n '{"model":"bench-model","messages":[{"role":"user","content":"Hello"}]}' >"$BODY"
echo -n '{"model":"bench-model","stream":true,"messages":[{"role":"user","content":"Hello"}]}' >"$SBODY"

start_proxies() { # $1 upstream port
    local d=$WORK/p$1
    mkdir -p "$d/tmp"
    cat >"$d/nginx.conf" <<EOF
worker_processes 1;
daemon off;
master_process on;
pid $d/nginx.pid;
error_log $d/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    keepalive_timeout 60s;
    keepalive_requests 100000;
    http2_max_concurrent_streams 128;
    client_body_temp_path $d/tmp/body;
    proxy_temp_path $d/tmp/proxy;
    fastcgi_temp_path $d/tmp/fastcgi;
    uwsgi_temp_path $d/tmp/uwsgi;
    scgi_temp_path $d/tmp/scgi;
    upstream bench { server 127.0.0.1:$1; keepalive 128; }
    server {
        listen 127.0.0.1:$NGINX_PORT ssl http2;
        ssl_certificate $WORK/crt.pem;
        ssl_certificate_key $WORK/key.pem;
        ssl_protocols ${BENCH_NGINX_TLS:-TLSv1.2 TLSv1.3};
        location / {
            proxy_pass http://bench;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }
    }
}
EOF
    h2_sluice_conf "$d/sluice.yaml" "$SLUICE_PORT" "$1"
    spawn taskset -c "$PROXY_CPU" "$NGINX_BIN" -p "$d/" -e "$d/error.log" -c "$d/nginx.conf"
    NGINX_MASTER=$LAST
    wait_port "$NGINX_PORT" "$NGINX_MASTER"
    NGINX_WORKER=$(pgrep -P "$NGINX_MASTER" | head -1)
    spawn taskset -c "$PROXY_CPU" "$SLUICE_BIN" -c "$d/sluice.yaml"
    SLUICE_PID=$LAST
    wait_port "$SLUICE_PORT" "$SLUICE_PID"
    BASE_PID=
    if [ -n "$BASE_BIN" ]; then
        sed "s/127.0.0.1:$SLUICE_PORT/127.0.0.1:$BASE_PORT/" "$d/sluice.yaml" >"$d/base.yaml"
        spawn taskset -c "$PROXY_CPU" "$BASE_BIN" -c "$d/base.yaml"
        BASE_PID=$LAST
        wait_port "$BASE_PORT" "$BASE_PID"
    fi
}

stop_proxies() {
    stop "$SLUICE_PID"
    [ -z "$BASE_PID" ] || stop "$BASE_PID"
    stop "$NGINX_MASTER"
}

port_of() {
    case $1 in nginx) echo "$NGINX_PORT" ;; base*) echo "$BASE_PORT" ;; *) echo "$SLUICE_PORT" ;; esac
}
pid_of() {
    case $1 in nginx) echo "$NGINX_WORKER" ;; base*) echo "$BASE_PID" ;; *) echo "$SLUICE_PID" ;; esac
}
# sluice-h1: sluice over HTTP/1.1 on the same TLS listener (ALPN http/1.1),
# one request at a time per connection: what the h2 layer itself costs.

# $1 target, $2 shape CxM (connections x streams per connection), $3 requests;
# prints "ok cpu_us_per_req rps"
run_h2load() {
    local t=$1 c=${2%x*} m=${2#*x} n=$3 pid c0 c1 out ok rps
    pid=$(pid_of "$t")
    c0=$(cpu_ticks "$pid")
    local h1=()
    case $t in *-h1) h1=(--h1) ;; esac
    out=$(taskset -c "$LOAD_CPU" h2load "${h1[@]}" -n "$n" -c "$c" -m "$m" -d "$BODY" \
        -H 'content-type: application/json' "https://127.0.0.1:$(port_of "$t")/v1/chat/completions" 2>&1)
    c1=$(cpu_ticks "$pid")
    ok=$(echo "$out" | awk '/^status codes:/ { print $3 }')
    rps=$(echo "$out" | awk '/^finished in/ { print $4 }')
    [ ${#h1[@]} -gt 0 ] || echo "$out" | grep -qi 'application protocol: h2' ||
        { echo "bench: $t did not speak h2" >&2; echo "$out" >&2; exit 1; }
    awk -v ok="$ok" -v d=$((c1 - c0)) -v tck="$CLK_TCK" -v rps="$rps" \
        'BEGIN { printf "%d %.2f %s\n", ok, ok ? d / tck * 1e6 / ok : 0, rps }'
}

echo "h2 bench: $(date -u +%FT%TZ), sluice $SLUICE_BIN, $($NGINX_BIN -v 2>&1 | sed 's/.*: //'), h2load $(h2load --version | awk '{print $2}'), $N requests x $ROUNDS rounds; load $(cut -d' ' -f1-3 /proc/loadavg)"

# ---- 1. CPU per request ------------------------------------------------
spawn taskset -c "$LOAD_CPU" "$TOOLS/bench_upstream" -l "127.0.0.1:$UP_PORT" -n 8
UP_PID=$LAST
wait_port "$UP_PORT" "$UP_PID"
start_proxies "$UP_PORT"
declare -A CPU
SHAPES=${BENCH_SHAPES:-"1x1 32x1 1x100"}
for m in $SHAPES; do
    targets="nginx sluice"
    [ "${m#*x}" = 1 ] && targets="nginx sluice sluice-h1"
    if [ -n "$BASE_BIN" ]; then
        targets="$targets base"
        [ "${m#*x}" = 1 ] && targets="$targets base-h1"
    fi
    for t in $targets; do run_h2load "$t" "$m" 2000 >/dev/null; done # warm
    for r in $(seq "$ROUNDS"); do
        for t in $targets; do
            read -r ok us rps < <(run_h2load "$t" "$m" "$N")
            [ "$ok" -eq "$N" ] || echo "bench: $t m=$m round $r: only $ok of $N were 2xx" >&2
            CPU[$t.$m]="${CPU[$t.$m]:-} $us"
            printf '  %-5s round %d %-6s %7.2f us CPU/request  %9s req/s\n' "$m" "$r" "$t" "$us" "$rps"
        done
    done
done
stop_proxies
stop "$UP_PID"

med() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
echo "proxy CPU per request over h2+TLS (median of rounds; ratio = sluice / nginx):"
for m in $SHAPES; do
    n=$(echo "${CPU[nginx.$m]}" | med)
    s=$(echo "${CPU[sluice.$m]}" | med)
    awk -v m="$m" -v n="$n" -v s="$s" 'BEGIN { printf "  %5s conns x streams: nginx %.2f us, sluice %.2f us, ratio %.2f\n", m, n, s, s / n }'
done
for m in $SHAPES; do
    [ "${m#*x}" = 1 ] || continue
    h=$(echo "${CPU[sluice-h1.$m]}" | med)
    s=$(echo "${CPU[sluice.$m]}" | med)
    awk -v m="$m" -v h="$h" -v s="$s" 'BEGIN { printf "  sluice over TLS, %s: h2 %.2f us, http/1.1 %.2f us, h2/h1 %.2f\n", m, s, h, s / h }'
done
if [ -n "$BASE_BIN" ]; then
    for m in $SHAPES; do
        b=$(echo "${CPU[base.$m]}" | med)
        s=$(echo "${CPU[sluice.$m]}" | med)
        n=$(echo "${CPU[nginx.$m]}" | med)
        awk -v m="$m" -v b="$b" -v s="$s" -v n="$n" 'BEGIN { printf "  base %5s: %.2f us (÷ nginx %.2f); this ÷ base %.2f\n", m, b, b / n, s / b }'
    done
    for m in $SHAPES; do
        [ "${m#*x}" = 1 ] || continue
        b=$(echo "${CPU[base.$m]}" | med)
        h=$(echo "${CPU[base-h1.$m]}" | med)
        awk -v m="$m" -v h="$h" -v b="$b" 'BEGIN { printf "  base over TLS, %s: h2/h1 %.2f\n", m, b / h }'
    done
fi

# ---- 2. time to first SSE byte -----------------------------------------
[ "${BENCH_TTFE:-1}" = 1 ] || exit 0
spawn taskset -c "$LOAD_CPU" "$TOOLS/bench_upstream" -l "127.0.0.1:$TTFE_PORT" -n 2 -d 1000
UP_PID=$LAST
wait_port "$TTFE_PORT" "$UP_PID"
start_proxies "$TTFE_PORT"
TTOUT=$(taskset -c "$LOAD_CPU" python3 "$ROOT/bench/h2_ttfe.py" "$SAMPLES" "$SBODY" \
    "direct=http://127.0.0.1:$TTFE_PORT/v1/chat/completions" \
    "nginx=https://127.0.0.1:$NGINX_PORT/v1/chat/completions" \
    "sluice=https://127.0.0.1:$SLUICE_PORT/v1/chat/completions")
stop_proxies
stop "$UP_PID"
d=$(echo "$TTOUT" | awk '$1 == "direct" { print $2 }')
n=$(echo "$TTOUT" | awk '$1 == "nginx" { print $2 }')
s=$(echo "$TTOUT" | awk '$1 == "sluice" { print $2 }')
echo "time to first SSE event over h2+TLS (warm connections; median of $SAMPLES interleaved samples, bench/h2_ttfe.py):"
echo "$TTOUT" | awk '{ printf "  %-7s median %s us, p90 %s us\n", $1, $2, $3 }'
awk -v d="$d" -v n="$n" -v s="$s" 'BEGIN {
    printf "  direct (h1, plain) %.0f us; nginx %.0f us (+%.0f); sluice %.0f us (+%.0f); added ratio sluice/nginx %.2f\n",
        d, n, n - d, s, s - d, ((n - d) > 0 ? (s - d) / (n - d) : 0) }'
