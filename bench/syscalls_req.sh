#!/usr/bin/env bash
# bench/syscalls_req.sh — system calls per request of issue #16's JSON
# request (realistic.sh's "plain" and "full" confs), counted by strace -f -c
# attached to the sluice process (all its threads) while wrk runs: the kernel
# side of a request, which callgrind does not see. A change that moves
# wall-clock time but not callgrind's instructions should show here first.
#
# Per binary and conf: sluice starts (workers 1), a 1 s wrk run warms it,
# strace attaches, a second wrk run (SC_SECONDS, default 4) runs under it;
# requests are sluice_requests_total's growth over that run (admin /metrics,
# read before and after: the two reads are two of the counted requests'
# worth of calls at most). strace slows every call, so the absolute figures
# are those of a slow server (fewer events per epoll_wait than at full
# speed); compare rows of the same run only.
#
#   SLUICE_BIN (default build/sluice), SLUICE_BASE_BIN (optional: the same
#   rows for that binary, in the same run), SC_CONFS (default "plain full"),
#   SC_SECONDS, SC_CONNS (default 32), BENCH_PORT_BASE (default 28950),
#   BENCH_KEEP=1 keeps the strace summaries.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SLUICE_BIN=${SLUICE_BIN:-$ROOT/build/sluice}
SLUICE_BASE_BIN=${SLUICE_BASE_BIN:-}
NGINX_BIN=${NGINX_BIN:-$(command -v nginx || echo /usr/sbin/nginx)}
CONFS=${SC_CONFS:-"plain full"}
SECONDS_RUN=${SC_SECONDS:-4}
CONNS=${SC_CONNS:-32}
PORT_BASE=${BENCH_PORT_BASE:-28950}
UP_PORT=$((PORT_BASE + 1))
PORT=$((PORT_BASE + 10))
ADMIN=$((PORT_BASE + 20))

for c in wrk strace curl "$NGINX_BIN" "$SLUICE_BIN"; do
    command -v "$c" >/dev/null || { echo "bench: $c not found" >&2; exit 1; }
done

WORK=$(mktemp -d /tmp/sluice-syscalls.XXXXXX)
cp "$SLUICE_BIN" "$WORK/sluice"
BINS="this"
if [ -n "$SLUICE_BASE_BIN" ]; then
    cp "$SLUICE_BASE_BIN" "$WORK/sluice-base"
    BINS="this base"
fi
. "$ROOT/bench/lib.sh"
ports_free "$UP_PORT" "$PORT" "$ADMIN"

realistic_upstream "$UP_PORT"

export SLUICE_BENCH_UPSTREAM_KEY=upstream-key
realistic_conf plain "$PORT" "$ADMIN" plain
realistic_conf full "$PORT" "$ADMIN" full
TOKEN=$("$WORK/sluice" token --sub bench-user --ttl 1h -c "$WORK/full.yaml" |
    awk '/^access_token:/ { print $2 }')

requests() {
    curl -sf "http://127.0.0.1:$ADMIN/metrics" |
        awk '/^sluice_requests_total/ { s += $NF } END { printf "%d", s }'
}

# One run: $1 binary, $2 conf; prints "calls requests" and keeps the strace
# summary in $WORK/strace.$1.$2.
one() {
    local out=$WORK/strace.$1.$2 tok="" n0 n1 bin=$WORK/sluice att _
    case $2 in full*) tok=$TOKEN ;; esac
    [ "$1" = base ] && bin=$WORK/sluice-base
    spawn "$bin" -c "$WORK/$2.yaml"
    local pid=$LAST
    wait_admin_slow "$ADMIN" "$pid"
    BENCH_TOKEN=$tok wrk -t1 -c"$CONNS" -d1s -s "$ROOT/bench/realistic.lua" \
        "http://127.0.0.1:$PORT/v1/chat/completions" >/dev/null
    strace -f -c -p "$pid" -o "$out" 2>"$out.log" &
    local spid=$!
    # bounded wait until strace says it attached every thread
    for _ in $(seq 200); do
        att=$(grep -c 'attached' "$out.log" 2>/dev/null) || true
        [ "${att:-0}" -ge "$(ls /proc/"$pid"/task | wc -l)" ] && break
        sleep 0.05
    done
    n0=$(requests)
    BENCH_TOKEN=$tok wrk -t1 -c"$CONNS" -d"$SECONDS_RUN"s --timeout 30s \
        -s "$ROOT/bench/realistic.lua" "http://127.0.0.1:$PORT/v1/chat/completions" >"$out.wrk"
    grep -q 'errors=0 non2xx=0' "$out.wrk" || { cat "$out.wrk" >&2; exit 1; }
    n1=$(requests)
    kill -INT "$spid"
    wait "$spid" || true
    stop "$pid"
    echo "$(awk '$NF == "total" { print $4 }' "$out") $((n1 - n0))"
}

echo "system calls per request (strace -f -c): $(date -u '+%Y-%m-%d %H:%M UTC'), commit" \
    "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'), wrk -c$CONNS, ${SECONDS_RUN}s," \
    "load average $(cut -d' ' -f1 /proc/loadavg)"
echo
echo "| binary | conf | requests | calls per request | the largest (calls per request) |"
echo "| --- | --- | ---: | ---: | --- |"
for c in $CONFS; do
    for b in $BINS; do
        read -r calls n <<<"$(one "$b" "$c")"
        top=$(awk -v n="$n" '$NF != "total" && $4 ~ /^[0-9]+$/ && NF >= 5 {
                printf "%s %.2f\n", $NF, $4 / n }' "$WORK/strace.$b.$c" |
            sort -k2 -rn | head -6 | awk '{ printf "%s%s %s", sep, $1, $2; sep = ", " }')
        echo "| $b | $c | $n | $(awk -v a="$calls" -v n="$n" 'BEGIN { printf "%.2f", a / n }') | $top |"
    done
done
