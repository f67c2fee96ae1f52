#!/usr/bin/env bash
# bench/syscalls.sh — system calls per request by kind, nginx / sluice / base
# (issues #11 and #16): counts, not times, so immune to the machine's load.
#
# Each proxy (one process, one worker) runs in front of
# build/tools/bench_upstream with h2_bench.sh's confs: a TLS listener (h2 by
# ALPN) and a plain HTTP/1.1 one. Per shape (proto:CxM, h2load -c C -m M)
# and proxy, h2load sends a short and a long run, each on fresh connections,
# while `strace -f` logs the proxy's calls; bench/syscalls.py counts them by
# kind, and per request is (long − short) ÷ (N_long − N_short), so the
# handshakes and closes cancel out (they are shown per connection instead).
# Kinds: epoll_wait (and how many returned nothing), epoll_ctl, reads and
# writes per side (client / upstream) with the reads that found nothing
# (EAGAIN), TLS records per client write, clock and timer calls that left
# the vDSO, calls that failed. strace makes every call slow, so this says
# how many, never how long.
#
#   SLUICE_BIN (build/sluice), SLUICE_BASE_BIN (optional: a "base" column,
#   same run), SC_SHAPES ("h2:1x1 h2:32x1 h1:1x1 h1:32x1 h2sse:1x1
#   h1sse:1x1"; h2 is over TLS, h1 plain, *sse streams: 8 SSE events and
#   [DONE] per request, written at once by the upstream), SC_SHORT /
#   SC_LONG (requests, 500 / 2500), SC_NGINX (1: the nginx column),
#   BENCH_PORT_BASE (29600), BENCH_TOOLS, BENCH_KEEP=1 keeps the logs,
#   BENCH_NGINX_TLS (nginx's ssl_protocols, "TLSv1.2 TLSv1.3" as sluice's).
# Then, untraced (SC_CPU_N requests, 20000), what the proxy's threads were
# charged: context switches (voluntary: waits that slept), minor faults, and
# user and kernel time (tick-sampled, so noisy under load). The proxies run
# on CPU BENCH_PROXY_CPU (1), h2load and the upstream on BENCH_LOAD_CPU (0),
# as in h2_bench.sh.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SLUICE_BIN=${SLUICE_BIN:-$ROOT/build/sluice}
SLUICE_BASE_BIN=${SLUICE_BASE_BIN:-}
TOOLS=${BENCH_TOOLS:-$ROOT/build/tools}
NGINX_BIN=${NGINX_BIN:-$(command -v nginx || echo /usr/sbin/nginx)}
SHAPES=${SC_SHAPES:-"h2:1x1 h2:32x1 h1:1x1 h1:32x1 h2sse:1x1 h1sse:1x1"}
SHORT=${SC_SHORT:-500}
LONG=${SC_LONG:-2500}
PORT_BASE=${BENCH_PORT_BASE:-29600}
CPU_N=${SC_CPU_N:-20000}
PROXY_CPU=${BENCH_PROXY_CPU:-1}
LOAD_CPU=${BENCH_LOAD_CPU:-0}
UP_PORT=$((PORT_BASE + 1))

for c in h2load strace ss python3 openssl "$NGINX_BIN" "$SLUICE_BIN" "$TOOLS/bench_upstream"; do
    command -v "$c" >/dev/null || { echo "bench: $c not found" >&2; exit 1; }
done
WORK=$(mktemp -d /tmp/sluice-syscalls.XXXXXX)
. "$ROOT/bench/lib.sh"
ports_free "$UP_PORT" $((PORT_BASE + 10)) $((PORT_BASE + 11)) $((PORT_BASE + 20)) \
    $((PORT_BASE + 21)) $((PORT_BASE + 30)) $((PORT_BASE + 31))

bench_cert
BODY=$WORK/body.json
SBODY=$WORK/sbody.json
echo -n '{"model":"bench-model","messages":[{"role":"user","content":"Hello"}]}' >"$BODY"
echo -n '{"model":"bench-model","stream":true,"messages":[{"role":"user","content":"Hello"}]}' >"$SBODY"

spawn taskset -c "$LOAD_CPU" "$TOOLS/bench_upstream" -l "127.0.0.1:$UP_PORT" -n 8
wait_port "$UP_PORT" "$LAST"

