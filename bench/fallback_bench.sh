#!/usr/bin/env bash
# bench/fallback_bench.sh — what the fallback chain (issue 6) costs when
# nothing fails, and how fast a template is served when everything does.
# Every configuration runs in the same invocation, in interleaved rounds,
# so machine noise hits all of them alike.
#
# Part 1, nothing fails (the upstream answers every request; one sluice per
# configuration, all started at once):
#   off     the chain off: no retries, no breaker, no template, no
#           idempotency store (what the core tests run)          (baseline)
#   on      every default on: retry 1 with its budget, circuit breakers,
#           template, journal queue, idempotency store; no header used
#                                           target: no measurable difference
#   on_key  on, and every request carries a fresh Idempotency-Key (claimed,
#           its answer captured and stored in-process)
# Workloads: json (a chat.completion) and sse (8 events + [DONE]).
#
# Part 2, full outage (nothing listens at the model server's address, so
# the breaker is open after the first failures and sluice answers alone):
#   outage        chain on: the template, json and sse
#   outage_queue  chain on and the model queues: each template also waits
#                 for its journal record to be fsynced (the durable accept);
#                 restarted on an empty queue before each run
# Each is measured under load (wrk -c$BENCH_CONNS) and one request at a
# time (wrk -c1: the time to serve one template).
#
# Layout (2 cores): sluice (workers: 1) alone on core 1; the upstream
# (build/tools/bench_upstream) and wrk -t1 on core 0. Per run: requests/s,
# p50/p99 (wrk --latency), sluice's CPU time per request (utime+stime from
# /proc, the steadier figure on a shared machine). A run with a connection
# error or a non-2xx answer fails the bench.
#
# Knobs: BENCH_DURATION (s per run, default 5), BENCH_ROUNDS (part 1,
# default 5), BENCH_ROUNDS2 (part 2, default 3),
# BENCH_CONNS (default 32), BENCH_PORT_BASE (default 28700), SLUICE_BIN,
# BENCH_TOOLS, BENCH_PROXY_CPU / BENCH_LOAD_CPU, BENCH_KEEP=1 keeps the work
# directory, BENCH_QUICK=1 (2 s runs, 2 + 1 rounds).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SLUICE_BIN=${SLUICE_BIN:-$ROOT/build/sluice}
TOOLS=${BENCH_TOOLS:-$ROOT/build/tools}
PROXY_CPU=${BENCH_PROXY_CPU:-1}
LOAD_CPU=${BENCH_LOAD_CPU:-0}
if [ "${BENCH_QUICK:-0}" = 1 ]; then
    DURATION=${BENCH_DURATION:-2}
    ROUNDS=${BENCH_ROUNDS:-2}
    ROUNDS2=${BENCH_ROUNDS2:-1}
else
    DURATION=${BENCH_DURATION:-5}
    ROUNDS=${BENCH_ROUNDS:-5}
    ROUNDS2=${BENCH_ROUNDS2:-3}
fi
CONNS=${BENCH_CONNS:-32}
PORT_BASE=${BENCH_PORT_BASE:-28700}
CONFIGS="off on on_key outage outage_queue"

UP_PORT=$((PORT_BASE + 1))
DEAD_PORT=$((PORT_BASE + 2)) # nothing listens here: the outage

for c in wrk taskset python3 "$SLUICE_BIN" "$TOOLS/bench_upstream"; do
    command -v "$c" >/dev/null || { echo "bench: $c not found (run make)" >&2; exit 1; }
done

port_of() {
    local i=0 c
    for c in $CONFIGS; do
        [ "$c" = "$1" ] && { echo $((PORT_BASE + 10 + i)); return; }
        i=$((i + 1))
    done
    echo "bench: no config $1" >&2
    exit 1
}


WORK=$(mktemp -d /tmp/sluice-fallback-bench.XXXXXX)
RES=$WORK/results.tsv
# A private copy: a rebuild of build/sluice during the run must not touch
# the processes being measured.
cp "$SLUICE_BIN" "$WORK/sluice"
SLUICE_LABEL=$SLUICE_BIN
SLUICE_BIN=$WORK/sluice
. "$ROOT/bench/lib.sh"
ports_free "$UP_PORT" "$DEAD_PORT" $(for c in $CONFIGS; do port_of "$c"; done)

write_conf() { # $1 config
    local c=$1 f=$WORK/$1.yaml up=$UP_PORT
    case $c in outage*) up=$DEAD_PORT ;; esac
    {
        echo "# bench/fallback_bench.sh: $c"
        bench_sluice_conf "$(port_of "$c")" "$up"
    } >"$f"
    case $c in
    off)
        cat >>"$f" <<EOF
fallback:
  retry: { attempts: 0 }
  circuit: { failures: 0, failure_percent: 0 }
  template: { enabled: false }
  idempotency: { enabled: false }
fault: { header: false }
EOF
        ;;
    on | on_key | outage_queue)
        printf 'fallback:\n  queue: { enabled: true, dir: "%s", max_pending: 1000000 }\n' \
            "$WORK/queue-$c" >>"$f"
        ;;
    esac
    "$SLUICE_BIN" -t -c "$f" >/dev/null 2>&1 || { "$SLUICE_BIN" -t -c "$f"; exit 1; }
}

