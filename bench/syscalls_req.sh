#!/usr/bin/env bash
# bench/syscalls_req.sh — the kernel side of issue #16's JSON request
# (realistic.sh's workload: wrk -t1 -c32 keep-alive, the nginx upstream with
# its 282-byte answer, "plain" and "full" confs), nginx beside sluice in one
# run: system calls per request by kind, and what the kernel does for them
# (segments sent, loopback deliveries, wake-ups, timers armed), counted, not
# timed, so other load on the machine moves them little.
#
# Per target (nginx: realistic.sh's proxy conf, one process without master;
# plain, full: sluice, workers 1; plain@base, full@base with SLUICE_BASE_BIN),
# pinned as realistic.sh pins them (proxy on BENCH_PROXY_CPU, wrk and the
# upstream on BENCH_LOAD_CPU): a 1 s wrk run warms it, then
#   1. `perf stat -e <tracepoints> -p PID` over a wrk run of SC_SECONDS: the
#      proxy's syscalls by kind at full speed (raw_syscalls and
#      syscalls:sys_enter_*), and kernel events in its context: net_dev_xmit
#      (segments it sent), netif_rx (loopback deliveries: the receiving
#      peer's TCP work runs in the sender's context), sched_wakeup (peers it
#      woke), sched_switch (its sleeps), timer_start / hrtimer_start (TCP's
#      retransmit and delayed-ACK timers, epoll timeouts), skb copies;
#   2. `strace -f` over another run (SC_STRACE=0 skips it): calls, the ones
#      that failed (EAGAIN) and bytes per call by kind; strace slows every
#      call, so its counts of epoll_wait are those of a slow server.
# Requests are wrk's count for that run (32 connects and closes included:
# ≤ 0.01 per request). Compare columns of the same run.
#
#   SLUICE_BIN (default build/sluice), SLUICE_BASE_BIN (optional),
#   SC_FLOOR (default 1: build/tools/floor_relay as a target, the relay
#   that reads nothing: the calls and kernel work any proxy pays),
#   SC_PROFILE (a frequency: also `perf record -g` of a third run, kept in
#   $WORK/TARGET.data with BENCH_KEEP=1), SC_CONFS (default "plain full"), SC_SECONDS (default 4), SC_CONNS
#   (default 32), SC_NGINX (default 1), SC_STRACE (default 1),
#   BENCH_PORT_BASE (default 28950), BENCH_KEEP=1 keeps the raw counts.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SLUICE_BIN=${SLUICE_BIN:-$ROOT/build/sluice}
SLUICE_BASE_BIN=${SLUICE_BASE_BIN:-}
NGINX_BIN=${NGINX_BIN:-$(command -v nginx || echo /usr/sbin/nginx)}
CONFS=${SC_CONFS:-"plain full"}
SECONDS_RUN=${SC_SECONDS:-4}
CONNS=${SC_CONNS:-32}
PORT_BASE=${BENCH_PORT_BASE:-28950}
PROXY_CPU=${BENCH_PROXY_CPU:-1}
LOAD_CPU=${BENCH_LOAD_CPU:-0}
UP_PORT=$((PORT_BASE + 1))
NGX_PORT=$((PORT_BASE + 3))
FLOOR_PORT=$((PORT_BASE + 5))

for c in wrk perf strace taskset "$NGINX_BIN" "$SLUICE_BIN"; do
    command -v "$c" >/dev/null || { echo "bench: $c not found" >&2; exit 1; }
done

WORK=$(mktemp -d /tmp/sluice-syscalls.XXXXXX)
cp "$SLUICE_BIN" "$WORK/sluice"
[ -z "$SLUICE_BASE_BIN" ] || cp "$SLUICE_BASE_BIN" "$WORK/sluice-base"
. "$ROOT/bench/lib.sh"
ports_free "$UP_PORT" "$NGX_PORT" "$FLOOR_PORT" $(seq $((PORT_BASE + 11)) 2 $((PORT_BASE + 17))) \
    $(seq $((PORT_BASE + 21)) 2 $((PORT_BASE + 27)))

