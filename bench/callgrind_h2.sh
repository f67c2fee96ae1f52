#!/usr/bin/env bash
# bench/callgrind_h2.sh — user-space instructions per HTTP/2-over-TLS request
# (issue #11, h2_bench.sh's conf and answer), counted by valgrind's
# callgrind: immune to the machine's load, so it proves cuts of a few
# hundred instructions that the wall-clock bench cannot resolve.
#
# Per binary and shape, sluice runs twice under callgrind (workers 1): once
# with a short h2load run, once with a long one, each on one connection set
# (h2load -c C -m M -n N); instructions per request are
# (Ir(long) - Ir(short)) / (N(long) - N(short)), so start-up, the TLS
# handshakes and shutdown cancel out. Every request must be a 2xx.
#
#   SLUICE_BIN (default build/sluice), SLUICE_BASE_BIN (optional: the same
#   figures for that binary, same run), CG_SHAPES (default "1x1", CxM as in
#   h2_bench.sh), CG_SHORT / CG_LONG (requests, default 500 / 2500),
#   BENCH_PORT_BASE (default 29400), BENCH_TOOLS, BENCH_KEEP=1 keeps the
#   callgrind files (callgrind_annotate them for the per-function split),
#   CG_NGINX (default 1: adds an "nginx" row per shape: nginx as the h2+TLS
#   proxy, h2_bench.sh's nginx conf, one process, same request and upstream),
#   BENCH_NGINX_TLS (nginx's ssl_protocols, default "TLSv1.2 TLSv1.3": sluice
#   speaks TLS 1.3, and nginx 1.22 without the line offers only up to 1.2).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SLUICE_BIN=${SLUICE_BIN:-$ROOT/build/sluice}
SLUICE_BASE_BIN=${SLUICE_BASE_BIN:-}
TOOLS=${BENCH_TOOLS:-$ROOT/build/tools}
SHAPES=${CG_SHAPES:-"1x1"}
SHORT=${CG_SHORT:-500}
LONG=${CG_LONG:-2500}
PORT_BASE=${BENCH_PORT_BASE:-29400}
UP_PORT=$((PORT_BASE + 1))
PORT=$((PORT_BASE + 10))

for c in h2load valgrind openssl "$SLUICE_BIN" "$TOOLS/bench_upstream"; do
    command -v "$c" >/dev/null || { echo "bench: $c not found" >&2; exit 1; }
done

WORK=$(mktemp -d /tmp/sluice-callgrind-h2.XXXXXX)
cp "$SLUICE_BIN" "$WORK/sluice"
BINS="this"
NGINX_BIN=${NGINX_BIN:-$(command -v nginx || echo /usr/sbin/nginx)}
CG_NGINX=${CG_NGINX:-1}
if [ -n "$SLUICE_BASE_BIN" ]; then
    cp "$SLUICE_BASE_BIN" "$WORK/sluice-base"
    BINS="this base"
fi
. "$ROOT/bench/lib.sh"

bench_cert
BODY=$WORK/body.json
echo -n '{"model":"bench-model","messages":[{"role":"user","content":"Hello"}]}' >"$BODY"

spawn "$TOOLS/bench_upstream" -l "127.0.0.1:$UP_PORT" -n 8
wait_port "$UP_PORT" "$LAST"

h2_sluice_conf "$WORK/sluice.yaml" "$PORT" "$UP_PORT"

# nginx as the h2+TLS proxy, h2_bench.sh's conf, one process (no master) so
# callgrind sees all of its work
nginx_conf "$WORK/ngx" "
    keepalive_timeout 60s;
    http2_max_concurrent_streams 128;
    upstream bench { server 127.0.0.1:$UP_PORT; keepalive 128; }
    server {
        listen 127.0.0.1:$PORT ssl http2;
        ssl_certificate $WORK/crt.pem;
        ssl_certificate_key $WORK/key.pem;
        ssl_protocols ${BENCH_NGINX_TLS:-TLSv1.2 TLSv1.3};
        location / {
            proxy_pass http://bench;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
            proxy_buffering off;
        }
    }" off

# One run: $1 binary, $2 shape CxM, $3 requests; prints "Ir requests".
one() {
    local out=$WORK/cg.$1.$2.$3 c=${2%x*} m=${2#*x} ok ir
    local bin=$WORK/sluice
    [ "$1" = base ] && bin=$WORK/sluice-base
    if [ "$1" = nginx ]; then
        spawn valgrind --tool=callgrind --callgrind-out-file="$out" "$NGINX_BIN" \
            -p "$WORK/ngx/" -e "$WORK/ngx/error.log" -c "$WORK/ngx/nginx.conf" 2>"$out.log"
    else
        spawn valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" \
            -c "$WORK/sluice.yaml" 2>"$out.log"
    fi
    local pid=$LAST
    wait_port "$PORT" "$pid" 1200 # valgrind starts slowly
    h2load -n "$3" -c "$c" -m "$m" -d "$BODY" -H 'content-type: application/json' \
        "https://127.0.0.1:$PORT/v1/chat/completions" >"$out.h2load" 2>&1
    ok=$(awk '/^status codes:/ { print $3 }' "$out.h2load")
    [ "$ok" = "$3" ] || { cat "$out.h2load" >&2; exit 1; }
    grep -qi 'application protocol: h2' "$out.h2load" || { cat "$out.h2load" >&2; exit 1; }
    [ "$1" != nginx ] || kill -QUIT "$pid" 2>/dev/null || true # graceful: totals written
    stop "$pid"
    ir=$(awk '/^summary:/ { print $2 }' "$out")
    echo "$ir $ok"
}

echo "callgrind per h2 request: $(date -u '+%Y-%m-%d %H:%M UTC'), commit" \
    "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'), h2load" \
    "$SHORT and $LONG requests"
echo
echo "| binary | shape | requests (short / long) | instructions per request |"
echo "| --- | --- | --- | ---: |"
[ "$CG_NGINX" = 0 ] || BINS="$BINS nginx"
for s in $SHAPES; do
    for b in $BINS; do
        read -r ir1 n1 <<<"$(one "$b" "$s" "$SHORT")"
        read -r ir2 n2 <<<"$(one "$b" "$s" "$LONG")"
        echo "| $b | $s | $n1 / $n2 | $(((ir2 - ir1) / (n2 - n1))) |"
    done
done