declare -A SPID
start_sluice() { # $1 config
    spawn taskset -c "$PROXY_CPU" "$SLUICE_BIN" -c "$WORK/$1.yaml"
    SPID[$1]=$LAST
    wait_port "$(port_of "$1")" "$LAST"
}

spawn taskset -c "$LOAD_CPU" "$TOOLS/bench_upstream" -l "127.0.0.1:$UP_PORT" -n 8
wait_port "$UP_PORT" "$LAST"
for c in $CONFIGS; do
    write_conf "$c"
    start_sluice "$c"
done

# One wrk run; appends a line to $RES (unless $6 = warm).
# $1 config, $2 workload (json|sse), $3 round, $4 connections, $5 seconds
run_wrk() {
    local c=$1 w=$2 pid=${SPID[$1]} script=$ROOT/bench/post.lua t0 t1 out line stream=0
    [ "$w" = sse ] && stream=1
    [ "$c" = on_key ] && script=$ROOT/bench/fallback_key.lua
    if [ "$c" = outage_queue ]; then
        # Each run on a fresh queue: a full one (max_pending) would answer
        # templates without the durable accept being measured.
        stop "$pid"
        rm -rf "$WORK/queue-$c"
        start_sluice "$c"
        pid=${SPID[$c]}
    fi
    t0=$(cpu_ticks "$pid")
    out=$(BENCH_STREAM=$stream taskset -c "$LOAD_CPU" wrk -t1 -c"$4" -d"$5"s --latency \
        -s "$script" "http://127.0.0.1:$(port_of "$c")/v1/chat/completions")
    t1=$(cpu_ticks "$pid")
    line=$(grep '^BENCH ' <<<"$out") || { echo "$out" >&2; exit 1; }
    case $line in
    *" errors=0 non2xx=0") ;;
    *) echo "bench: $c $w: errors: $line" >&2; exit 1 ;;
    esac
    [ "${6:-}" = warm ] && return 0
    echo "$c $w $3 $4 $line ticks=$((t1 - t0))" >>"$RES"
    echo "  $c $w round $3 c$4: ${line#BENCH } cpu_ticks=$((t1 - t0))"
}

echo "sluice fallback bench: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores," \
    "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
echo "commit ${BENCH_COMMIT:-$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')}," \
    "sluice $SLUICE_LABEL, wrk -t1 -c$CONNS ${DURATION}s, $ROUNDS + $ROUNDS2 rounds;" \
    "load average $(cut -d' ' -f1-3 /proc/loadavg)"

echo "part 1, nothing fails (interleaved rounds):"
for w in json sse; do
    for c in off on on_key; do run_wrk "$c" "$w" 0 "$CONNS" 1 warm; done
    for r in $(seq "$ROUNDS"); do
        for c in off on on_key; do run_wrk "$c" "$w" "$r" "$CONNS" "$DURATION"; done
    done
done
echo "part 2, full outage (interleaved rounds):"
for w in json sse; do
    for c in outage outage_queue; do run_wrk "$c" "$w" 0 "$CONNS" 1 warm; done
    for r in $(seq "$ROUNDS2"); do
        for c in outage outage_queue; do
            run_wrk "$c" "$w" "$r" "$CONNS" "$DURATION"
            run_wrk "$c" "$w" "$r" 1 "$DURATION"
        done
    done
done
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo

python3 - "$RES" "$(getconf CLK_TCK)" <<'EOF'
import statistics, sys
rows = {}
for ln in open(sys.argv[1]):
    f = ln.split()
    c, w, r, conns = f[0], f[1], int(f[2]), int(f[3])
    kv = dict(x.split("=") for x in f[5:])
    req, us = int(kv["requests"]), int(kv["duration_us"])
    rows.setdefault((c, w, conns), []).append({
        "rps": req * 1e6 / us, "p50": int(kv["p50_us"]) / 1000.0, "p99": int(kv["p99_us"]) / 1000.0,
        "cpu": int(kv["ticks"]) / int(sys.argv[2]) * 1e6 / max(req, 1),
    })

def med(k, key):
    return statistics.median(x[key] for x in rows[k])

def rng(k, key, fmt):
    v = [x[key] for x in rows[k]]
    return (fmt % statistics.median(v)) + " (" + (fmt % min(v)) + "–" + (fmt % max(v)) + ")"

print("| config | workload | conns | requests/s | p50 ms | p99 ms | sluice CPU µs/req | req/s vs off |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
order = ["off", "on", "on_key", "outage", "outage_queue"]
for (c, w, conns) in sorted(rows, key=lambda k: (k[0].startswith("outage"), k[1], order.index(k[0]), -k[2])):
    base = (("off", w, conns) if ("off", w, conns) in rows else None)
    ratio = "%.3f" % (med((c, w, conns), "rps") / med(base, "rps")) if base and not c.startswith("outage") else "—"
    print("| %s | %s | %d | %s | %s | %s | %s | %s |" % (
        c, w, conns, rng((c, w, conns), "rps", "%.0f"), rng((c, w, conns), "p50", "%.2f"),
        rng((c, w, conns), "p99", "%.2f"), rng((c, w, conns), "cpu", "%.1f"), ratio))
print()
print("medians over rounds, (min–max) across them")
EOF
