#!/usr/bin/env bash
# bench/scale.sh — memory and upstream keep-alive as the number of client
# connections grows (issues #16, #21.4-5). Prints:
#   1. RSS per idle stream: nginx and each sluice binary, same run (1,000
#      streams held open through the proxy, as in bench/run.sh).
#   2. CPU per request and the share of requests that opened a new upstream
#      connection at 32, 1,000 and 5,000 client connections (wrk -c; nginx
#      `return 200` upstream), each binary with its DEFAULT keep-alive
#      settings, binaries interleaved per step, each measured run right
#      after a warm-up run at the same concurrency; the ratio to the 32
#      figure.
#   3. RSS before the peak (after the 32-connection run), at the peak (max
#      sampled during the 5,000-connection run) and SCALE_SETTLE s after it.
#   4. A 1M-word list loaded, then reloaded (SIGHUP) 4 times: RSS after each.
#
# Binaries: SCALE_BINS="name=path ..." (default "sluice=build/sluice"), e.g.
#   SCALE_BINS="before=/tmp/base/sluice after=build/sluice" bench/scale.sh
# Knobs: SCALE_DURATION (s per wrk run, 5), SCALE_CONNS ("32 1000 5000"),
# SCALE_STREAMS (1000), SCALE_SETTLE (60), SCALE_WORDS (1000000),
# BENCH_PROXY_CPU / BENCH_LOAD_CPU, BENCH_PORT_BASE, BENCH_KEEP=1.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
TOOLS=${BENCH_TOOLS:-$ROOT/build/tools}
NGINX_BIN=${NGINX_BIN:-$(command -v nginx || echo /usr/sbin/nginx)}
PROXY_CPU=${BENCH_PROXY_CPU:-1}
LOAD_CPU=${BENCH_LOAD_CPU:-0}
PORT_BASE=${BENCH_PORT_BASE:-31700}
DURATION=${SCALE_DURATION:-5}
CONNS=${SCALE_CONNS:-32 1000 5000}
STREAMS=${SCALE_STREAMS:-1000}
SETTLE=${SCALE_SETTLE:-60}
WORDS=${SCALE_WORDS:-1000000}
BINS=${SCALE_BINS:-sluice=$ROOT/build/sluice}

UP_PORT=$((PORT_BASE + 1))   # nginx `return 200`
HOLD_PORT=$((PORT_BASE + 3)) # bench_upstream -H: holds streams open
NGINX_PORT=$((PORT_BASE + 10))

for c in wrk taskset curl python3 "$NGINX_BIN" "$TOOLS/bench_upstream" "$TOOLS/bench_ttfe"; do
    command -v "$c" >/dev/null || { echo "scale: $c missing" >&2; exit 1; }
done
for p in $(seq $((PORT_BASE + 1)) $((PORT_BASE + 30))); do
    if (exec 3<>/dev/tcp/127.0.0.1/"$p") 2>/dev/null; then
        echo "scale: port $p is in use (set BENCH_PORT_BASE)" >&2
        exit 1
    fi
done
# 5,000 clients, as many upstream connections, the listeners: raise the
# descriptor limit (root may raise the hard one too).
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"

WORK=$(mktemp -d /tmp/sluice-scale.XXXXXX)
. "$ROOT/bench/lib.sh"

rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }

# Metric value from a sluice admin port ($1) for the exact series $2 (0 if absent).
metric() {
    curl -s "http://127.0.0.1:$1/metrics" | awk -v s="$2" '$1 == s { v = $2 } END { print v + 0 }'
}

write_sluice_conf() { # $1 dir, $2 port, $3 admin port, $4 upstream port, $5 extra yaml
    mkdir -p "$1"
    cat >"$1/sluice.yaml" <<EOF
# every key not named here is its default (keep-alive pool included)
listen:
  - address: 127.0.0.1:$2
admin:
  address: 127.0.0.1:$3
workers: 1
upstreams:
  main:
    servers:
      - url: "http://127.0.0.1:$4"
models:
  bench-model: { upstream: main }
log:
  access: "off"
  level: error
$5
EOF
}

