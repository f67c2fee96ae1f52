#!/usr/bin/env bash
# bench/kernel_req.sh — what the event loop's kernel side costs per request
# (issue #16 "plain", #21 item 4): for each target (nginx as a proxy and
# each sluice binary, same run, interleaved per step) at each concurrency
# (wrk -t1 -cC, bench/scale.sh's method: a warm-up run, then a measured run
# of KR_SECONDS, wrk's connects and closes included), per request served
# in that run:
#   - instructions:u and :k (perf stat -p; "n/a" where the machine has no
#     hardware counters, as in a VM without a PMU), context switches,
#     all syscalls, epoll_wait and epoll_ctl calls;
#   - events returned per epoll_wait (perf record of
#     syscalls:sys_exit_epoll_wait, its return values averaged);
#   - CPU µs per request, user and system (/proc ticks: wall-clock
#     context, it moves with the machine's load);
#   - with KR_PROFILE=1 also a cpu-clock profile (perf record -g of another
#     window): kernel µs per request in epoll_wait, in polling ready
#     sockets (ep_item_poll, which calls tcp_poll) and in recv/send.
# Counts (calls, events per wait) are load-immune; times are not.
#
# Binaries: KR_BINS="name=path ..." (default "sluice=build/sluice"), e.g.
#   KR_BINS="base=/tmp/base/build/sluice et=build/sluice" bench/kernel_req.sh
# Knobs: KR_CONNS ("32 1000 5000"), KR_SECONDS (4), KR_NGINX (1),
# KR_PROFILE (0), BENCH_PROXY_CPU / BENCH_LOAD_CPU, BENCH_PORT_BASE, BENCH_KEEP=1.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
NGINX_BIN=${NGINX_BIN:-$(command -v nginx || echo /usr/sbin/nginx)}
PROXY_CPU=${BENCH_PROXY_CPU:-1}
LOAD_CPU=${BENCH_LOAD_CPU:-0}
PORT_BASE=${BENCH_PORT_BASE:-22800}
CONNS=${KR_CONNS:-32 1000 5000}
SECS=${KR_SECONDS:-4}
BINS=${KR_BINS:-sluice=$ROOT/build/sluice}
WITH_NGINX=${KR_NGINX:-1}
PROFILE=${KR_PROFILE:-0}
UP_PORT=$((PORT_BASE + 1))
NGINX_PORT=$((PORT_BASE + 10))

for c in wrk perf taskset curl python3 "$NGINX_BIN"; do
    command -v "$c" >/dev/null || { echo "kernel_req: $c missing" >&2; exit 1; }
done
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"

WORK=$(mktemp -d /tmp/sluice-kreq.XXXXXX)
. "$ROOT/bench/lib.sh"
ports_free $(seq $((PORT_BASE + 1)) $((PORT_BASE + 30)))

# The upstream: nginx answering 200 with a fixed chat.completion (scale.sh's).
scale_upstream_conf "$WORK/up" "$UP_PORT"
spawn taskset -c "$LOAD_CPU" "$NGINX_BIN" -p "$WORK/up/" -e "$WORK/up/error.log" -c "$WORK/up/nginx.conf"
wait_port "$UP_PORT" "$LAST"

