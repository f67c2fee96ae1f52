#!/usr/bin/env bash
# bench/scale.sh — memory and upstream keep-alive as the number of client
# connections grows (issues #16, #21.4-5). Prints:
#   1. RSS per idle stream: nginx and each sluice binary, same run (1,000
#      streams held open through the proxy, as in bench/run.sh).
#   2. CPU per request (user and system) and the share of requests that
#      opened a new upstream connection at 32, 1,000 and 5,000 client
#      connections (wrk -c; nginx `return 200` upstream), each binary with
#      its DEFAULT keep-alive settings, and nginx as a proxy beside them,
#      interleaved per step, each measured run right after a warm-up run at
#      the same concurrency; the ratio to the 32 figure, for the whole run
#      (wrk's connects and closes included) and for its steady middle
#      (every connection open); then (2b) the growth from the first to the
#      last concurrency split into user and sys us per request, and the
#      kernel's share of it, per target.
#   3. RSS before the peak (after the 32-connection run), at the peak (max
#      sampled during the 5,000-connection run) and SCALE_SETTLE s after it.
#   4. A 1M-word list loaded, then reloaded (SIGHUP) 4 times: RSS after each.
#
# Binaries: SCALE_BINS="name=path ..." (default "sluice=build/sluice"), e.g.
#   SCALE_BINS="before=/tmp/base/sluice after=build/sluice" bench/scale.sh
# Knobs: SCALE_DURATION (s per wrk run, 5), SCALE_CONNS ("32 1000 5000"),
# SCALE_STREAMS (1000), SCALE_SETTLE (60), SCALE_WORDS (1000000),
# SCALE_PHASES ("1 2 4": which parts run; 3 comes with 2 unless
# SCALE_SETTLE is negative),
# SCALE_ROUNDS (1: rounds of part 2, all binaries and nginx interleaved in
# each; with more than one, a summary of medians and ranges follows),
# SCALE_NGINX (1: nginx as a proxy in part 2's rows, 0 to leave it out),
# SCALE_FLOOR (1: build/tools/floor_relay in part 2's rows, a relay that
# reads nothing — each client connection byte for byte to its own upstream
# connection — the least CPU per request any proxy pays here, and its own
# ratio from the first to the last concurrency; "run" figures only, it
# counts no requests; 0 to leave it out),
# SCALE_PERF (0; 1: `perf stat -p` on each measured run, its counts per
# request: syscalls by kind, context switches, page faults; the list is
# SCALE_PERF_EVENTS), SCALE_PERF_DIR (a folder: `perf record` of each
# steady window saved there as perf-NAME-cC-rR.data; SCALE_PERF_RECORD_OPTS
# adds options, e.g. "--call-graph dwarf"),
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
PHASES=${SCALE_PHASES:-1 2 4}
ROUNDS=${SCALE_ROUNDS:-1}
WITH_NGINX=${SCALE_NGINX:-1}
WITH_FLOOR=${SCALE_FLOOR:-1}
SCALE_PERF=${SCALE_PERF:-0}
PERF_DIR=${SCALE_PERF_DIR:-}
PERF_EVENTS=${SCALE_PERF_EVENTS:-raw_syscalls:sys_enter,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_epoll_ctl,syscalls:sys_enter_accept4,syscalls:sys_enter_close,syscalls:sys_enter_connect,syscalls:sys_enter_readv,syscalls:sys_enter_read,syscalls:sys_enter_writev,syscalls:sys_enter_write,syscalls:sys_enter_setsockopt,context-switches,page-faults}
phase() { [[ " $PHASES " == *" $1 "* ]]; }

UP_PORT=$((PORT_BASE + 1))   # nginx `return 200`
HOLD_PORT=$((PORT_BASE + 3)) # bench_upstream -H: holds streams open
NGINX_PORT=$((PORT_BASE + 10))
FLOOR_PORT=$((PORT_BASE + 11))