realistic_upstream "$UP_PORT" "$LOAD_CPU"

export SLUICE_BENCH_UPSTREAM_KEY=upstream-key
# sluice targets on +11, +13, ... (admin +21, ...), all bound before any load:
# the ports are odd and in the ephemeral range, where connect() takes even
# ones, and a port that a closed connection left in TIME_WAIT cannot be bound
realistic_conf plain $((PORT_BASE + 11)) $((PORT_BASE + 21)) plain
realistic_conf full $((PORT_BASE + 13)) $((PORT_BASE + 23)) full
realistic_conf plain@base $((PORT_BASE + 15)) $((PORT_BASE + 25)) plain
realistic_conf full@base $((PORT_BASE + 17)) $((PORT_BASE + 27)) full
TOKEN=$("$WORK/sluice" token --sub bench-user --ttl 1h -c "$WORK/full.yaml" |
    awk '/^access_token:/ { print $2 }')

# realistic.sh's nginx proxy, without a master: the one process does the work
nginx_proxy_conf "$WORK/ngx" "$UP_PORT" "$NGX_PORT" "" "" off

SYSCALLS="epoll_wait epoll_pwait epoll_ctl read readv recvfrom recvmsg write writev sendto sendmsg
    accept4 close getsockopt setsockopt ioctl"
EVENTS="raw_syscalls:sys_enter"
for s in $SYSCALLS; do EVENTS="$EVENTS,syscalls:sys_enter_$s"; done
EVENTS="$EVENTS,net:net_dev_xmit,net:netif_rx,sched:sched_wakeup,sched:sched_switch"
EVENTS="$EVENTS,timer:timer_start,timer:hrtimer_start,skb:skb_copy_datagram_iovec,skb:consume_skb"

# $1 target, $2 seconds, $3 output of wrk: one wrk run against it.
load() {
    local tok="" port=${PORT[$1]}
    case $1 in full*) tok=$TOKEN ;; esac
    BENCH_TOKEN=$tok taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" -d"$2"s --timeout 30s \
        -s "$ROOT/bench/realistic.lua" "http://127.0.0.1:$port/v1/chat/completions" >"$3"
    grep -q 'errors=0 non2xx=0' "$3" || { cat "$3" >&2; exit 1; }
    sed -n 's/^BENCH requests=\([0-9]*\).*/\1/p' "$3"
}

declare -A PID PORT
# $1 target: started (pinned) and listening, pid in PID[$1].
start() {
    local bin=$WORK/sluice i
    if [ "$1" = nginx ]; then
        spawn taskset -c "$PROXY_CPU" "$NGINX_BIN" -p "$WORK/ngx/" -e "$WORK/ngx/error.log" \
            -c "$WORK/ngx/nginx.conf"
        PID[$1]=$LAST PORT[$1]=$NGX_PORT
        wait_port "$NGX_PORT" "$LAST"
        return
    fi
    if [ "$1" = floor ]; then
        spawn taskset -c "$PROXY_CPU" "$ROOT/build/tools/floor_relay" -l "127.0.0.1:$FLOOR_PORT" \
            -u "127.0.0.1:$UP_PORT"
        PID[$1]=$LAST PORT[$1]=$FLOOR_PORT
        wait_port "$FLOOR_PORT" "$LAST"
        return
    fi
    [ "${1#*@}" = base ] && bin=$WORK/sluice-base
    spawn taskset -c "$PROXY_CPU" "$bin" -c "$WORK/$1.yaml"
    i=$(sed -n 's/^  - address: 127.0.0.1:\([0-9]*\)/\1/p' "$WORK/$1.yaml")
    PID[$1]=$LAST PORT[$1]=$i
    wait_admin_slow $((i + 10)) "$LAST"
}