declare -A BIN PORT APORT PID
targets=()
i=0
for nb in $BINS; do
    n=${nb%%=*}
    targets+=("$n")
    BIN[$n]=${nb#*=}
    [ -x "${BIN[$n]}" ] || { echo "kernel_req: ${BIN[$n]} missing" >&2; exit 1; }
    PORT[$n]=$((PORT_BASE + 20 + 2 * i))
    APORT[$n]=$((PORT_BASE + 21 + 2 * i))
    mkdir -p "$WORK/s-$n"
    bench_sluice_conf "${PORT[$n]}" "$UP_PORT" "${APORT[$n]}" - error >"$WORK/s-$n/sluice.yaml"
    spawn taskset -c "$PROXY_CPU" "${BIN[$n]}" -c "$WORK/s-$n/sluice.yaml"
    PID[$n]=$LAST
    wait_admin_slow "${APORT[$n]}" "$LAST"
    i=$((i + 1))
done
if [ "$WITH_NGINX" = 1 ]; then
    # nginx as a proxy, one worker pinned like sluice (scale.sh's)
    scale_proxy_conf "$WORK/np" "$NGINX_PORT" "$UP_PORT"
    spawn taskset -c "$PROXY_CPU" "$NGINX_BIN" -p "$WORK/np/" -e "$WORK/np/error.log" -c "$WORK/np/nginx.conf"
    wait_port "$NGINX_PORT" "$LAST"
    PID[nginx]=$(pgrep -P "$LAST" | head -n1)
    PORT[nginx]=$NGINX_PORT
    targets=(nginx "${targets[@]}")
fi

# Requests the target served so far (sluice's counter, nginx's stub_status).
served() {
    if [ "$1" = nginx ]; then
        curl -s --max-time 5 "http://127.0.0.1:$NGINX_PORT/nginx_status" | awk 'NR == 3 { print $3 }'
    else
        curl -s --max-time 5 "http://127.0.0.1:${APORT[$1]}/metrics" |
            awk '/^sluice_requests_total[{ ]/ { v += $NF } END { printf "%d\n", v }'
    fi
}
ticks() { awk '{ sub(/^.*\) /, ""); printf "%d %d\n", $12, $13 }' "/proc/$1/stat"; }

EVENTS=instructions:u,instructions:k,context-switches,raw_syscalls:sys_enter
EVENTS=$EVENTS,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_epoll_ctl
TCK=$(getconf CLK_TCK)
echo "kernel side per request: $(date -u '+%Y-%m-%d %H:%M UTC'), commit" \
    "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'), binaries: $BINS," \
    "wrk -t1, ${SECS}s counted per step, load average $(cut -d' ' -f1 /proc/loadavg)"
: >"$WORK/rows"
for c in $CONNS; do
    for t in "${targets[@]}"; do
        pid=${PID[$t]} url="http://127.0.0.1:${PORT[$t]}/v1/chat/completions"
        taskset -c "$LOAD_CPU" wrk -t1 -c"$c" -d"${SECS}s" --timeout 10s -s "$ROOT/bench/post.lua" \
            "$url" >/dev/null 2>&1 || true
        # The measured run: both perf sessions attach before wrk starts and
        # stop when it ends, so the window is the whole run (wrk's connects
        # and closes included); requests are the target's own count.
        read -r u0 s0 < <(ticks "$pid")
        q0=$(served "$t")
        perf record -q -e syscalls:sys_exit_epoll_wait -p "$pid" -o "$WORK/ew.data" -- \
            perf stat -x, -o "$WORK/stat" -e "$EVENTS" -p "$pid" -- \
            taskset -c "$LOAD_CPU" wrk -t1 -c"$c" -d"${SECS}s" --timeout 10s \
            -s "$ROOT/bench/post.lua" "$url" >"$WORK/wrk.out" 2>&1
        read -r u1 s1 < <(ticks "$pid")
        q1=$(served "$t")
        kus=-1
        if [ "$PROFILE" = 1 ]; then
            q2=$(served "$t")
            perf record -q -F 2999 -e cpu-clock -g -p "$pid" -o "$WORK/$t-c$c.data" -- \
                taskset -c "$LOAD_CPU" wrk -t1 -c"$c" -d"${SECS}s" --timeout 10s \
                -s "$ROOT/bench/post.lua" "$url" >/dev/null 2>&1
            q3=$(served "$t")
            perf report -i "$WORK/$t-c$c.data" --children --sort sym -g none -q 2>/dev/null \
                >"$WORK/$t-c$c.sym"
            perf report -i "$WORK/$t-c$c.data" --sort dso -g none -n -q 2>/dev/null >"$WORK/$t-c$c.dso"
            kus=$((q3 - q2))
        fi
        grep -q 'errors=0 non2xx=0' "$WORK/wrk.out" || echo "kernel_req: $t c$c: $(grep BENCH "$WORK/wrk.out")" >&2
        # each line ends with the return value (hex): events returned
        perf script -i "$WORK/ew.data" -F trace 2>/dev/null |
            python3 -c 'import sys
v = [int(l.split()[-1], 0) for l in sys.stdin if l.split()]
v = [x for x in v if 0 <= x < 1 << 31]
print(len(v), sum(v))' >"$WORK/ew"
        read -r ewn ews <"$WORK/ew"
        echo "$c $t $((q1 - q0)) $((u1 - u0)) $((s1 - s0)) $ewn $ews $kus" >>"$WORK/rows"
        cp "$WORK/stat" "$WORK/stat-$t-c$c"
    done
done

python3 - "$WORK" "$TCK" "$PROFILE" <<'PY'
import os, re, sys
work, tck, prof = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "1"
rows = [l.split() for l in open(os.path.join(work, "rows"))]
NAMES = [("instructions:u", "instructions:u"), ("instructions:k", "instructions:k"),
         ("context-switches", "context switches"), ("raw_syscalls:sys_enter", "syscalls"),
         ("syscalls:sys_enter_epoll_wait", "epoll_wait"), ("syscalls:sys_enter_epoll_ctl", "epoll_ctl")]
out = {}
for c, t, q, u, s, ewn, ews, kq in rows:
    q = max(int(q), 1)
    col = {"requests counted": "%d" % q}
    stat = {}
    for ln in open(os.path.join(work, "stat-%s-c%s" % (t, c))):
        f = ln.strip().split(",")
        if len(f) >= 3 and f[2]:
            stat[f[2]] = f[0]
    for ev, name in NAMES:
        v = stat.get(ev, "")
        col[name] = "%.2f" % (float(v) / q) if re.match(r"^[\d.]+$", v) else "n/a"
    col["events per epoll_wait"] = "%.2f" % (int(ews) / int(ewn)) if int(ewn) else "n/a"
    col["CPU µs (user+sys)"] = "%.2f" % ((int(u) + int(s)) * 1e6 / tck / q)
    col["  of which sys"] = "%.2f" % (int(s) * 1e6 / tck / q)
    if prof and int(kq) > 0:
        base = os.path.join(work, "%s-c%s" % (t, c))
        samples = kern = 0
        for ln in open(base + ".dso"):
            f = ln.split()
            if len(f) >= 4 and f[2].isdigit():
                samples += int(f[2])
                kern += int(f[2]) if "[kernel" in ln else 0
        ch = {}
        for ln in open(base + ".sym"):
            m = re.match(r"\s*([\d.]+)%\s+[\d.]+%\s+\[k\]\s+(\S+)", ln)
            if m:
                ch.setdefault(m.group(2), float(m.group(1)) / 100 * samples)
        us = lambda x: "%.2f" % (x / 2999 / int(kq) * 1e6)  # noqa: E731
        col["sampled: kernel µs"] = us(kern)
        col["  epoll_wait"] = us(ch.get("do_epoll_wait", 0))
        col["  ep_item_poll"] = us(max(ch.get("ep_item_poll.isra.0", 0), ch.get("ep_item_poll", 0)))
        col["  tcp_poll"] = us(ch.get("tcp_poll", 0))
        col["  recv (recvfrom, read)"] = us(max(ch.get("__sys_recvfrom", 0), ch.get("ksys_read", 0)))
        col["  send (sendmsg, writev)"] = us(max(ch.get("__sys_sendmsg", 0), ch.get("do_writev", 0)))
    out.setdefault(c, {})[t] = col
for c, cols in out.items():
    ts = list(cols)
    print("\nwrk -c%s, per request:\n" % c)
    print("| | " + " | ".join(ts) + " |\n| --- |" + " ---: |" * len(ts))
    for k in cols[ts[0]]:
        print("| %s | %s |" % (k, " | ".join(cols[t].get(k, "") for t in ts)))
PY
