#!/usr/bin/env bash
# bench/callgrind_req.sh — user-space instructions per request of issue #16's
# JSON request (realistic.sh's "plain" and "full" confs) and of its streamed
# request ("full-sse": "stream":true, the upstream build/tools/bench_upstream
# answering 8 SSE events) and of issue #16's signed request ("full-sig": full
# with auth.signing.required, every request signed by realistic.lua with the
# token's signing key — timestamp, fresh nonce, HMAC — as bench/signed.lua
# does for policy.sh's full_sig; one token, full's, so full-sig − full is
# the signature, the nonce store and the three headers), counted by
# valgrind's callgrind: immune to the machine's load, so it resolves changes
# of a few hundred instructions that the wall-clock benches cannot.
#
# Per binary and conf, sluice runs twice under callgrind (workers 1): once
# with a short wrk run, once with a long one; instructions per request are
# (Ir(long) - Ir(short)) / (requests(long) - requests(short)), so start-up
# (conf, the word list's automaton) and shutdown cancel out. Requests are
# sluice's own sluice_requests_total (admin /metrics, read once in both runs),
# not wrk's count, which misses those in flight at its end.
#
#   SLUICE_BIN (default build/sluice), SLUICE_BASE_BIN (optional: the same
#   figures for that binary, in the same run), CG_CONFS (default "plain full";
#   add full-sse for the streamed request, full-sig for the signed one,
#   plain-esc / full-esc for the plain and full confs sending issue #16's body
#   with escapes: a two-line system prompt, \n, \" and \u00e9 in the user
#   message, bench/lib.sh's realistic_esc_body; plain-parts / full-parts
#   sending it with the user message as two text parts and an image_url
#   part, bench/lib.sh's realistic_parts_body; full-resp / full-resp-sse for
#   full's conf sending the same content as a Responses API request, POST
#   /v1/responses, bench/lib.sh's realistic_resp_body: the upstream answers
#   that API, a response object or bench_upstream's stream of 15 events, 8 of
#   them text deltas; sluice relays that API, it does not translate it),
#   full-budget / full-resp-budget for full / full-resp with a token budget
#   on (ratelimit.per_user.tokens_per_minute 1e9, never refusing: the
#   prompt estimate, the reservation and its settlement on every request;
#   full-budget - full and full-resp-budget - full-resp are their cost;
#   full-sse-budget: full-sse with that budget, the stream's accounting),
#   full-tools / full-tools-budget for full's conf, without and with that
#   budget, sending issue #16's body with a "tools" array of two functions
#   (nested parameter schemas: bench/lib.sh's realistic_tools_body),
#   CG_SHORT / CG_LONG (wrk seconds, default 3 / 12), CG_CONNS (default 32),
#   BENCH_BODY_VARY=key (realistic.lua: every request's body a JSON shape of
#   its own, body_scan.c's kept shapes missing; with CG_NGINX=0),
#   BENCH_PORT_BASE (default 28900), BENCH_KEEP=1 keeps the callgrind files
#   (callgrind_annotate them: the per-function split of the difference),
#   CG_NGINX (default 1: adds an "nginx" row to the plain conf: nginx as the
#   proxy of realistic.sh, one process, master_process off, under callgrind;
#   its requests are wrk's count, so the few in flight at the end are missed;
#   and a "nginx" row to full-sse: nginx relaying the same stream,
#   proxy_buffering off; and one to full-resp-sse, nginx-resp-sse: nginx
#   relaying bench_upstream's Responses stream, POST /v1/responses, the
#   same conf: the figure to quote is full-resp-sse / nginx-resp-sse).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SLUICE_BIN=${SLUICE_BIN:-$ROOT/build/sluice}
SLUICE_BASE_BIN=${SLUICE_BASE_BIN:-}
NGINX_BIN=${NGINX_BIN:-$(command -v nginx || echo /usr/sbin/nginx)}
CONFS=${CG_CONFS:-"plain full"}
SHORT=${CG_SHORT:-3}
LONG=${CG_LONG:-12}
CONNS=${CG_CONNS:-32}
PORT_BASE=${BENCH_PORT_BASE:-28900}
UP_PORT=$((PORT_BASE + 1))
SSE_UP_PORT=$((PORT_BASE + 3))
PORT=$((PORT_BASE + 10))
ADMIN=$((PORT_BASE + 20))

SSE_UP_BIN=$ROOT/build/tools/bench_upstream
for c in wrk valgrind curl "$NGINX_BIN" "$SLUICE_BIN"; do
    command -v "$c" >/dev/null || { echo "bench: $c not found" >&2; exit 1; }
done

WORK=$(mktemp -d /tmp/sluice-callgrind.XXXXXX)
cp "$SLUICE_BIN" "$WORK/sluice"
BINS="this"
CG_NGINX=${CG_NGINX:-1}
if [ -n "$SLUICE_BASE_BIN" ]; then
    cp "$SLUICE_BASE_BIN" "$WORK/sluice-base"
    BINS="this base"
