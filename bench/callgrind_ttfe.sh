#!/usr/bin/env bash
# bench/callgrind_ttfe.sh — the two segments on the critical path of the SSE
# time to first event (run.sh's ttfe phase), counted by valgrind's callgrind
# for sluice (and a base binary) and nginx set up as run.sh sets them up:
#
#   A: the loop's return from epoll_wait with the client's request readable
#      -> the writev of the request upstream
#   B: the return from epoll_wait with the upstream's head + first event
#      -> the writev of head + first event to the client
#
# Per segment: user-space instructions (Ir) and the distinct 64-byte lines of
# code they ran (what the segment needs in the instruction cache: after the
# proxy has slept ~1 ms between requests, a cold cache pays per line, not
# per instruction). Medians over the requests. Both are immune to the
# machine's load. Callgrind dumps its counters just before every writev and
# just after every epoll_wait (--dump-before/--dump-after); a dump that
# follows an epoll_wait and ends in a writev is one segment, told A or B by
# the functions it ran. The upstream (bench_upstream) waits 200 ms before the
# second event, so even under valgrind the first event is read alone, as in
# run.sh. Syscalls per segment: strace one request per proxy (no valgrind).
#
#   SLUICE_BIN (default build/sluice), SLUICE_BASE_BIN (optional, same run),
#   CG_TTFE_N (requests, default 40), BENCH_PORT_BASE (default 29300),
#   BENCH_KEEP=1 keeps the dumps, CG_NGINX=0 leaves nginx out. Functions are
#   matched with or without GCC's clone suffixes (.lto_priv.0, .isra.0).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SLUICE_BIN=${SLUICE_BIN:-$ROOT/build/sluice}
SLUICE_BASE_BIN=${SLUICE_BASE_BIN:-}
NGINX_BIN=${NGINX_BIN:-$(command -v nginx || echo /usr/sbin/nginx)}
TOOLS=${BENCH_TOOLS:-$ROOT/build/tools}
N=${CG_TTFE_N:-40}
PORT_BASE=${BENCH_PORT_BASE:-29300}
UP_PORT=$((PORT_BASE + 1))
PORT=$((PORT_BASE + 10))

for c in valgrind strace python3 "$NGINX_BIN" "$SLUICE_BIN" "$TOOLS/bench_ttfe" \
    "$TOOLS/bench_upstream"; do
    command -v "$c" >/dev/null || { echo "bench: $c not found" >&2; exit 1; }
done

WORK=$(mktemp -d /tmp/sluice-cgttfe.XXXXXX)
. "$ROOT/bench/lib.sh"
ports_free "$UP_PORT" "$PORT"
cp "$SLUICE_BIN" "$WORK/sluice"
NG=nginx
[ "${CG_NGINX:-1}" = 1 ] || NG=
TARGETS="$NG this"
if [ -n "$SLUICE_BASE_BIN" ]; then
    cp "$SLUICE_BASE_BIN" "$WORK/sluice-base"
    TARGETS="$NG this base"
fi

spawn "$TOOLS/bench_upstream" -l "127.0.0.1:$UP_PORT" -n 2 -d 200000
wait_port "$UP_PORT" "$LAST"

# run.sh's two proxies (write_nginx_conf / write_sluice_conf), nginx as one
# process so that one callgrind sees its work
nginx_conf "$WORK/ngx" "
    keepalive_timeout 60s;
    upstream bench { server 127.0.0.1:$UP_PORT; keepalive 64; }
    server {
        listen 127.0.0.1:$PORT;
        location / {
            proxy_pass http://bench;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
            proxy_buffering off;
        }
    }" off
bench_sluice_conf "$PORT" "$UP_PORT" >"$WORK/sluice.yaml"

cmd_of() {
    case $1 in
    nginx) echo "$NGINX_BIN -p $WORK/ngx/ -e $WORK/ngx/error.log -c $WORK/ngx/nginx.conf" ;;
    this) echo "$WORK/sluice -c $WORK/sluice.yaml" ;;
    base) echo "$WORK/sluice-base -c $WORK/sluice.yaml" ;;
    esac
}