# nginx answering 200 with a fixed chat.completion, for any number of
# connections (lib.sh's has 4,096).
start_upstream() {
    mkdir -p "$WORK/up/tmp"
    cat >"$WORK/up/nginx.conf" <<EOF
worker_processes 1;
daemon off;
pid $WORK/up/nginx.pid;
error_log $WORK/up/error.log error;
worker_rlimit_nofile 60000;
events { worker_connections 30000; }
http {
    access_log off;
    keepalive_requests 1000000;
    keepalive_timeout 300s;
    client_body_temp_path $WORK/up/tmp/body;
    proxy_temp_path $WORK/up/tmp/proxy;
    fastcgi_temp_path $WORK/up/tmp/fastcgi;
    uwsgi_temp_path $WORK/up/tmp/uwsgi;
    scgi_temp_path $WORK/up/tmp/scgi;
    server {
        listen 127.0.0.1:$UP_PORT backlog=8192;
        location / {
            default_type application/json;
            return 200 '{"id":"chatcmpl-bench","object":"chat.completion","created":0,"model":"bench-model","choices":[{"index":0,"message":{"role":"assistant","content":"Hello! How can I help?"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":7,"total_tokens":16}}';
        }
    }
}
EOF
    spawn taskset -c "$LOAD_CPU" "$NGINX_BIN" -p "$WORK/up/" -e "$WORK/up/error.log" \
        -c "$WORK/up/nginx.conf"
    wait_port "$UP_PORT" "$LAST"
}

echo "sluice scale bench: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores," \
    "load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'); binaries: $BINS"