fi
. "$ROOT/bench/lib.sh"

realistic_trio "$PORT" "$ADMIN" "$CONFS"

# nginx as the proxy (realistic.sh's baseline), one process so callgrind sees
# all of its work
nginx_proxy_conf "$WORK/ngx-plain" "$UP_PORT" "$PORT" "" "" off
nginx_proxy_conf "$WORK/ngx-full-sse" "$SSE_UP_PORT" "$PORT" "proxy_buffering off;" "" off

# One nginx run under callgrind: $1 conf (plain, full-sse or full-resp-sse:
# the latter relayed as full-sse is, its body and path), $2 wrk seconds;
# prints "Ir requests".
one_nginx() {
    local out=$WORK/cg.nginx.$1.$2 n ir _
    local dir=$WORK/ngx-$1
    [ "$1" != full-resp-sse ] || dir=$WORK/ngx-full-sse
    realistic_req "$1"
    spawn valgrind --tool=callgrind --callgrind-out-file="$out" "$NGINX_BIN" -p "$dir/" \
        -e "$dir/error.log" -c "$dir/nginx.conf" 2>"$out.log"
    local pid=$LAST
    for _ in $(seq 600); do
        kill -0 "$pid" 2>/dev/null || { echo "bench: nginx died" >&2; exit 1; }
        (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break
        sleep 0.1
    done
    BENCH_BODY_FILE=$REQ_BODY wrk -t1 -c"$CONNS" -d"$2"s --timeout 30s \
        -s "$ROOT/bench/realistic.lua" "http://127.0.0.1:$PORT$REQ_PATH" >"$out.wrk"
    grep -q 'errors=0 non2xx=0' "$out.wrk" || { cat "$out.wrk" >&2; exit 1; }
    n=$(sed -n 's/^BENCH requests=\([0-9]*\).*/\1/p' "$out.wrk")
    kill -QUIT "$pid" 2>/dev/null || true # graceful: callgrind writes its totals
    stop "$pid"
    ir=$(awk '/^summary:/ { print $2 }' "$out")
    echo "$ir $n"
}

# One run: $1 binary, $2 conf, $3 wrk seconds; prints "Ir requests".
one() {
    local out=$WORK/cg.$1.$2.$3 n ir
    realistic_req "$2"
    local bin=$WORK/sluice
    [ "$1" = base ] && bin=$WORK/sluice-base
    spawn valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" -c "$WORK/$2.yaml" \
        2>"$out.log"
    local pid=$LAST
    wait_admin_slow "$ADMIN" "$pid"
    BENCH_TOKEN=$REQ_TOKEN BENCH_SIGNING_KEY=$REQ_SIGNING_KEY BENCH_BODY_FILE=$REQ_BODY wrk -t1 -c"$CONNS" -d"$3"s --timeout 30s -s "$ROOT/bench/realistic.lua" \
        "http://127.0.0.1:$PORT$REQ_PATH" >"$out.wrk"
    grep -q 'errors=0 non2xx=0' "$out.wrk" || { cat "$out.wrk" >&2; exit 1; }
    n=$(curl -sf "http://127.0.0.1:$ADMIN/metrics" |
        awk '/^sluice_requests_total/ { s += $NF } END { printf "%d", s }')
    stop "$pid"
    ir=$(awk '/^summary:/ { print $2 }' "$out")
    echo "$ir $n"
}

echo "callgrind per request: $(date -u '+%Y-%m-%d %H:%M UTC'), commit" \
    "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'), wrk -c$CONNS," \
    "${SHORT}s and ${LONG}s runs"
echo
echo "| binary | conf | requests (short / long) | instructions per request |"
echo "| --- | --- | --- | ---: |"
for c in $CONFS; do
    for b in $BINS; do
        read -r ir1 n1 <<<"$(one "$b" "$c" "$SHORT")"
        read -r ir2 n2 <<<"$(one "$b" "$c" "$LONG")"
        # a failed run exits only its $(...): stop here, not with garbage rows
        [[ "$n1 $n2" =~ ^[0-9]+\ [0-9]+$ ]] || { echo "bench: $b $c failed" >&2; exit 1; }
        echo "| $b | $c | $n1 / $n2 | $(((ir2 - ir1) / (n2 - n1))) |"
    done
    case $c in plain | full-sse | full-resp-sse)
        [ "$CG_NGINX" = 1 ] || continue
        read -r ir1 n1 <<<"$(one_nginx "$c" "$SHORT")"
        read -r ir2 n2 <<<"$(one_nginx "$c" "$LONG")"
        label="$c (nginx as the proxy)"
        [ "$c" != full-resp-sse ] || label="nginx-resp-sse (nginx relaying the Responses stream)"
        echo "| nginx | $label | $n1 / $n2 | $(((ir2 - ir1) / (n2 - n1))) |"
        ;;
    esac
done
