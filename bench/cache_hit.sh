#!/usr/bin/env bash
# bench/cache_hit.sh — what a cache hit costs sluice against a proxied
# request (issue 18: goal <= 0.7x by CPU per request), measured in the same
# run, in interleaved rounds so that machine noise hits both alike.
#
# Configurations (one sluice each, workers: 1, all started at once, same
# upstream, same wrk script: a temperature-0 chat completion):
#   proxy     no cache: every request goes to the upstream     (the baseline)
#   hit       cache on (scope global, in-process store): after one warm-up
#             request every request is a hit, sent pre-rendered as JSON
#   hit_sse   the same entry asked for as a stream: the SSE replay
# Layout (2 cores): the sluices on core 1; the upstream (nginx answering a
# fixed chat.completion) and wrk -t1 on core 0. Per run: requests/s, p50/p99
# and sluice's CPU time per request (utime+stime from /proc). A run with any
# error or non-2xx answer fails the bench.
#
# Knobs: BENCH_DURATION (s per run, default 5), BENCH_ROUNDS (default 3),
# BENCH_CONNS (default 32), BENCH_PORT_BASE (default 28700), SLUICE_BIN,
# BENCH_PROXY_CPU / BENCH_LOAD_CPU, BENCH_KEEP=1 keeps the work directory.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SLUICE_BIN=${SLUICE_BIN:-$ROOT/build/sluice}
NGINX_BIN=${NGINX_BIN:-$(command -v nginx || echo /usr/sbin/nginx)}
PROXY_CPU=${BENCH_PROXY_CPU:-1}
LOAD_CPU=${BENCH_LOAD_CPU:-0}
DURATION=${BENCH_DURATION:-5}
ROUNDS=${BENCH_ROUNDS:-3}
CONNS=${BENCH_CONNS:-32}
PORT_BASE=${BENCH_PORT_BASE:-28700}
UP_PORT=$((PORT_BASE + 1))
P_PROXY=$((PORT_BASE + 10))
P_HIT=$((PORT_BASE + 11))

WORK=$(mktemp -d /tmp/sluice-cache-bench.XXXXXX)
. "$ROOT/bench/lib.sh"

nginx_fixed_upstream "$UP_PORT" "$LOAD_CPU"

write_conf() { # $1 name, $2 port, $3 cache on (0/1)
    bench_sluice_conf "$2" "$UP_PORT" >"$WORK/$1.yaml"
    [ "$3" = 1 ] && printf 'cache: { enabled: true, scope: global }\n' >>"$WORK/$1.yaml"
    "$SLUICE_BIN" -t -c "$WORK/$1.yaml" >/dev/null
}
write_conf proxy "$P_PROXY" 0
write_conf hit "$P_HIT" 1

spawn taskset -c "$PROXY_CPU" "$SLUICE_BIN" -c "$WORK/proxy.yaml"
PID_PROXY=$LAST
wait_port "$P_PROXY" "$PID_PROXY"
spawn taskset -c "$PROXY_CPU" "$SLUICE_BIN" -c "$WORK/hit.yaml"
PID_HIT=$LAST
wait_port "$P_HIT" "$PID_HIT"

cat >"$WORK/req.lua" <<EOF
package.path = "$ROOT/bench/?.lua;" .. package.path
local common = require("wrk_common") -- the BENCH line
EOF
cat >>"$WORK/req.lua" <<'EOF'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local stream = os.getenv("BENCH_STREAM") == "1"
wrk.body = '{"model":"bench-model","temperature":0,"messages":[{"role":"user","content":"Hello"}]'
    .. (stream and ',"stream":true}' or '}')
done = common.done
EOF

# The warm-up request stores the answer; check that the next one is a hit.
warm=$(curl -sS -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' \
    -d '{"model":"bench-model","temperature":0,"messages":[{"role":"user","content":"Hello"}]}' \
    "http://127.0.0.1:$P_HIT/v1/chat/completions")
[ "$warm" = 200 ] || { echo "bench: warm-up answered $warm" >&2; exit 1; }
hdr=$(curl -sS -D - -o /dev/null -H 'Content-Type: application/json' \
    -d '{"model":"bench-model","temperature":0,"messages":[{"role":"user","content":"Hello"}]}' \
    "http://127.0.0.1:$P_HIT/v1/chat/completions" | tr -d '\r' | awk -F': ' 'tolower($1)=="x-sluice-cache"{print $2}')
[ "$hdr" = hit ] || { echo "bench: the second request is not a hit ($hdr)" >&2; exit 1; }

TICK_US=$((1000000 / $(getconf CLK_TCK)))
declare -A CPU REQS RPS P50 P99
run() { # $1 label, $2 port, $3 pid, $4 stream (0/1)
    local before after out
    before=$(cpu_ticks "$3")
    out=$(BENCH_STREAM=$4 taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" -d"${DURATION}s" \
        -s "$WORK/req.lua" "http://127.0.0.1:$2/v1/chat/completions" | grep '^BENCH')
    after=$(cpu_ticks "$3")
    eval "$(echo "$out" | sed 's/^BENCH //; s/ /;/g')"
    if [ "$errors" != 0 ] || [ "$non2xx" != 0 ]; then
        echo "bench: $1: errors=$errors non2xx=$non2xx" >&2
        exit 1
    fi
    local us=$(( (after - before) * TICK_US ))
    LAST_US=$(echo "$us / $requests" | bc -l)
    CPU[$1]=$(( ${CPU[$1]:-0} + us ))
    REQS[$1]=$(( ${REQS[$1]:-0} + requests ))
    printf '  %-8s %8d req/s  p50 %6d us  p99 %6d us  cpu %6.2f us/req\n' "$1" \
        $((requests * 1000000 / duration_us)) "$p50_us" "$p99_us" \
        "$(echo "$us / $requests" | bc -l)"
}

echo "cache hit vs proxied: workers 1 on core $PROXY_CPU, wrk -t1 -c$CONNS ${DURATION}s x $ROUNDS rounds"
# Per round, each ratio against the proxy run next to it: on a shared
# machine the median of those is steadier than the ratio of the sums.
R_HIT=() R_SSE=()
for i in $(seq "$ROUNDS"); do
    echo "round $i"
    run proxy "$P_PROXY" "$PID_PROXY" 0
    px=$LAST_US
    run hit "$P_HIT" "$PID_HIT" 0
    R_HIT+=("$(echo "$LAST_US / $px" | bc -l)")
    run hit_sse "$P_HIT" "$PID_HIT" 1
    R_SSE+=("$(echo "$LAST_US / $px" | bc -l)")
done
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
per() { echo "${CPU[$1]} / ${REQS[$1]}" | bc -l; }
printf 'cpu per request: proxy %.2f us, hit %.2f us, hit_sse %.2f us\n' \
    "$(per proxy)" "$(per hit)" "$(per hit_sse)"
printf 'ratio by CPU (sums): hit/proxy %.3f, hit_sse/proxy %.3f (goal <= 0.7)\n' \
    "$(echo "$(per hit) / $(per proxy)" | bc -l)" "$(echo "$(per hit_sse) / $(per proxy)" | bc -l)"
printf 'per-round ratios: hit/proxy %s; hit_sse/proxy %s\n' \
    "$(printf '%.2f ' "${R_HIT[@]}")" "$(printf '%.2f ' "${R_SSE[@]}")"
printf 'median per-round ratio: hit/proxy %.3f, hit_sse/proxy %.3f (goal <= 0.7)\n' \
    "$(median "${R_HIT[@]}")" "$(median "${R_SSE[@]}")"