for c in wrk taskset curl python3 "$NGINX_BIN" "$TOOLS/bench_upstream" "$TOOLS/bench_ttfe"; do
    command -v "$c" >/dev/null || { echo "scale: $c missing" >&2; exit 1; }
done
# 5,000 clients, as many upstream connections, the listeners: raise the
# descriptor limit (root may raise the hard one too).
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"

WORK=$(mktemp -d /tmp/sluice-scale.XXXXXX)
. "$ROOT/bench/lib.sh"
ports_free $(seq $((PORT_BASE + 1)) $((PORT_BASE + 30)))

rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }

# Metric value from a sluice admin port ($1) for the exact series $2 (0 if absent).
metric() {
    curl -s "http://127.0.0.1:$1/metrics" | awk -v s="$2" '$1 == s { v = $2 } END { print v + 0 }'
}

write_sluice_conf() { # $1 dir, $2 port, $3 admin port, $4 upstream port, $5 extra yaml
    mkdir -p "$1"
    {
        echo "# every key not named here is its default (keep-alive pool included)"
        bench_sluice_conf "$2" "$4" "$3" - error
        printf '%s\n' "$5"
    } >"$1/sluice.yaml"
}

# nginx answering 200 with a fixed chat.completion, for any number of
# connections (30,000 a worker).
start_upstream() {
    scale_upstream_conf "$WORK/up" "$UP_PORT"
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
if phase 1; then
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
fi

# ---- 2./3. CPU per request, new upstream connections, RSS over a peak ----
# nginx as a proxy beside sluice in part 2 (SCALE_NGINX=1): the same client
# and upstream, upstream keep-alive large enough that it never closes an
# idle connection, one worker pinned like sluice. Its ratio 5,000 / 32 is
# what the kernel and an event loop cost at that many connections.
start_proxy_nginx() {
    scale_proxy_conf "$WORK/np" "$NGINX_PORT" "$UP_PORT"
    spawn taskset -c "$PROXY_CPU" "$NGINX_BIN" -p "$WORK/np/" -e "$WORK/np/error.log" \
        -c "$WORK/np/nginx.conf"
    NP_MASTER=$LAST
    wait_port "$NGINX_PORT" "$NP_MASTER"
    NP_WORKER=$(pgrep -P "$NP_MASTER" | head -n1)
}

# utime and stime of process $1 in clock ticks: "user sys".
cpu_split() {
    awk '{ sub(/^.*\) /, ""); printf "%d %d\n", $12, $13 }' "/proc/$1/stat"
}

# Requests the target served so far: sluice's request counter (every
# series), nginx's stub_status.
# Empty when it could not be read (then the steady figure is "n/a").
served() {
    if [ "$1" = floor ]; then
        return 0
    elif [ "$1" = nginx ]; then
        { curl -s --max-time 5 "http://127.0.0.1:$NGINX_PORT/nginx_status" || true; } |
            awk 'NR == 3 { print $3 }'
    else
        { curl -s --max-time 5 "http://127.0.0.1:${APORT[$1]}/metrics" || true; } |
            awk '/^sluice_requests_total[{ ]/ { v += $NF; n++ } END { if (n) printf "%d\n", v }'
    fi
}

# CPU in us per request from user ticks $1, system ticks $2, requests $3:
# "total user sys".
per_req() {
    awk -v u="$1" -v s="$2" -v r="$3" -v k="$TCK" 'BEGIN { if (r < 1) r = 1
        printf "%.1f %.1f %.1f\n", (u + s) * 1e6 / k / r, u * 1e6 / k / r, s * 1e6 / k / r }'
}

