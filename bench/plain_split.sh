#!/usr/bin/env bash
# bench/plain_split.sh — issue #16's "plain" row split into user and kernel
# CPU: what one proxied JSON request costs nginx, sluice and (optionally) a
# base build of sluice, each as user µs and kernel µs per request from
# /proc (utime, stime), in interleaved rounds, with the ratios to nginx's in
# the same round (median over rounds). The kernel share of nginx is the
# floor any proxy making the same system calls pays; the user share is what
# code can still win (bench/RESULTS.md, "Plain request CPU").
#
# Same layout as bench/realistic.sh: the proxy pinned to core 1, the
# upstream (nginx answering the fixed 282-byte chat.completion) and
# wrk -t1 -c32 on core 0; sluice with the "plain" conf (alias, api_key_env,
# workers 1, access log off).
#
# Knobs: SLUICE_BIN (default build/sluice), SLUICE_BASE_BIN (a build of
# the branch point: adds the base rows), BENCH_DURATION (s, default 5),
# BENCH_ROUNDS (default 5), BENCH_CONNS (default 32), BENCH_PORT_BASE
# (default 28800), BENCH_KEEP=1 keeps the work directory, BENCH_STRACE=1
# adds one round per proxy under `strace -c` and prints system calls per
# request (strace slows the proxy: its CPU in that round is not counted),
# BENCH_NSTAT=1 adds one 3 s round per proxy counted by nstat: TCP segments,
# pure ACKs and delayed ACKs per request (the kernel's share of the work
# that no CPU figure splits). The counters are the network namespace's, so
# run it in a namespace of its own, where nothing else talks:
#   ip netns add b; ip netns exec b ip link set lo up
#   BENCH_NSTAT=1 ip netns exec b bench/plain_split.sh
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SLUICE_BIN=${SLUICE_BIN:-$ROOT/build/sluice}
SLUICE_BASE_BIN=${SLUICE_BASE_BIN:-}
NGINX_BIN=${NGINX_BIN:-$(command -v nginx || echo /usr/sbin/nginx)}
DURATION=${BENCH_DURATION:-5}
ROUNDS=${BENCH_ROUNDS:-5}
CONNS=${BENCH_CONNS:-32}
PORT_BASE=${BENCH_PORT_BASE:-28800}
UP_PORT=$((PORT_BASE + 1))
NGX_PORT=$((PORT_BASE + 2))

for c in wrk taskset python3 "$NGINX_BIN" "$SLUICE_BIN"; do
    command -v "$c" >/dev/null || { echo "bench: $c not found" >&2; exit 1; }
done
WORK=$(mktemp -d /tmp/sluice-plain-split.XXXXXX)
cp "$SLUICE_BIN" "$WORK/sluice"
[ -n "$SLUICE_BASE_BIN" ] && cp "$SLUICE_BASE_BIN" "$WORK/sluice-base"
. "$ROOT/bench/lib.sh"

realistic_upstream "$UP_PORT" 0 "" off
nginx_proxy_conf "$WORK/ngx" "$UP_PORT" "$NGX_PORT" "" "" off
spawn taskset -c 1 "$NGINX_BIN" -p "$WORK/ngx/" -e "$WORK/ngx/error.log" -c "$WORK/ngx/nginx.conf"
declare -A PID PORT
PID[nginx]=$LAST
PORT[nginx]=$NGX_PORT
wait_port "$NGX_PORT" "$LAST"

export SLUICE_BENCH_UPSTREAM_KEY=upstream-key
start_sluice() { # $1 name, $2 binary, $3 port: realistic.sh's "plain" conf (lib.sh)
    realistic_conf "$1" "$3" $(($3 + 10)) plain
    spawn taskset -c 1 "$2" -c "$WORK/$1.yaml" 2>"$WORK/$1.err"
    PID[$1]=$LAST
    PORT[$1]=$3
    wait_port "$3" "$LAST"
}
CONFIGS="nginx sluice"
start_sluice sluice "$WORK/sluice" $((PORT_BASE + 3))
if [ -n "$SLUICE_BASE_BIN" ]; then
    start_sluice base "$WORK/sluice-base" $((PORT_BASE + 4))
    CONFIGS="$CONFIGS base"