# $1 target: callgrind dumps in $WORK/$1/
one() {
    local d=$WORK/$1 pid _
    mkdir -p "$d"
    # shellcheck disable=SC2046
    spawn valgrind --tool=callgrind --callgrind-out-file="$d/cg.%p" --dump-instr=yes \
        --dump-before=writev --dump-after=epoll_wait $(cmd_of "$1") 2>"$d/valgrind.log"
    pid=$LAST
    for _ in $(seq 600); do
        kill -0 "$pid" 2>/dev/null || { echo "bench: $1 died" >&2; exit 1; }
        (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break
        sleep 0.1
    done
    "$TOOLS/bench_ttfe" -c "127.0.0.1:$PORT" -n "$N" -w 5 >/dev/null
    stop "$pid"
}

# $1 target: the syscalls of one request (after 5 warm ones), no valgrind
syscalls() {
    local pid
    # shellcheck disable=SC2046
    spawn $(cmd_of "$1")
    pid=$LAST
    wait_port "$PORT" "$pid"
    "$TOOLS/bench_ttfe" -c "127.0.0.1:$PORT" -n 5 -w 0 >/dev/null
    spawn strace -f -qq -o "$WORK/$1.strace" -p "$pid"
    local st=$LAST
    sleep 0.5
    "$TOOLS/bench_ttfe" -c "127.0.0.1:$PORT" -n 1 -w 0 >/dev/null
    sleep 0.3
    stop "$st"
    stop "$pid"
    python3 - "$WORK/$1.strace" <<'PY'
import re, sys
calls = [re.sub(r'^\d+\s+', '', l) for l in open(sys.argv[1])]
calls = [l.split('(')[0] for l in calls if re.match(r'[a-z_0-9]+\(', l)]
print(' '.join(calls))
PY
}

echo "time to first event, critical path: $(date -u '+%Y-%m-%d %H:%M UTC'), commit" \
    "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'), $N requests"
echo
echo "| proxy | A: Ir | A: code lines | B: Ir | B: code lines | A+B Ir | A+B lines |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
for t in $TARGETS; do
    one "$t"
    python3 - "$t" "$WORK/$t" <<'PY'
import glob, os, re, statistics, sys
t, d = sys.argv[1], sys.argv[2]
marks = {"nginx": ("ngx_http_parse_request_line", "ngx_http_parse_status_line"),
         "this": ("gw_conn_readcb", "gw_proxy_write_head"),
         "base": ("gw_conn_readcb", "gw_proxy_write_head")}[t]

def parse(path):
    """(trigger, Ir, distinct code lines, text) of one dump"""
    trig, ir, lines, names = "", 0, set(), {}
    ob, addr, skip = None, 0, False
    text = open(path).read()
    for l in text.splitlines():
        if l.startswith("desc: Trigger:"):
            trig = l.split("--dump-")[-1]
        elif l.startswith("summary:"):
            ir = int(l.split()[1])
        elif l.startswith(("ob=", "cob=")):
            m = re.match(r"c?ob=\((\d+)\)(?: (.*))?", l)
            if m[2]:
                names[m[1]] = m[2]
            if l[0] == "o":
                ob = m[1]
        elif l.startswith("calls="):
            skip = True
        elif l and (l[0] in "+-*" or l.startswith("0x")):
            a = l.split()[0]
            if a.startswith("0x"):
                addr = int(a, 16)
            elif a[0] == "+":
                addr += int(a[1:])
            elif a[0] == "-":
                addr -= int(a[1:])
            if skip:
                skip = False
                continue
            lines.add((ob, addr >> 6))
    return trig, ir, len(lines), text

files = sorted(glob.glob(d + "/cg.*.*"), key=lambda p: int(p.rsplit(".", 1)[1]))
prev, seg = "", {0: [], 1: []}
for p in files:
    trig, ir, nl, text = parse(p)
    if trig == "before=writev" and prev == "after=epoll_wait":
        for k in (0, 1):
            if re.search(r"fn=\(\d+\) " + marks[k] + r"(\.\w+)*$", text, re.M):
                seg[k].append((ir, nl))
                break
    prev = trig
def med(k, i):
    return int(statistics.median(x[i] for x in seg[k][5:] or seg[k]))
a, b = (med(0, 0), med(0, 1)), (med(1, 0), med(1, 1))
print(f"| {t} | {a[0]:,} | {a[1]:,} | {b[0]:,} | {b[1]:,} | {a[0]+b[0]:,} | {a[1]+b[1]:,} |"
      f"  <!-- segments seen: A {len(seg[0])}, B {len(seg[1])} -->")
PY
done
echo
echo "Syscalls of one streamed request (strace, no valgrind):"
for t in $TARGETS; do
    echo "- $t: $(syscalls "$t")"
done