median() {
    grep -v '^n/a$' | sort -g | awk '{ v[NR] = $1 }
        END { if (!NR) print "n/a"; else if (NR % 2) print v[(NR + 1) / 2]
              else printf "%.2f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
range() { grep -v '^n/a$' | sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { print NR ? lo "-" hi : "n/a" }'; }

if phase 2; then
    start_upstream
    for n in "${names[@]}"; do start_sluice "$n" "$UP_PORT"; done
    targets=("${names[@]}")
    if [ "$WITH_NGINX" = 1 ]; then
        start_proxy_nginx
        targets+=(nginx)
        PORT[nginx]=$NGINX_PORT
        PID[nginx]=$NP_WORKER
    fi
    if [ "$WITH_FLOOR" = 1 ]; then
        spawn taskset -c "$PROXY_CPU" "$TOOLS/floor_relay" -l "127.0.0.1:$FLOOR_PORT" \
            -u "127.0.0.1:$UP_PORT"
        FLOOR_PID=$LAST
        wait_port "$FLOOR_PORT" "$FLOOR_PID"
        targets+=(floor)
        PORT[floor]=$FLOOR_PORT
        PID[floor]=$FLOOR_PID
    fi
    for n in "${targets[@]}"; do
        taskset -c "$LOAD_CPU" wrk -t1 -c1 -d1s -s "$ROOT/bench/post.lua" \
            "http://127.0.0.1:${PORT[$n]}/v1/chat/completions" >/dev/null
    done
    NEWS='sluice_upstream_connections_total{upstream="main",reused="false"}'
    C0=${CONNS%% *}
    TCK=$(getconf CLK_TCK)
    declare -A CPU0 STEADY0 RSS_PRE RSS_PEAK PEAK_END
    : >"$WORK/rows"
    echo "2. CPU per request and new upstream connections (wrk -t1 -d${DURATION}s, default" \
        "keep-alive, $ROUNDS round(s), targets interleaved per step):"
    for round in $(seq "$ROUNDS"); do
        for c in $CONNS; do
            for n in "${targets[@]}"; do
                pid=${PID[$n]}
                # A warm-up run at this concurrency first (as long as the
                # measured one): the pool's first fill is not the steady
                # state; the measured run follows at once.
                taskset -c "$LOAD_CPU" wrk -t1 -c"$c" -d"${DURATION}s" --timeout 10s \
                    -s "$ROOT/bench/post.lua" "http://127.0.0.1:${PORT[$n]}/v1/chat/completions" \
                    >/dev/null 2>&1 || true
                read -r u0 s0 < <(cpu_split "$pid")
                o0=0
                [ "$n" = nginx ] || [ "$n" = floor ] || o0=$(metric "${APORT[$n]}" "$NEWS")
                # The measured run lasts 2 x SCALE_DURATION. "run" is all of
                # it: wrk's $c connects at its start and closes at its end
                # included (at 5,000 connections a connection carries only a
                # few requests in a run). "steady" is its middle
                # SCALE_DURATION, every connection open: counted from the
                # target's own request counter and CPU ticks.
                taskset -c "$LOAD_CPU" wrk -t1 -c"$c" -d"$((2 * DURATION))s" --timeout 10s \
                    -s "$ROOT/bench/post.lua" "http://127.0.0.1:${PORT[$n]}/v1/chat/completions" \
                    >"$WORK/wrk.out" 2>&1 &
                wp=$!
                sleep "$(awk -v d="$DURATION" 'BEGIN { print d / 2 }')"
                read -r su0 ss0 < <(cpu_split "$pid")
                q0=$(served "$n")
                pp=
                if [ "$SCALE_PERF" = 1 ]; then
                    perf stat -x, -o "$WORK/perf.out" -e "$PERF_EVENTS" -p "$pid" \
                        -- sleep "$DURATION" 2>/dev/null &
                    pp=$!
                fi
                rp=
                if [ -n "$PERF_DIR" ]; then
                    perf record -q -F 1999 ${SCALE_PERF_RECORD_OPTS:-} -o "$PERF_DIR/perf-$n-c$c-r$round.data" \
                        -p "$pid" -- sleep "$DURATION" >/dev/null 2>&1 &
                    rp=$!
                fi
                peak=0
                t_end=$(($(date +%s%N) + DURATION * 1000000000))
                while [ "$(date +%s%N)" -lt "$t_end" ]; do
                    r=$(rss_kib "$pid")
                    [ "$r" -gt "$peak" ] && peak=$r
                    sleep 0.2
                done
                read -r su1 ss1 < <(cpu_split "$pid")
                q1=$(served "$n")
                while kill -0 "$wp" 2>/dev/null; do
                    r=$(rss_kib "$pid")
                    [ "$r" -gt "$peak" ] && peak=$r
                    sleep 0.2
                done
                wait "$wp" || true
                if [ -n "$rp" ]; then
                    wait "$rp" || true
                    echo "    $n c=$c steady: $((${q1:-0} - ${q0:-0})) requests; profile" \
                        "$PERF_DIR/perf-$n-c$c-r$round.data"
                fi
                read -r u1 s1 < <(cpu_split "$pid")
                o1=0
                [ "$n" = nginx ] || [ "$n" = floor ] || o1=$(metric "${APORT[$n]}" "$NEWS")
                if [ -n "$pp" ]; then
                    wait "$pp" || true
                    # "name per request" for each counted event (steady
                    # window); the events each epoll_wait returned are not
                    # counted, only the waits.
                    perfs=$(awk -F, -v r=$((${q1:-0} - ${q0:-0})) '$3 != "" && $1 ~ /^[0-9.]+$/ {
                        n = $3; sub(/^.*:sys_enter_/, "", n); sub(/^raw_syscalls:sys_enter/, "syscalls", n)
                        printf "%s %.3f, ", n, r ? $1 / r : 0 }' "$WORK/perf.out")
                    echo "    $n c=$c steady, per request: ${perfs%, }"
                fi
                line=$(grep '^BENCH ' "$WORK/wrk.out") || { cat "$WORK/wrk.out" >&2; exit 1; }
                reqs=$(sed 's/.*requests=\([0-9]*\).*/\1/' <<<"$line")
                durus=$(sed 's/.*duration_us=\([0-9]*\).*/\1/' <<<"$line")
                errs=$(sed 's/.*errors=\([0-9]*\) non2xx=\([0-9]*\).*/\1+\2/' <<<"$line")
                read -r us uus sus < <(per_req $((u1 - u0)) $((s1 - s0)) "$reqs")
                # A counter that could not be read, or a window with a tenth
                # of the run's rate or less (the read itself stalled): no
                # steady figure rather than a wrong one.
                if [ -n "$q0" ] && [ -n "$q1" ] && [ $((q1 - q0)) -gt 0 ] &&
                    [ $((10 * (q1 - q0) * 2)) -gt "$reqs" ]; then
                    read -r st sut sst < <(per_req $((su1 - su0)) $((ss1 - ss0)) $((q1 - q0)))
                    steady_n=$((q1 - q0))
                else
                    st=n/a sut=n/a sst=n/a steady_n=n/a
                fi
                if [ "$c" = "$C0" ]; then
                    CPU0[$n]=$us
                    STEADY0[$n]=$st
                fi
                ratio=$(awk -v a="$us" -v b="${CPU0[$n]}" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
                sratio=n/a
                if [ "$st" != n/a ] && [ "${STEADY0[$n]}" != n/a ]; then
                    sratio=$(awk -v a="$st" -v b="${STEADY0[$n]}" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
                fi
                rps=$(awk -v r="$reqs" -v d="$durus" 'BEGIN { printf "%.0f", d ? r * 1e6 / d : 0 }')
                echo "$n $c $us $uus $sus $ratio $st $sut $sst $sratio" >>"$WORK/rows"
                if [ "$n" = nginx ] || [ "$n" = floor ]; then
                    news="-"
                else
                    news="$((o1 - o0)) = $(awk -v o=$((o1 - o0)) -v r="$reqs" \
                        'BEGIN { printf "%.1f", r ? 100 * o / r : 0 }')%"
                fi
                echo "  r$round $n c=$c: run: $reqs requests ($rps/s, errors $errs), CPU $us us/request" \
                    "(user $uus, sys $sus; $ratio x c=$C0); steady: $steady_n requests, CPU $st us/request" \
                    "(user $sut, sys $sst; $sratio x c=$C0); new upstream connections $news," \
                    "RSS max $peak KiB [load $(cut -d' ' -f1 /proc/loadavg)]"
                if [ "$round" = 1 ] && [ "$c" = "$C0" ]; then RSS_PRE[$n]=$(rss_kib "$pid"); fi
                RSS_PEAK[$n]=$peak
                PEAK_END[$n]=$(date +%s)
            done
        done
    done
    if [ "$ROUNDS" -gt 1 ]; then
        echo "2a. medians over $ROUNDS rounds (min-max): CPU us/request (user, sys); ratio to c=$C0"
        for n in "${targets[@]}"; do
            for c in $CONNS; do
                col() { awk -v n="$n" -v c="$c" -v k="$1" '$1 == n && $2 == c { print $k }' "$WORK/rows"; }
                echo "  $n c=$c: run $(col 3 | median) ($(col 3 | range)) us, user $(col 4 | median)," \
                    "sys $(col 5 | median), ratio $(col 6 | median) ($(col 6 | range)); steady" \
                    "$(col 7 | median) ($(col 7 | range)) us, user $(col 8 | median), sys $(col 9 | median)," \
                    "ratio $(col 10 | median) ($(col 10 | range))"
            done
        done
    fi
    # The growth split: of the CPU a request gains from the first to the
    # last concurrency, how much is the kernel's (sys: sockets, epoll, the
    # same work for any proxy) and how much user space (ours); medians of
    # the steady figures, the run's in brackets.
    CL=${CONNS##* }
    echo "2b. growth c=$C0 -> c=$CL, medians over $ROUNDS round(s): user and sys us/request," \
        "steady (run)"
    for n in "${targets[@]}"; do
        med() { awk -v n="$n" -v c="$1" -v k="$2" '$1 == n && $2 == c { print $k }' "$WORK/rows" | median; }
        awk -v n="$n" -v su0="$(med "$C0" 8)" -v su1="$(med "$CL" 8)" -v ss0="$(med "$C0" 9)" \
            -v ss1="$(med "$CL" 9)" -v ru0="$(med "$C0" 4)" -v ru1="$(med "$CL" 4)" \
            -v rs0="$(med "$C0" 5)" -v rs1="$(med "$CL" 5)" 'function g(a, b) {
                return (a == "n/a" || b == "n/a") ? "n/a" : sprintf("%+.1f", b - a) }
            function sh(du, ds) {
                if (du == "n/a" || ds == "n/a" || du + ds <= 0) return "n/a"
                return sprintf("%.0f%%", 100 * ds / (du + ds)) }
            BEGIN { printf "  %s: user %s -> %s (%s), sys %s -> %s (%s); the kernel'\''s share of" \
                " the growth %s (run: user %s -> %s, sys %s -> %s, %s)\n", n, su0, su1, g(su0, su1),
                ss0, ss1, g(ss0, ss1), sh(g(su0, su1), g(ss0, ss1)), ru0, ru1, rs0, rs1,
                sh(g(ru0, ru1), g(rs0, rs1)) }'
    done
    if [ "$WITH_NGINX" = 1 ]; then stop "$NP_MASTER"; fi
    if [ "$WITH_FLOOR" = 1 ]; then stop "$FLOOR_PID"; fi
    if [ "$SETTLE" -ge 0 ]; then
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
    fi
    for n in "${names[@]}"; do stop "${PID[$n]}"; done
fi

# ---- 4. a 1M-word list, reloaded -----------------------------------------
if phase 4; then
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
fi
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