fi

# utime and stime (ticks) of one process, all threads
ticks() { awk '{ sub(/^.*\) /, ""); printf "%d %d\n", $12, $13 }' "/proc/$1/stat"; }

RES=$WORK/results.tsv
run() { # $1 config, $2 round ("warm" = not recorded)
    local c=$1 u0 s0 u1 s1 out line n
    read -r u0 s0 < <(ticks "${PID[$c]}")
    out=$(taskset -c 0 wrk -t1 -c"$CONNS" -d"$DURATION"s --timeout 30s -s "$ROOT/bench/realistic.lua" \
        "http://127.0.0.1:${PORT[$c]}/v1/chat/completions")
    read -r u1 s1 < <(ticks "${PID[$c]}")
    line=$(grep '^BENCH ' <<<"$out") || { echo "$out" >&2; exit 1; }
    grep -q 'errors=0 non2xx=0' <<<"$line" || { echo "bench: $c: $line" >&2; exit 1; }
    [ "$2" = warm ] && return 0
    n=$(sed 's/.*requests=\([0-9]*\).*/\1/' <<<"$line")
    echo "$c $2 $n $((u1 - u0)) $((s1 - s0))" >>"$RES"
    echo "  round $2 $c: requests=$n utime=$((u1 - u0)) stime=$((s1 - s0)) ticks"
}