# Ports: nginx +10 (TLS) +11 (plain), sluice +20 +21, base +30 +31.
TARGETS="sluice"
[ -z "$SLUICE_BASE_BIN" ] || TARGETS="$TARGETS base"
[ "${SC_NGINX:-1}" = 0 ] || TARGETS="nginx $TARGETS"
declare -A PID PORT
for t in $TARGETS; do
    case $t in nginx) p=$((PORT_BASE + 10)) ;; sluice) p=$((PORT_BASE + 20)) ;; base) p=$((PORT_BASE + 30)) ;; esac
    PORT[$t]=$p
    if [ "$t" = nginx ]; then
        # h2_bench.sh's nginx conf, one process (no master): strace sees all of it
        nginx_conf "$WORK/ngx" "
    keepalive_timeout 60s;
    http2_max_concurrent_streams 128;
    upstream bench { server 127.0.0.1:$UP_PORT; keepalive 128; }
    server {
        listen 127.0.0.1:$p ssl http2;
        listen 127.0.0.1:$((p + 1));
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
        spawn taskset -c "$PROXY_CPU" "$NGINX_BIN" -p "$WORK/ngx/" -e "$WORK/ngx/error.log" -c "$WORK/ngx/nginx.conf"
    else
        h2_sluice_conf "$WORK/$t.yaml" "$p" "$UP_PORT"
        sed -i "s|^admin:|  - address: 127.0.0.1:$((p + 1))\nadmin:|" "$WORK/$t.yaml"
        bin=$SLUICE_BIN
        [ "$t" = base ] && bin=$SLUICE_BASE_BIN
        "$bin" -t -c "$WORK/$t.yaml" >/dev/null
        spawn taskset -c "$PROXY_CPU" "$bin" -c "$WORK/$t.yaml"
    fi
    PID[$t]=$LAST
    wait_port "$p" "$LAST"
    wait_port $((p + 1)) "$LAST"
done

# $1 target, $2 shape proto:CxM, $3 requests: one h2load run, every answer a 2xx.
load() {
    local proto=${2%%:*} cm=${2#*:} url opt=() body=$BODY
    local c=${cm%x*} m=${cm#*x} out
    case $proto in *sse) body=$SBODY ;; esac
    if [ "${proto%sse}" = h2 ]; then
        url=https://127.0.0.1:${PORT[$1]}/v1/chat/completions
    else
        url=http://127.0.0.1:$((${PORT[$1]} + 1))/v1/chat/completions
        opt=(--h1)
    fi
    out=$(taskset -c "$LOAD_CPU" h2load "${opt[@]}" -n "$3" -c "$c" -m "$m" -d "$body" \
        -H 'content-type: application/json' "$url" 2>&1)
    echo "$out" | grep -q "^status codes: $3 2xx" || { echo "bench: $1 $2: $out" >&2; exit 1; }
    [ "${proto%sse}" = h1 ] || echo "$out" | grep -qi 'application protocol: h2' ||
        { echo "bench: $1 did not speak h2" >&2; exit 1; }
}

# $1 target, $2 shape, $3 requests: strace's log of them, counted into $WORK/$1.$2.$3.cnt.
traced() {
    local f=$WORK/$1.${2/:/-}.$3 st _ port=${PORT[$1]}
    case ${2%%:*} in h1*) port=$((port + 1)) ;; esac
    strace -f -x -s 65536 -o "$f.log" -p "${PID[$1]}" 2>"$f.err" &
    st=$!
    for _ in $(seq 200); do grep -q attached "$f.err" && break; sleep 0.05; done
    load "$1" "$2" "$3"
    # the proxy has closed every client connection before the log stops
    for _ in $(seq 200); do
        [ -z "$(ss -Htn state established "( sport = :$port )")" ] && break
        sleep 0.05
    done
    sleep 0.2 # a close's epoll_ctl comes right after it
    kill -INT "$st"
    wait "$st" 2>/dev/null || true
    python3 "$ROOT/bench/syscalls.py" count "$f.log" >"$f.cnt"
    [ "${BENCH_KEEP:-0}" = 1 ] || rm -f "$f.log"
    echo "$f.cnt"
}

# Voluntary and involuntary context switches, minor faults, utime and stime
# (clock ticks), summed over the threads of $1.
snap() {
    local t v=0 n=0 f=0 u=0 k=0 a b
    for t in /proc/"$1"/task/*; do
        a=$(awk '/^voluntary_ctxt_switches/ { v = $2 } /^nonvoluntary_ctxt_switches/ { n = $2 } END { print v, n }' "$t/status")
        b=$(awk '{ sub(/^.*\) /, ""); print $8, $12, $13 }' "$t/stat")
        read -r tv tn <<<"$a"
        read -r tf tu tk <<<"$b"
        v=$((v + tv)) n=$((n + tn)) f=$((f + tf)) u=$((u + tu)) k=$((k + tk))
    done
    echo "$v $n $f $u $k"
}

# $1 target, $2 shape, $3 requests, untraced: "switches faults utime stime" deltas.
untraced() {
    local a b
    a=$(snap "${PID[$1]}")
    load "$1" "$2" "$3"
    b=$(snap "${PID[$1]}")
    echo "$a $b"
}

echo "system calls per request: $(date -u '+%Y-%m-%d %H:%M UTC'), commit" \
    "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'), $(strace -V | head -1)," \
    "$SHORT and $LONG requests per run"
ROWS=$WORK/rows
for s in $SHAPES; do
    cm=${s#*:}
    for t in $TARGETS; do
        load "$t" "$s" 200 # warm: upstream connections open
        a=$(traced "$t" "$s" "$SHORT")
        b=$(traced "$t" "$s" "$LONG")
        echo "$t $s $SHORT $LONG ${cm%x*} $a $b" >>"$ROWS"
        echo "$t $s $CPU_N $(untraced "$t" "$s" "$CPU_N")" >>"$ROWS.proc"
    done
done
python3 "$ROOT/bench/syscalls.py" table <"$ROWS"
echo
echo "untraced, $CPU_N requests (handshakes included; CPU split is tick-sampled: noisy under load, load $(cut -d' ' -f1-3 /proc/loadavg)):"
echo
echo "| shape | proxy | voluntary switches / req | involuntary / req | minor faults / req | user µs / req | kernel µs / req |"
echo "| --- | --- | ---: | ---: | ---: | ---: | ---: |"
awk -v tck="$(getconf CLK_TCK)" '{ n = $3
    printf "| %s | %s | %.2f | %.2f | %.3f | %.1f | %.1f |\n", $2, $1, ($9 - $4) / n, ($10 - $5) / n,
        ($11 - $6) / n, ($12 - $7) / tck * 1e6 / n, ($13 - $8) / tck * 1e6 / n }' "$ROWS.proc"