# $1 target: warm it, count; writes $WORK/$1.perf, $WORK/$1.strace and the
# request counts of each run in $WORK/$1.n.
one() {
    local pid=${PID[$1]} _ spid n1 n2="0"
    load "$1" 1 "$WORK/$1.warm" >/dev/null
    perf stat -x, -e "$EVENTS" -p "$pid" -o "$WORK/$1.perf" &
    spid=$!
    sleep 0.3 # perf has no "attached" signal; a late start only loses requests' calls
    n1=$(load "$1" "$SECONDS_RUN" "$WORK/$1.wrk1")
    kill -INT "$spid"
    wait "$spid" || true
    if [ "${SC_STRACE:-1}" = 1 ]; then
        strace -f -qq -s 0 -p "$pid" -o "$WORK/$1.strace" 2>"$WORK/$1.slog" &
        spid=$!
        # bounded wait until strace says it attached ("Process N attached
        # with M threads": all of them at once)
        for _ in $(seq 200); do
            grep -q 'attached' "$WORK/$1.slog" 2>/dev/null && break
            sleep 0.05
        done
        n2=$(load "$1" "$SECONDS_RUN" "$WORK/$1.wrk2")
        kill -INT "$spid"
        wait "$spid" || true
    fi
    if [ -n "${SC_PROFILE:-}" ]; then
        # where its kernel time goes (sampled: a share, not a count)
        perf record -q -F "$SC_PROFILE" -g -p "$pid" -o "$WORK/$1.data" 2>/dev/null &
        spid=$!
        sleep 0.3
        load "$1" "$SECONDS_RUN" "$WORK/$1.wrk3" >"$WORK/$1.n3"
        kill -INT "$spid"
        wait "$spid" || true
    fi
    echo "$n1 $n2" >"$WORK/$1.n"
}

TARGETS=""
[ "${SC_NGINX:-1}" = 0 ] || TARGETS="nginx"
[ "${SC_FLOOR:-1}" = 0 ] || TARGETS="$TARGETS floor"
for c in $CONFS; do
    TARGETS="$TARGETS $c"
    [ -z "$SLUICE_BASE_BIN" ] || TARGETS="$TARGETS $c@base"
done
echo "kernel side per request: $(date -u '+%Y-%m-%d %H:%M UTC'), commit" \
    "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'), base ${SLUICE_BASE_BIN:-none}," \
    "wrk -c$CONNS, ${SECONDS_RUN}s per count, load average $(cut -d' ' -f1 /proc/loadavg)"
for t in $TARGETS; do start "$t"; done
for t in $TARGETS; do one "$t"; done

python3 - "$WORK" $TARGETS <<'EOF'
import collections, os, re, sys
work, targets = sys.argv[1], sys.argv[2:]
n = {t: [int(x) for x in open(os.path.join(work, t + ".n")).read().split()] for t in targets}
perf = collections.defaultdict(dict)
for t in targets:
    for ln in open(os.path.join(work, t + ".perf")):
        f = ln.strip().split(",")
        if len(f) < 3 or not f[0].replace(".", "").isdigit():
            continue
        ev = f[2].replace("syscalls:sys_enter_", "").replace("raw_syscalls:sys_enter", "all syscalls")
        perf[ev][t] = float(f[0]) / n[t][0]
head = "| per request | " + " | ".join(targets) + " |"
print("\nperf stat (untraced speed), requests: " + ", ".join("%s %d" % (t, n[t][0]) for t in targets))
print("\n" + head + "\n|" + " --- |" + " ---: |" * len(targets))
for ev, row in perf.items():
    if any(v >= 0.005 for v in row.values()):
        print("| %s | %s |" % (ev, " | ".join("%.2f" % row.get(t, 0) for t in targets)))