echo "sluice plain split bench: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores," \
    "wrk -t1 -c$CONNS, ${DURATION}s runs, $ROUNDS rounds, load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "sluice $SLUICE_BIN (commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')), base ${SLUICE_BASE_BIN:-none}"
for c in $CONFIGS; do run "$c" warm; done
for r in $(seq "$ROUNDS"); do
    for c in $CONFIGS; do run "$c" "$r"; done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

# System calls per request: one 3 s round per proxy under strace -c.
if [ "${BENCH_STRACE:-0}" = 1 ]; then
    command -v strace >/dev/null || { echo "bench: strace not found" >&2; exit 1; }
    for c in $CONFIGS; do
        strace -f -c -o "$WORK/strace.$c" -p "${PID[$c]}" 2>/dev/null &
        st=$!
        sleep 0.5 # strace attached (its first lines would race wrk's first requests)
        out=$(taskset -c 0 wrk -t1 -c"$CONNS" -d3s --timeout 30s -s "$ROOT/bench/realistic.lua" \
            "http://127.0.0.1:${PORT[$c]}/v1/chat/completions")
        sleep 0.2
        kill -INT "$st"
        wait "$st" 2>/dev/null || true
        grep -q 'errors=0 non2xx=0' <<<"$out" || { echo "bench: strace $c: $out" >&2; exit 1; }
        sed 's/.*requests=\([0-9]*\).*/\1/' <<<"$(grep '^BENCH ' <<<"$out")" >"$WORK/strace.$c.n"
    done
    python3 - "$WORK" $CONFIGS <<'PYEOF'
import re, sys
work, cfgs = sys.argv[1], sys.argv[2:]
per = {}
for c in cfgs:
    n = int(open("%s/strace.%s.n" % (work, c)).read())
    calls = {}
    for line in open("%s/strace.%s" % (work, c)):
        f = line.split()
        if len(f) >= 5 and re.match(r"^[0-9.]+$", f[0]) and f[-1] != "total":
            calls[f[-1]] = int(f[3])
    per[c] = {k: v / n for k, v in calls.items()}
names = sorted({k for p in per.values() for k in p}, key=lambda k: -max(p.get(k, 0) for p in per.values()))
print("\nsystem calls per request (strace -c, one 3 s round each):\n")
print("| call | " + " | ".join(cfgs) + " |")
print("| --- |" + " ---: |" * len(cfgs))
for k in names:
    if max(p.get(k, 0) for p in per.values()) >= 0.01:
        print("| %s | " % k + " | ".join("%.2f" % per[c].get(k, 0) for c in cfgs) + " |")
print("| total | " + " | ".join("%.2f" % sum(per[c].values()) for c in cfgs) + " |")
PYEOF
fi

# TCP counters per request: one 3 s round per proxy between two nstat reads.
if [ "${BENCH_NSTAT:-0}" = 1 ]; then
    export NSTAT_HISTORY=$WORK/nstat.hist
    for c in $CONFIGS; do
        nstat -n
        out=$(taskset -c 0 wrk -t1 -c"$CONNS" -d3s --timeout 30s -s "$ROOT/bench/realistic.lua" \
            "http://127.0.0.1:${PORT[$c]}/v1/chat/completions")
        nstat -z >"$WORK/nstat.$c"
        grep -q 'errors=0 non2xx=0' <<<"$out" || { echo "bench: nstat $c: $out" >&2; exit 1; }
        sed 's/.*requests=\([0-9]*\).*/\1/' <<<"$(grep '^BENCH ' <<<"$out")" >"$WORK/nstat.$c.n"
    done
    python3 - "$WORK" $CONFIGS <<'PYEOF'
import sys
work, cfgs = sys.argv[1], sys.argv[2:]
keys = ["TcpInSegs", "TcpOutSegs", "TcpExtTCPPureAcks", "TcpExtDelayedACKs", "TcpExtTCPHPAcks",
        "TcpExtTCPHPHits", "TcpExtTCPAutoCorking", "TcpExtTCPOrigDataSent", "TcpActiveOpens",
        "TcpPassiveOpens", "IpExtInOctets"]
per = {}
for c in cfgs:
    n = int(open("%s/nstat.%s.n" % (work, c)).read())
    v = {}
    for line in open("%s/nstat.%s" % (work, c)):
        f = line.split()
        if len(f) >= 2 and not f[0].startswith("#"):
            v[f[0]] = int(f[1])
    per[c] = {k: v.get(k, 0) / n for k in keys}
print("\nTCP counters per request (nstat, one 3 s round each; wrk, upstream and proxy together):\n")
print("| counter | " + " | ".join(cfgs) + " |")
print("| --- |" + " ---: |" * len(cfgs))
for k in keys:
    print("| %s | " % k + " | ".join("%.2f" % per[c][k] for c in cfgs) + " |")
PYEOF
fi

python3 - "$RES" "$(getconf CLK_TCK)" <<'EOF'
import statistics, sys
tck = int(sys.argv[2])
rows = {}
for line in open(sys.argv[1]):
    c, r, n, u, s = line.split()
    us = 1e6 / tck / int(n)
    rows.setdefault(c, {})[r] = (int(u) * us, int(s) * us)
med = statistics.median
print("\n| proxy | user µs/request | kernel µs/request | total | kernel share | total ÷ nginx | user ÷ nginx's user |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
for c, rs in rows.items():
    ng = rows["nginx"]
    u = med(v[0] for v in rs.values())
    k = med(v[1] for v in rs.values())
    t = med(sum(v) for v in rs.values())
    rt = med(sum(rs[r]) / sum(ng[r]) for r in rs)
    ru = med(rs[r][0] / ng[r][0] for r in rs)
    print("| %s | %.2f | %.2f | %.2f | %.0f%% | %.2f | %.2f |" % (c, u, k, t, 100 * k / (u + k), rt, ru))
ng = rows["nginx"]
floor = med(ng[r][1] / sum(ng[r]) for r in ng)
print("\nfloor: nginx's kernel time alone is %.2f x its total (median of rounds): a proxy with" % floor)
print("nginx's system calls and no user-space code at all would cost that much.")
if "base" in rows:
    b = rows["base"]
    print("sluice / base (same round, median): total %.2f, user %.2f" % (
        med(sum(rows["sluice"][r]) / sum(b[r]) for r in b),
        med(rows["sluice"][r][0] / b[r][0] for r in b)))
EOF
