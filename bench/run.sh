#!/usr/bin/env bash
# bench/run.sh — sluice against nginx and direct, on one machine (`make bench`).
#
# What runs where (a 2-core machine; override with BENCH_PROXY_CPU and
# BENCH_LOAD_CPU):
#   core 1: the proxy under test, alone: nginx (master + 1 worker) or
#           sluice (workers: 1; all its threads)
#   core 0: the mock upstream (build/tools/bench_upstream, single-threaded),
#           the load generator (wrk -t1) and the SSE client (bench_ttfe)
# Everything talks over loopback. Both proxies keep upstream connections
# alive (64 idle), stream without buffering, and write no access log
# (nginx: access_log off; sluice: log.access: off); error logs at warn.
#
# Phases:
#   1. throughput: wrk with a POST body (bench/post.lua), two workloads:
#      "json" (a plain chat.completion answer) and "sse" (a stream of 8
#      events + [DONE], written at once by the upstream). Targets are run in
#      INTERLEAVED rounds (direct, nginx, sluice, direct, ...) so machine
#      noise hits all alike. Per run: requests/s, p50/p99 latency (wrk
#      --latency), and the proxy's CPU time per completed request from
#      /proc/PID/stat utime+stime (clock ticks; cross-checked with the
#      nanosecond run time in /proc/PID/task/*/schedstat).
#   2. SSE time to first event (bench_ttfe), direct / nginx / sluice,
#      interleaved rounds, each round starting at the next target; the
#      upstream sends the first event at once and the next one 1 ms later.
#   3. RSS per idle stream: fresh proxies; 1,000 streams held open through
#      each (bench_upstream -H), VmRSS before and after.
# Every figure is also given as a ratio to nginx's figure of the same run.
#
# Knobs: BENCH_QUICK=1 (about a minute), BENCH_DURATION (s per wrk run),
# BENCH_ROUNDS (>= 3), BENCH_CONNS (wrk connections), BENCH_TTFE_N
# (requests per target per round), BENCH_STREAMS (idle streams),
# BENCH_PORT_BASE, SLUICE_BIN, BENCH_TOOLS (dir of bench_upstream and
# bench_ttfe), BENCH_COMMIT (label when $ROOT is no git checkout),
# BENCH_KEEP=1 keeps the work directory, BENCH_PERF=1 adds a perf profile
# of sluice on the json workload at the end, BENCH_PHASES (default
# "tput ttfe rss": the phases to run, e.g. BENCH_PHASES=ttfe), SLUICE_BIN_B
# (a second sluice binary, target "sluice_b": before/after in one run).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SLUICE_BIN=${SLUICE_BIN:-$ROOT/build/sluice}
TOOLS=${BENCH_TOOLS:-$ROOT/build/tools}
NGINX_BIN=${NGINX_BIN:-$(command -v nginx || echo /usr/sbin/nginx)}
PROXY_CPU=${BENCH_PROXY_CPU:-1}
LOAD_CPU=${BENCH_LOAD_CPU:-0}
PORT_BASE=${BENCH_PORT_BASE:-28400}
if [ "${BENCH_QUICK:-0}" = 1 ]; then
    DURATION=${BENCH_DURATION:-2}
    TTFE_N=${BENCH_TTFE_N:-200}
else
    DURATION=${BENCH_DURATION:-10}
    TTFE_N=${BENCH_TTFE_N:-600}
fi
ROUNDS=${BENCH_ROUNDS:-3}
CONNS=${BENCH_CONNS:-32}
STREAMS=${BENCH_STREAMS:-1000}
TARGETS="direct nginx sluice"
PHASES=${BENCH_PHASES:-tput ttfe rss}
SLUICE_BIN_B=${SLUICE_BIN_B:-}
[ -n "$SLUICE_BIN_B" ] && TARGETS="$TARGETS sluice_b"
phase() { case " $PHASES " in *" $1 "*) return 0 ;; esac; return 1; }

UP_PORT=$((PORT_BASE + 1))     # upstream for the throughput phase
TTFE_PORT=$((PORT_BASE + 2))   # upstream with 1 ms between events
HOLD_PORT=$((PORT_BASE + 3))   # upstream that holds streams open
NGINX_PORT=$((PORT_BASE + 10))
SLUICE_PORT=$((PORT_BASE + 20))
SLUICE_B_PORT=$((PORT_BASE + 21))