names=()
declare -A BIN PORT APORT PID
i=0
for nb in $BINS; do
    n=${nb%%=*}
    names+=("$n")
    BIN[$n]=${nb#*=}
    [ -x "${BIN[$n]}" ] || { echo "scale: ${BIN[$n]} missing" >&2; exit 1; }
    PORT[$n]=$((PORT_BASE + 20 + 2 * i))
    APORT[$n]=$((PORT_BASE + 21 + 2 * i))
    i=$((i + 1))
done

start_sluice() { # $1 name, $2 upstream port, $3 extra yaml
    local d=$WORK/s-$1
    write_sluice_conf "$d" "${PORT[$1]}" "${APORT[$1]}" "$2" "${3:-}"
    spawn taskset -c "$PROXY_CPU" "${BIN[$1]}" -c "$d/sluice.yaml"
    PID[$1]=$LAST
    wait_port "${PORT[$1]}" "$LAST"
    wait_port "${APORT[$1]}" "$LAST"
    # Listening is not running: /healthz answers once the main loop (and
    # its signal handlers, for the reloads of phase 4) is up.
    local _
    for _ in $(seq 400); do
        curl -sf "http://127.0.0.1:${APORT[$1]}/healthz" >/dev/null && return 0
        sleep 0.05
    done
    echo "scale: sluice $1 not ready" >&2
    exit 1
}

# ---- 1. RSS per idle stream ----------------------------------------------
spawn taskset -c "$LOAD_CPU" "$TOOLS/bench_upstream" -l "127.0.0.1:$HOLD_PORT" -H
HOLD_UP=$LAST
wait_port "$HOLD_PORT" "$HOLD_UP"
mkdir -p "$WORK/ng/tmp"
cat >"$WORK/ng/nginx.conf" <<EOF
worker_processes 1;
daemon off;
pid $WORK/ng/nginx.pid;
error_log $WORK/ng/error.log warn;
worker_rlimit_nofile $((STREAMS * 4 + 1000));
events { worker_connections $((STREAMS * 2 + 1000)); }
http {
    access_log off;
    keepalive_timeout 60s;
    client_body_temp_path $WORK/ng/tmp/body;
    proxy_temp_path $WORK/ng/tmp/proxy;
    fastcgi_temp_path $WORK/ng/tmp/fastcgi;
    uwsgi_temp_path $WORK/ng/tmp/uwsgi;
    scgi_temp_path $WORK/ng/tmp/scgi;
    upstream bench { server 127.0.0.1:$HOLD_PORT; keepalive 64; }
    server {
        listen 127.0.0.1:$NGINX_PORT;
        location / {
            proxy_pass http://bench;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }
    }
}
EOF
spawn taskset -c "$PROXY_CPU" "$NGINX_BIN" -p "$WORK/ng/" -e "$WORK/ng/error.log" -c "$WORK/ng/nginx.conf"
NG_MASTER=$LAST
wait_port "$NGINX_PORT" "$NG_MASTER"
NG_WORKER=$(pgrep -P "$NG_MASTER" | head -n1)
for n in "${names[@]}"; do start_sluice "$n" "$HOLD_PORT"; done

echo "1. RSS per idle stream ($STREAMS streams held open):"
declare -A PER
for t in nginx "${names[@]}"; do
    if [ "$t" = nginx ]; then port=$NGINX_PORT pid=$NG_WORKER; else port=${PORT[$t]} pid=${PID[$t]}; fi
    taskset -c "$LOAD_CPU" wrk -t1 -c1 -d1s -s "$ROOT/bench/post.lua" \
        "http://127.0.0.1:$port/v1/chat/completions" >/dev/null
    before=$(rss_kib "$pid")
    coproc HOLD { exec taskset -c "$LOAD_CPU" "$TOOLS/bench_ttfe" -c "127.0.0.1:$port" \
        -H "$STREAMS" -t 120; }
    # shellcheck disable=SC2153 # HOLD_PID is set by coproc
    hp=$HOLD_PID
    PIDS+=("$hp")
    if ! read -r -t 60 ready <&"${HOLD[0]}" || [ "$ready" != "ready $STREAMS" ]; then
        echo "scale: holding $STREAMS streams through $t failed" >&2
        exit 1
    fi
    after=$(rss_kib "$pid")
    stop "$hp"
    PER[$t]=$(awk -v a="$after" -v b="$before" -v n="$STREAMS" 'BEGIN { printf "%.1f", (a - b) / n }')
    echo "  $t: VmRSS $before -> $after KiB: ${PER[$t]} KiB per stream" \
        "($(awk -v x="${PER[$t]}" -v y="${PER[nginx]}" 'BEGIN { printf "%.2f", x / y }') x nginx)"
done
for n in "${names[@]}"; do stop "${PID[$n]}"; done
stop "$NG_MASTER"
stop "$HOLD_UP"

# ---- 2./3. CPU per request, new upstream connections, RSS over a peak ----
start_upstream
for n in "${names[@]}"; do start_sluice "$n" "$UP_PORT"; done
for n in "${names[@]}"; do
    taskset -c "$LOAD_CPU" wrk -t1 -c1 -d1s -s "$ROOT/bench/post.lua" \
        "http://127.0.0.1:${PORT[$n]}/v1/chat/completions" >/dev/null
done
NEWS='sluice_upstream_connections_total{upstream="main",reused="false"}'
declare -A CPU0 RSS_PRE RSS_PEAK PEAK_END
echo "2. CPU per request and new upstream connections (wrk -t1 -d${DURATION}s, default keep-alive):"
for c in $CONNS; do
    for n in "${names[@]}"; do
        pid=${PID[$n]}
        # A warm-up run at this concurrency first (as long as the measured
        # one): the pool's first fill is not the steady state; the measured
        # run follows at once.
        taskset -c "$LOAD_CPU" wrk -t1 -c"$c" -d"${DURATION}s" --timeout 10s -s "$ROOT/bench/post.lua" \
            "http://127.0.0.1:${PORT[$n]}/v1/chat/completions" >/dev/null 2>&1 || true
        t0=$(cpu_ticks "$pid")
        o0=$(metric "${APORT[$n]}" "$NEWS")
        taskset -c "$LOAD_CPU" wrk -t1 -c"$c" -d"${DURATION}s" --timeout 10s \
            -s "$ROOT/bench/post.lua" "http://127.0.0.1:${PORT[$n]}/v1/chat/completions" \
            >"$WORK/wrk.out" 2>&1 &
        wp=$!
        peak=0
        while kill -0 "$wp" 2>/dev/null; do
            r=$(rss_kib "$pid")
            [ "$r" -gt "$peak" ] && peak=$r
            sleep 0.2
        done
        wait "$wp" || true
        t1=$(cpu_ticks "$pid")
        o1=$(metric "${APORT[$n]}" "$NEWS")
        line=$(grep '^BENCH ' "$WORK/wrk.out") || { cat "$WORK/wrk.out" >&2; exit 1; }
        reqs=$(sed 's/.*requests=\([0-9]*\).*/\1/' <<<"$line")
        errs=$(sed 's/.*errors=\([0-9]*\) non2xx=\([0-9]*\).*/\1+\2/' <<<"$line")
        us=$(awk -v t=$((t1 - t0)) -v r="$reqs" -v k="$(getconf CLK_TCK)" \
            'BEGIN { printf "%.1f", r ? t * 1e6 / k / r : 0 }')
        [ -z "${CPU0[$n]:-}" ] && CPU0[$n]=$us
        share=$(awk -v o=$((o1 - o0)) -v r="$reqs" 'BEGIN { printf "%.1f", r ? 100 * o / r : 0 }')
        echo "  $n c=$c: $reqs requests (errors $errs), CPU $us us/request" \
            "($(awk -v a="$us" -v b="${CPU0[$n]}" 'BEGIN { printf "%.2f", a / b }') x c=${CONNS%% *})," \
            "new upstream connections $((o1 - o0)) = $share% of requests, RSS max $peak KiB"
        if [ "$c" = "${CONNS%% *}" ]; then RSS_PRE[$n]=$(rss_kib "$pid"); fi
        RSS_PEAK[$n]=$peak
        PEAK_END[$n]=$(date +%s)
    done
done
echo "3. RSS over the peak (${CONNS##* } connections):"
for n in "${names[@]}"; do
    left=$((PEAK_END[$n] + SETTLE - $(date +%s)))
    [ "$left" -gt 0 ] && sleep "$left"
    after=$(rss_kib "${PID[$n]}")
    trims=$(metric "${APORT[$n]}" sluice_malloc_trims_total)
    echo "  $n: before ${RSS_PRE[$n]} KiB, peak ${RSS_PEAK[$n]} KiB, ${SETTLE}s after $after KiB" \
        "($(awk -v a="$after" -v b="${RSS_PRE[$n]}" 'BEGIN { printf "%.2f", a / b }') x before;" \
        "malloc trims $trims)"
done
for n in "${names[@]}"; do stop "${PID[$n]}"; done

# ---- 4. a 1M-word list, reloaded -----------------------------------------
awk -v n="$WORDS" 'BEGIN { for (i = 0; i < n; i++) printf "w%07dx%d\n", i, i % 97 }' >"$WORK/words.txt"
echo "4. $WORDS-word list: RSS at start and after each of 4 reloads (SIGHUP):"
for n in "${names[@]}"; do
    start_sluice "$n" "$UP_PORT" "filters:
  words: [ { file: $WORK/words.txt, action: mask } ]"
    seq_=$(rss_kib "${PID[$n]}")
    for k in 1 2 3 4; do
        kill -HUP "${PID[$n]}"
        for _ in $(seq 600); do
            [ "$(metric "${APORT[$n]}" 'sluice_config_reloads_total{result="ok"}')" -ge "$k" ] && break
            sleep 0.1
        done
        sleep 3 # the old ruleset is freed by its last user, then trimmed
        seq_="$seq_ -> $(rss_kib "${PID[$n]}")"
    done
    echo "  $n: $seq_ KiB"
    stop "${PID[$n]}"
done
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