if all(n[t][1] for t in targets):
    # "PID name(args) = ret [ERRNO ...]", or the "<... name resumed> ... = ret" half
    CALL = re.compile(r"^\d+\s+(?:<\.\.\. )?([a-z_0-9]+)(?:\(| resumed>).*\)\s+=\s+(-?\d+)")
    calls, errs, nbytes = (collections.defaultdict(dict) for _ in range(3))
    IO = ("read", "readv", "recvfrom", "recvmsg", "write", "writev", "sendto", "sendmsg")
    for t in targets:
        c, e, b = collections.Counter(), collections.Counter(), collections.Counter()
        for ln in open(os.path.join(work, t + ".strace")):
            m = CALL.match(ln)
            if m:
                c[m.group(1)] += 1
                r = int(m.group(2))
                if r < 0:
                    e[m.group(1)] += 1
                elif m.group(1) in IO:
                    b[m.group(1)] += r
        for k in c:
            calls[k][t] = c[k] / n[t][1]
            errs[k][t] = e[k] / n[t][1]
            if k in IO and c[k] > e[k]:
                nbytes[k][t] = b[k] / (c[k] - e[k])
    print("\nstrace -f (calls per request; failed ones, bytes per call in brackets), requests: " +
          ", ".join("%s %d" % (t, n[t][1]) for t in targets))
    print("\n" + head + "\n|" + " --- |" + " ---: |" * len(targets))
    def cell(sc, t):
        x = "%.2f" % calls[sc].get(t, 0)
        if errs[sc].get(t):
            x += " (failed %.2f)" % errs[sc][t]
        if sc in nbytes and t in nbytes[sc]:
            x += " (%.0f B)" % nbytes[sc][t]
        return x
    for sc in sorted(calls, key=lambda s: -max(calls[s].values())):
        if max(calls[sc].values()) >= 0.005:
            print("| %s | %s |" % (sc, " | ".join(cell(sc, t) for t in targets)))
EOF

[ -n "${SC_PROFILE:-}" ] || exit 0
# Where the kernel time of a request goes, by call (sampled, so a share of
# the time: it moves with the load; compare columns of one run)
for t in $TARGETS; do
    perf report -i "$WORK/$t.data" --sort dso -g none -n -q 2>/dev/null >"$WORK/$t.dso"
    perf report -i "$WORK/$t.data" --children --sort sym -g none -q 2>/dev/null >"$WORK/$t.sym"
done
python3 - "$WORK" "$SC_PROFILE" $TARGETS <<'PY'
import os, re, sys
work, hz, targets = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
ROWS = [("read(2) / recvfrom(2)", ["ksys_read", "__sys_recvfrom"]),
        ("  of which tcp_recvmsg", ["tcp_recvmsg"]),
        ("writev(2) / sendmsg(2)", ["do_writev", "__sys_sendmsg"]),
        ("  of which tcp_sendmsg", ["tcp_sendmsg"]),
        ("  of which the peer's receive (net_rx_action)", ["net_rx_action"]),
        ("epoll_wait(2)", ["do_epoll_wait"]),
        ("  of which polling ready sockets (ep_item_poll)", ["ep_item_poll.isra.0", "ep_item_poll"]),
        ("getsockopt(2)", ["do_sock_getsockopt", "__sys_getsockopt"])]
col = {}
for t in targets:
    n = int(open(os.path.join(work, t + ".n3")).read())
    samples, kern = 0, 0
    for ln in open(os.path.join(work, t + ".dso")):
        f = ln.split()
        if len(f) >= 4 and f[2].isdigit():
            samples += int(f[2])
            kern += int(f[2]) if "[kernel" in ln else 0
    us = lambda s: s / hz / n * 1e6  # noqa: E731
    children = {}
    for ln in open(os.path.join(work, t + ".sym")):
        m = re.match(r"\s*([\d.]+)%\s+[\d.]+%\s+\[k\]\s+(\S+)", ln)
        if m:
            children.setdefault(m.group(2), float(m.group(1)) / 100 * samples)
    col[t] = [("requests sampled", "%d" % n), ("CPU µs per request", "%.2f" % us(samples)),
              ("kernel µs per request", "%.2f" % us(kern))]
    for name, syms in ROWS:
        col[t].append((name, "%.2f" % us(max(children.get(s, 0) for s in syms))))
print("\nperf record -F %d (sampled µs per request)\n" % hz)
print("| | " + " | ".join(targets) + " |\n|" + " --- |" + " ---: |" * len(targets))
for i, (name, _) in enumerate(col[targets[0]]):
    print("| %s | %s |" % (name, " | ".join(col[t][i][1] for t in targets)))
PY