for f in "$SLUICE_BIN" "$TOOLS/bench_upstream" "$TOOLS/bench_ttfe"; do
    [ -x "$f" ] || { echo "bench: $f missing (run make)" >&2; exit 1; }
done
for c in wrk taskset python3 "$NGINX_BIN"; do
    command -v "$c" >/dev/null || { echo "bench: $c not installed" >&2; exit 1; }
done
if [ "$(($(ulimit -n) + 0))" -lt $((STREAMS + 100)) ]; then
    ulimit -n $((STREAMS * 2 + 100))
fi

WORK=$(mktemp -d /tmp/sluice-bench.XXXXXX)
RES=$WORK/results.tsv
. "$ROOT/bench/lib.sh"
ports_free "$UP_PORT" "$TTFE_PORT" "$HOLD_PORT" "$NGINX_PORT" "$SLUICE_PORT"

CLK_TCK=$(getconf CLK_TCK)

# On-CPU time in ns from the scheduler, summed over every thread.
cpu_ns() {
    local p
    for p in "$@"; do cat /proc/"$p"/task/*/schedstat; done | awk '{ s += $1 } END { printf "%.0f\n", s }'
}

rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }

# The CPU-time clock: a busy loop's utime+stime must match its own
# CLOCK_PROCESS_CPUTIME_ID (python's process_time) over half a second.
check_clock() {
    taskset -c "$PROXY_CPU" python3 - "$CLK_TCK" <<'EOF'
import sys, time
tck = int(sys.argv[1])
def ticks():
    f = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12])
a, t = ticks(), time.process_time()
while time.process_time() - t < 0.5:
    pass
dt, dk = time.process_time() - t, (ticks() - a) / tck
ok = abs(dk - dt) <= 2.0 / tck + 0.02 * dt
print(f"clock check: CLK_TCK={tck}, busy loop {dt*1e3:.0f} ms by process_time, "
      f"{dk*1e3:.0f} ms by /proc utime+stime: {'ok' if ok else 'MISMATCH'}")
sys.exit(0 if ok else 1)
EOF
}

write_nginx_conf() { # $1 dir, $2 upstream port
    mkdir -p "$1/tmp"
    cat >"$1/nginx.conf" <<EOF
# nginx as a plain reverse proxy, set up like sluice (bench/run.sh).
worker_processes 1;
daemon off;
master_process on;
pid $1/nginx.pid;
error_log $1/error.log warn;
worker_rlimit_nofile $((STREAMS * 4 + 1000));
events { worker_connections $((STREAMS * 2 + 1000)); }
http {
    access_log off;
    default_type application/octet-stream;
    keepalive_timeout 60s;
    keepalive_requests 1000;
    client_body_temp_path $1/tmp/body;
    proxy_temp_path $1/tmp/proxy;
    fastcgi_temp_path $1/tmp/fastcgi;
    uwsgi_temp_path $1/tmp/uwsgi;
    scgi_temp_path $1/tmp/scgi;
    upstream bench {
        server 127.0.0.1:$2;
        keepalive 64;
    }
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
}

write_sluice_conf() { # $1 dir, $2 upstream port, $3 listen port
    mkdir -p "$1"
    {
        echo "# sluice set up like nginx (bench/run.sh); every other key is its default."
        bench_sluice_conf "${3:-$SLUICE_PORT}" "$2"
    } >"$1/sluice.yaml"
}

# Starts nginx and sluice on $PROXY_CPU in front of the upstream on port $1;
# sets NGINX_PIDS (master, worker), NGINX_WORKER and SLUICE_PID.
start_proxies() {
    local d=$WORK/$2
    write_nginx_conf "$d/nginx" "$1"
    write_sluice_conf "$d/sluice" "$1"
    spawn taskset -c "$PROXY_CPU" "$NGINX_BIN" -p "$d/nginx/" -e "$d/nginx/error.log" \
        -c "$d/nginx/nginx.conf"
    NGINX_MASTER=$LAST
    wait_port "$NGINX_PORT" "$NGINX_MASTER"
    NGINX_WORKER=$(pgrep -P "$NGINX_MASTER" | head -n1)
    [ -n "$NGINX_WORKER" ] || { echo "bench: no nginx worker" >&2; exit 1; }
    NGINX_PIDS="$NGINX_MASTER $NGINX_WORKER"
    spawn taskset -c "$PROXY_CPU" "$SLUICE_BIN" -c "$d/sluice/sluice.yaml"
    SLUICE_PID=$LAST
    wait_port "$SLUICE_PORT" "$SLUICE_PID"
    SLUICE_B_PID=
    if [ -n "$SLUICE_BIN_B" ]; then
        write_sluice_conf "$d/sluice_b" "$1" "$SLUICE_B_PORT"
        spawn taskset -c "$PROXY_CPU" "$SLUICE_BIN_B" -c "$d/sluice_b/sluice.yaml"
        SLUICE_B_PID=$LAST
        wait_port "$SLUICE_B_PORT" "$SLUICE_B_PID"
    fi
}

stop_proxies() {
    stop "$SLUICE_PID"
    [ -z "$SLUICE_B_PID" ] || stop "$SLUICE_B_PID"
    stop "$NGINX_MASTER"
}

# The targets ($2...) rotated left by $1 - 1.
rotated() {
    local k=$((($1 - 1) % ($# - 1))) all=("${@:2}")
    echo "${all[@]:k}" "${all[@]:0:k}"
}

target_port() {
    case $1 in
    direct) echo "$2" ;;
    nginx) echo "$NGINX_PORT" ;;
    sluice) echo "$SLUICE_PORT" ;;
    sluice_b) echo "$SLUICE_B_PORT" ;;
    esac
}

target_pids() {
    case $1 in
    direct) echo "" ;;
    nginx) echo "$NGINX_PIDS" ;;
    sluice) echo "$SLUICE_PID" ;;
    sluice_b) echo "$SLUICE_B_PID" ;;
    esac
}

# One wrk run; appends a line to $RES (unless $5 = warm).
# $1 workload (json|sse), $2 round, $3 target, $4 seconds
run_wrk() {
    local port pids t0 n0 t1 n1 out line stream=0
    port=$(target_port "$3" "$UP_PORT")
    pids=$(target_pids "$3")
    [ "$1" = sse ] && stream=1
    # shellcheck disable=SC2086
    if [ -n "$pids" ]; then t0=$(cpu_ticks $pids); n0=$(cpu_ns $pids); else t0=0 n0=0; fi
    out=$(BENCH_STREAM=$stream taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" -d"$4"s --latency \
        -s "$ROOT/bench/post.lua" "http://127.0.0.1:$port/v1/chat/completions")
    # shellcheck disable=SC2086
    if [ -n "$pids" ]; then t1=$(cpu_ticks $pids); n1=$(cpu_ns $pids); else t1=0 n1=0; fi
    line=$(grep '^BENCH ' <<<"$out") || { echo "$out" >&2; exit 1; }
    [ "${5:-}" = warm ] && return 0
    echo "throughput $1 $2 $3 $line ticks=$((t1 - t0)) sched_ns=$((n1 - n0))" >>"$RES"
    echo "  $1 round $2 $3: ${line#BENCH } cpu_ticks=$((t1 - t0))"
}

echo "sluice bench: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores," \
    "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
COMMIT=${BENCH_COMMIT:-$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')}
echo "commit $COMMIT," \
    "sluice $SLUICE_BIN, $($NGINX_BIN -v 2>&1 | sed 's/.*: //'), wrk -t1 -c$CONNS" \
    "${DURATION}s x $ROUNDS rounds; load average $(cut -d' ' -f1-3 /proc/loadavg)"
check_clock
echo "meta date=$(date -u +%FT%TZ) tck=$CLK_TCK conns=$CONNS duration=$DURATION rounds=$ROUNDS" >"$RES"

# ---- 1. throughput -------------------------------------------------------
if phase tput; then
spawn taskset -c "$LOAD_CPU" "$TOOLS/bench_upstream" -l "127.0.0.1:$UP_PORT" -n 8
UP_PID=$LAST
wait_port "$UP_PORT" "$UP_PID"
start_proxies "$UP_PORT" tput
echo "throughput (interleaved rounds):"
for w in json sse; do
    for t in $TARGETS; do run_wrk "$w" 0 "$t" 1 warm; done
    for r in $(seq "$ROUNDS"); do
        for t in $TARGETS; do run_wrk "$w" "$r" "$t" "$DURATION"; done
    done
done
if [ "${BENCH_PERF:-0}" = 1 ] && command -v perf >/dev/null; then
    echo "perf profile of sluice, json workload:"
    perf record -q -F 4999 -g -o "$WORK/perf.data" -p "$SLUICE_PID" -- sleep "$DURATION" \
        >/dev/null 2>&1 &
    PERF=$!
    run_wrk json 0 sluice "$DURATION" warm
    wait "$PERF" || true
    perf report -i "$WORK/perf.data" --no-children --stdio --sort dso -g none 2>/dev/null |
        grep -v '^#' | grep -v '^$' | head -8
    perf report -i "$WORK/perf.data" --no-children --percent-limit 1 --stdio \
        --sort dso,symbol -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -40
fi
stop_proxies
stop "$UP_PID"
fi

# ---- 2. SSE time to first event ------------------------------------------
if phase ttfe; then
spawn taskset -c "$LOAD_CPU" "$TOOLS/bench_upstream" -l "127.0.0.1:$TTFE_PORT" -n 2 -d 1000
UP_PID=$LAST
wait_port "$TTFE_PORT" "$UP_PID"
start_proxies "$TTFE_PORT" ttfe
echo "SSE time to first event ($TTFE_N requests per target per round):"
for r in $(seq "$ROUNDS"); do
    # Each round starts at the next target (round 1: direct nginx sluice
    # [sluice_b], round 2: nginx sluice [sluice_b] direct, ...): a fixed
    # order put the same target after the same one every round (the base
    # binary always last, sluice always right after nginx).
    # shellcheck disable=SC2086
    for t in $(rotated "$r" $TARGETS); do
        port=$(target_port "$t" "$TTFE_PORT")
        s=$(taskset -c "$LOAD_CPU" "$TOOLS/bench_ttfe" -c "127.0.0.1:$port" -n "$TTFE_N" \
            -o "$WORK/ttfe-$t-$r.txt")
        echo "  round $r $t: $s"
        sed "s/^/ttfe $t $r /" "$WORK/ttfe-$t-$r.txt" >>"$RES"
    done
done
stop_proxies
stop "$UP_PID"
fi

# ---- 3. RSS per idle stream ----------------------------------------------
if phase rss; then
spawn taskset -c "$LOAD_CPU" "$TOOLS/bench_upstream" -l "127.0.0.1:$HOLD_PORT" -H
UP_PID=$LAST
wait_port "$HOLD_PORT" "$UP_PID"
start_proxies "$HOLD_PORT" hold
echo "RSS with $STREAMS idle streams:"
for t in nginx sluice; do
    port=$(target_port "$t" "$HOLD_PORT")
    if [ "$t" = nginx ]; then pid=$NGINX_WORKER; else pid=$SLUICE_PID; fi
    # A second of ordinary requests first, so lazily built state (and the
    # allocator's first arenas) are not counted as the streams' memory.
    taskset -c "$LOAD_CPU" wrk -t1 -c1 -d1s -s "$ROOT/bench/post.lua" \
        "http://127.0.0.1:$port/v1/chat/completions" >/dev/null
    before=$(rss_kib "$pid")
    coproc HOLD { exec taskset -c "$LOAD_CPU" "$TOOLS/bench_ttfe" -c "127.0.0.1:$port" \
        -H "$STREAMS" -t 120; }
    # shellcheck disable=SC2153 # HOLD_PID is set by coproc
    HOLD_PID_=$HOLD_PID
    PIDS+=("$HOLD_PID_")
    if ! read -r -t 60 ready <&"${HOLD[0]}" || [ "$ready" != "ready $STREAMS" ]; then
        echo "bench: holding $STREAMS streams through $t failed" >&2
        exit 1
    fi
    after=$(rss_kib "$pid")
    stop "$HOLD_PID_"
    echo "  $t: VmRSS $before KiB -> $after KiB with $STREAMS streams"
    echo "rss $t $before $after $STREAMS" >>"$RES"
done
stop_proxies
stop "$UP_PID"
fi

echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
python3 "$ROOT/bench/report.py" "$RES"
