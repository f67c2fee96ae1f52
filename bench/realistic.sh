#!/usr/bin/env bash
# bench/realistic.sh — issue #16's workload: what a realistic chat request
# costs sluice in CPU, as a ratio to nginx proxying the same request in the
# same run; and what each KiB of request body costs (issue #21.3).
#
# Layout (2 cores): every proxy (nginx, and each sluice: workers 1, access
# log off) pinned to core 1; the upstream (nginx `return 200` with a fixed
# 282-byte chat.completion) and wrk -t1 -c32 on core 0. Configurations run
# in interleaved rounds, so machine noise hits them alike; the figure is
# the proxy's CPU (utime+stime from /proc) per request, and its ratio to
# nginx's in the same round (median over rounds).
#
#   nginx     proxy_pass with upstream keepalive            (the baseline)
#   plain     alias chat-model -> served-model, api_key_env, admin listener
#   full      plain + HS256 bearer token (no signature), ratelimit.per_user
#             {requests_per_minute: 1000000, concurrent: 1000}, a 1,001-word
#             list (mask) and a regex 1[3-9]\d{9} (mask), output: true
#   full-sse  full, the request with "stream":true and the answer a stream of
#             8 events (build/tools/bench_upstream -n 8), the output filter on
#             every event; against nginx-sse (proxy_buffering off) in the
#             same rounds (BENCH_SSE=0 skips them)
#   floor     build/tools/floor_relay: every client connection relayed
#             byte for byte to its own upstream connection, unread — the
#             kernel work any proxy pays per request and next to no user
#             space: the lowest CPU per request a proxy can reach here
#             (BENCH_FLOOR=0 leaves it out)
#   goals: plain <= 0.8 x nginx, full <= 1.0 x nginx, full-sse <= 1.0 x nginx-sse
# With SLUICE_BASE_BIN (e.g. a build of main) plain and full also run on that
# binary (plain@base, full@base): before and after in the same run.
#
# Body sizes (BENCH_SIZES KiB, default "1 16 256 1024"): the plain conf (but
# filters.input.max_chars: 0, the default 8000 would refuse them) with a user
# message that long; per size the CPU per request, and the µs per KiB
# beyond the first ((cpu(size) - cpu(1)) / (size - 1)); goal <= 1 µs/KiB.
# nginx proxies the same bodies in the same rounds (ngxsize*: the body held
# in memory, client_body_buffer_size 4m, proxy_request_buffering on, its
# default): the floor a plain proxy pays per KiB on this machine, and
# sluice's µs/KiB as a ratio to it. BENCH_SIZES_ONLY=1 runs the sizes alone.
#
# Knobs: BENCH_DURATION (s per run, default 5), BENCH_ROUNDS (default 3),
# BENCH_CONNS (default 32; the body sizes: BENCH_SIZE_CONNS, default 4), BENCH_PORT_BASE (default 28700), SLUICE_BIN,
# SLUICE_BASE_BIN, BENCH_SIZES ("" skips them), BENCH_PROXY_CPU /
# BENCH_LOAD_CPU, BENCH_KEEP=1 keeps the work directory.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SLUICE_BIN=${SLUICE_BIN:-$ROOT/build/sluice}
SLUICE_BASE_BIN=${SLUICE_BASE_BIN:-}
NGINX_BIN=${NGINX_BIN:-$(command -v nginx || echo /usr/sbin/nginx)}
PROXY_CPU=${BENCH_PROXY_CPU:-1}
LOAD_CPU=${BENCH_LOAD_CPU:-0}
DURATION=${BENCH_DURATION:-5}
ROUNDS=${BENCH_ROUNDS:-3}
CONNS=${BENCH_CONNS:-32}
PORT_BASE=${BENCH_PORT_BASE:-28700}
SIZES=${BENCH_SIZES-"1 16 256 1024"}
SIZES_ONLY=${BENCH_SIZES_ONLY:-0}
SIZE_CONNS=${BENCH_SIZE_CONNS:-4}
SSE=${BENCH_SSE:-1}
FLOOR=${BENCH_FLOOR:-1}

UP_PORT=$((PORT_BASE + 1))
NGX_PORT=$((PORT_BASE + 2))
SSE_UP_PORT=$((PORT_BASE + 3))
NGX_SSE_PORT=$((PORT_BASE + 4))
FLOOR_PORT=$((PORT_BASE + 5))

for c in wrk taskset python3 "$NGINX_BIN" "$SLUICE_BIN"; do
    command -v "$c" >/dev/null || { echo "bench: $c not found" >&2; exit 1; }
done

WORK=$(mktemp -d /tmp/sluice-realistic-bench.XXXXXX)
RES=$WORK/results.tsv
# Private copies: a rebuild during the run must not touch what is measured.
cp "$SLUICE_BIN" "$WORK/sluice"
SLUICE_LABEL=$SLUICE_BIN
SLUICE_BIN=$WORK/sluice
if [ -n "$SLUICE_BASE_BIN" ]; then
    cp "$SLUICE_BASE_BIN" "$WORK/sluice-base"
fi
. "$ROOT/bench/lib.sh"

CONFIGS="nginx plain full"
[ "$FLOOR" = 1 ] && CONFIGS="nginx floor plain full"
[ -n "$SLUICE_BASE_BIN" ] && CONFIGS="$CONFIGS plain@base full@base"
if [ "$SSE" = 1 ]; then
    CONFIGS="$CONFIGS nginx-sse full-sse"
    [ -n "$SLUICE_BASE_BIN" ] && CONFIGS="$CONFIGS full-sse@base"
fi
[ "$SIZES_ONLY" = 1 ] && CONFIGS=""
SIZE_CONFIGS=""
for k in $SIZES; do SIZE_CONFIGS="$SIZE_CONFIGS ngxsize$k size$k"; done
[ -n "$SLUICE_BASE_BIN" ] && for k in $SIZES; do SIZE_CONFIGS="$SIZE_CONFIGS size$k@base"; done

port_of() { # one sluice per binary and conf; the size runs share "plain"'s
    case $1 in
    nginx | ngxsize*) echo "$NGX_PORT" ;;
    nginx-sse) echo "$NGX_SSE_PORT" ;;
    floor) echo "$FLOOR_PORT" ;;
    full-sse) echo $((PORT_BASE + 16)) ;;
    full-sse@base) echo $((PORT_BASE + 17)) ;;
    plain) echo $((PORT_BASE + 10)) ;;
    full) echo $((PORT_BASE + 11)) ;;
    plain@base) echo $((PORT_BASE + 12)) ;;
    full@base) echo $((PORT_BASE + 13)) ;;
    size*@base) echo $((PORT_BASE + 15)) ;;
    size*) echo $((PORT_BASE + 14)) ;;
    esac
}

ports_free "$UP_PORT" "$NGX_PORT" "$SSE_UP_PORT" "$NGX_SSE_PORT" "$FLOOR_PORT" $(seq $((PORT_BASE + 10)) $((PORT_BASE + 17)))

# ---- the upstream: nginx answering every request with a 282-byte chat.completion
[ ${#REALISTIC_ANSWER} = 282 ] || { echo "bench: the answer is ${#REALISTIC_ANSWER} bytes" >&2; exit 1; }
# bodies up to 1 MiB stay in memory (issue #21.3: the same work as sluice)
NGX_BODY="    client_max_body_size 4m;
    client_body_buffer_size 4m;"
realistic_upstream "$UP_PORT" "$LOAD_CPU" "$NGX_BODY"

# ---- nginx as the proxy (the baseline): upstream keepalive, HTTP/1.1
nginx_proxy_conf "$WORK/ngx" "$UP_PORT" "$NGX_PORT" "" "$NGX_BODY"
spawn taskset -c "$PROXY_CPU" "$NGINX_BIN" -p "$WORK/ngx/" -e "$WORK/ngx/error.log" \
    -c "$WORK/ngx/nginx.conf"
NGX_PID=$LAST
wait_port "$NGX_PORT" "$LAST"
# nginx's worker is the child doing the work; count the master too (idle).
NGX_PIDS="$NGX_PID $(pgrep -P "$NGX_PID" | tr '\n' ' ')"

# ---- the floor: a relay that reads nothing (tests/tools/floor_relay.c)
if [ "$FLOOR" = 1 ]; then
    spawn taskset -c "$PROXY_CPU" "$ROOT/build/tools/floor_relay" -l "127.0.0.1:$FLOOR_PORT" \
        -u "127.0.0.1:$UP_PORT"
    FLOOR_PID=$LAST
    wait_port "$FLOOR_PORT" "$LAST"
fi

# ---- the SSE workload: an upstream streaming 8 events, nginx relaying it
if [ "$SSE" = 1 ]; then
    spawn taskset -c "$LOAD_CPU" "$ROOT/build/tools/bench_upstream" -l "127.0.0.1:$SSE_UP_PORT" -n 8
    wait_port "$SSE_UP_PORT" "$LAST"
    nginx_proxy_conf "$WORK/ngx-sse" "$SSE_UP_PORT" "$NGX_SSE_PORT" "proxy_buffering off;" "$NGX_BODY"
    spawn taskset -c "$PROXY_CPU" "$NGINX_BIN" -p "$WORK/ngx-sse/" -e "$WORK/ngx-sse/error.log" \
        -c "$WORK/ngx-sse/nginx.conf"
    wait_port "$NGX_SSE_PORT" "$LAST"
    NGX_SSE_PIDS="$LAST $(pgrep -P "$LAST" | tr '\n' ' ')"
    realistic_sse_body "$WORK/body-sse.json"
fi

# ---- sluice confs
export SLUICE_BENCH_UPSTREAM_KEY=upstream-key

realistic_conf bodies $((PORT_BASE + 14)) $((PORT_BASE + 24)) bodies
realistic_conf bodies-base $((PORT_BASE + 15)) $((PORT_BASE + 25)) bodies
realistic_conf plain $((PORT_BASE + 10)) $((PORT_BASE + 20)) plain
realistic_conf full $((PORT_BASE + 11)) $((PORT_BASE + 21)) full
realistic_conf plain-base $((PORT_BASE + 12)) $((PORT_BASE + 22)) plain
realistic_conf full-base $((PORT_BASE + 13)) $((PORT_BASE + 23)) full
realistic_conf full-sse $((PORT_BASE + 16)) $((PORT_BASE + 26)) full "$SSE_UP_PORT"
realistic_conf full-sse-base $((PORT_BASE + 17)) $((PORT_BASE + 27)) full "$SSE_UP_PORT"

TOKEN=$("$SLUICE_BIN" token --sub bench-user --ttl 1h -c "$WORK/full.yaml" |
    awk '/^access_token:/ { print $2 }')
[ -n "$TOKEN" ] || { echo "bench: sluice token failed" >&2; exit 1; }

declare -A SPID
start_sluice() { # $1 key, $2 binary, $3 conf
    spawn taskset -c "$PROXY_CPU" "$2" -c "$WORK/$3.yaml" 2>"$WORK/$3.err"
    SPID[$1]=$LAST
    wait_port "$(port_of "$1")" "$LAST"
}
start_sluice plain "$SLUICE_BIN" plain
start_sluice full "$SLUICE_BIN" full
[ -n "$SIZES" ] && start_sluice size "$SLUICE_BIN" bodies
[ "$SSE" = 1 ] && start_sluice full-sse "$SLUICE_BIN" full-sse
[ "$SSE" = 1 ] && [ -n "$SLUICE_BASE_BIN" ] && start_sluice full-sse@base "$WORK/sluice-base" full-sse-base
if [ -n "$SLUICE_BASE_BIN" ]; then
    start_sluice plain@base "$WORK/sluice-base" plain-base
    start_sluice full@base "$WORK/sluice-base" full-base
    [ -n "$SIZES" ] && start_sluice size@base "$WORK/sluice-base" bodies-base
fi

# ---- bodies of each size: the realistic request with a user message that long
for k in $SIZES; do
    python3 - "$k" "$WORK/body$k.json" <<'EOF'
import json, sys
kib, path = int(sys.argv[1]), sys.argv[2]
head = {"model": "chat-model", "max_tokens": 64, "messages": [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": ""}]}
empty = len(json.dumps(head, separators=(",", ":")))
line = "Write one sentence about the sea, please, in plain English. "
text = (line * (kib * 1024 // len(line) + 1))[: kib * 1024 - empty]
head["messages"][1]["content"] = text
b = json.dumps(head, separators=(",", ":")).encode()
assert len(b) == kib * 1024, len(b)
open(path, "wb").write(b)
EOF
done

run() { # $1 config, $2 round ("warm" = not recorded)
    local c=$1 port pids t0 t1 u0 u1 out line tok="" body="" conns=$CONNS
    port=$(port_of "$c")
    case $c in
    nginx | ngxsize*) pids=$NGX_PIDS ;;
    nginx-sse) pids=$NGX_SSE_PIDS ;;
    floor) pids=$FLOOR_PID ;;
    size*@base) pids=${SPID[size@base]} ;;
    size*) pids=${SPID[size]} ;;
    *) pids=${SPID[$c]} ;;
    esac
    case $c in full*) tok=$TOKEN ;; esac
    case $c in *-sse*) body=$WORK/body-sse.json ;; esac
    case $c in size* | ngxsize*)
        local k=${c#*size}
        k=${k%@base}
        body=$WORK/body$k.json
        conns=$SIZE_CONNS # a MiB body takes the old build > 1 s: fewer in flight
        ;;
    esac
    # shellcheck disable=SC2086
    read -r t0 u0 <<<"$(cpu_user_ticks $pids)"
    out=$(BENCH_TOKEN=$tok BENCH_BODY_FILE=$body taskset -c "$LOAD_CPU" wrk -t1 -c"$conns" \
        -d"$DURATION"s --timeout 30s --latency -s "$ROOT/bench/realistic.lua" \
        "http://127.0.0.1:$port/v1/chat/completions")
    # shellcheck disable=SC2086
    read -r t1 u1 <<<"$(cpu_user_ticks $pids)"
    line=$(grep '^BENCH ' <<<"$out") || { echo "$out" >&2; exit 1; }
    if ! grep -q 'errors=0 non2xx=0' <<<"$line"; then
        echo "bench: $c had errors or non-2xx answers: $line" >&2
        exit 1
    fi
    [ "$2" = warm ] && return 0
    echo "$c $2 $line ticks=$((t1 - t0))" >>"$RES"
    echo "  round $2 $c: ${line#BENCH } cpu_ticks=$((t1 - t0)) user_ticks=$((u1 - u0))"
}

echo "sluice realistic bench: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores," \
    "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
echo "commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'), $SLUICE_LABEL," \
    "base ${SLUICE_BASE_BIN:-none}, wrk -t1 -c$CONNS, ${DURATION}s runs, $ROUNDS rounds," \
    "load average $(cut -d' ' -f1-3 /proc/loadavg)"
for c in $CONFIGS $SIZE_CONFIGS; do run "$c" warm; done
for r in $(seq "$ROUNDS"); do
    for c in $CONFIGS $SIZE_CONFIGS; do run "$c" "$r"; done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$RES" "$(getconf CLK_TCK)" <<'EOF'
import statistics, sys
rows, tck = {}, int(sys.argv[2])
for ln in open(sys.argv[1]):
    f = ln.split()
    kv = dict(x.split("=") for x in f[3:])
    n, us = int(kv["requests"]), int(kv["duration_us"])
    rows.setdefault(f[0], []).append({
        "rps": n / (us / 1e6), "p50": int(kv["p50_us"]), "p99": int(kv["p99_us"]),
        "cpu_us": int(kv["ticks"]) / tck * 1e6 / max(n, 1)})
med = lambda c, k: statistics.median(r[k] for r in rows[c])  # noqa: E731
print("\n| configuration | requests/s (median) | p50 / p99 ms | proxy CPU µs/request (median) | per round |")
print("| --- | --- | --- | --- | --- |")
for c in rows:
    print("| %s | %.0f | %.2f / %.2f | %.1f | %s |" % (
        c, med(c, "rps"), med(c, "p50") / 1e3, med(c, "p99") / 1e3, med(c, "cpu_us"),
        ", ".join("%.1f" % r["cpu_us"] for r in rows[c])))
if "nginx" in rows:
    print("\n| CPU per request / nginx's (same round) | median | min–max | goal |")
    print("| --- | --- | --- | --- |")
    goals = {"floor": "(no proxy does less)", "plain": "≤ 0.8", "full": "≤ 1.0", "plain@base": "", "full@base": "",
             "full-sse": "≤ 1.0 (÷ nginx-sse)", "full-sse@base": "(÷ nginx-sse)"}
    for c in ("floor", "plain", "full", "plain@base", "full@base", "full-sse", "full-sse@base"):
        if c not in rows:
            continue
        ref = "nginx-sse" if "-sse" in c else "nginx"
        rs = [x["cpu_us"] / y["cpu_us"] for x, y in zip(rows[c], rows[ref])]
        print("| %s | %.2f | %.2f–%.2f | %s |" % (c, statistics.median(rs), min(rs), max(rs),
                                                goals[c]))
if "floor" in rows and "nginx" in rows:
    # What a goal as a ratio to nginx leaves above the floor: the CPU any
    # proxy's HTTP work (parse, route, rewrite, policy) may cost per request.
    def above(c):
        return [x["cpu_us"] - f["cpu_us"] for x, f in zip(rows[c], rows["floor"])]
    def span(v):
        return "%.2f (%.2f–%.2f)" % (statistics.median(v), min(v), max(v))
    print("\n| above the floor, µs per request (same round) | median (min–max) |")
    print("| --- | --- |")
    for c in ("nginx", "plain", "full"):
        if c in rows:
            print("| %s | %s |" % (c, span(above(c))))
    room = [0.8 * n["cpu_us"] - f["cpu_us"] for n, f in zip(rows["nginx"], rows["floor"])]
    print("| what plain's goal (≤ 0.8 × nginx) leaves above the floor | %s |" % span(room))
sizes = sorted(int(c[4:]) for c in rows if c.startswith("size") and "@" not in c)
if len(sizes) >= 2 and sizes[0] == 1:
    # µs per KiB beyond the first, for each proxy: (cpu(k) - cpu(1)) / (k - 1)
    def per_kib(prefix, k):
        if prefix + "1" not in rows or prefix + str(k) not in rows:
            return None
        return (med(prefix + str(k), "cpu_us") - med(prefix + "1", "cpu_us")) / (k - 1)
    fmt = lambda v: "" if v is None else "%.2f" % v  # noqa: E731
    print("\n| body | this build CPU µs/req | this build µs/KiB | base CPU µs/req | base µs/KiB"
          " | nginx CPU µs/req | nginx µs/KiB | this build / nginx (µs/KiB) | goal |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for k in sizes:
        cpu = lambda p: fmt(med(p + str(k), "cpu_us")) if p + str(k) in rows else ""  # noqa
        base_cpu = ("%.1f" % med("size%d@base" % k, "cpu_us")) if "size%d@base" % k in rows else ""
        if k == 1:
            print("| 1 KiB | %s | | %s | | %s | | | |" % (cpu("size"), base_cpu, cpu("ngxsize")))
            continue
        ours, base, ngx = per_kib("size", k), None, per_kib("ngxsize", k)
        if "size1@base" in rows and "size%d@base" % k in rows:
            base = (med("size%d@base" % k, "cpu_us") - med("size1@base", "cpu_us")) / (k - 1)
        ratio = "" if not ngx or ours is None else "%.2f" % (ours / ngx)
        print("| %d KiB | %s | %s | %s | %s | %s | %s | %s | ≤ 1 µs/KiB |" % (
            k, cpu("size"), fmt(ours), base_cpu, fmt(base), cpu("ngxsize"), fmt(ngx), ratio))
    # The same figure round by round (each round's sizes against its own 1 KiB
    # run, so a busy round skews one figure, not the median), and this
    # build's over base's and over nginx's in the same round.
    def rounds(prefix, k, suffix=""):
        a, b = rows.get(prefix + "1" + suffix), rows.get(prefix + str(k) + suffix)
        if not a or not b:
            return None
        return [(y["cpu_us"] - x["cpu_us"]) / (k - 1) for x, y in zip(a, b)]
    def span(v):
        return "%.2f (%.2f–%.2f)" % (statistics.median(v), min(v), max(v)) if v else ""
    print("\n| body | µs/KiB by round: this build, median (min–max) | base | nginx"
          " | this ÷ base, same round | this ÷ nginx, same round |")
    print("| --- | --- | --- | --- | --- | --- |")
    for k in sizes[1:]:
        o, b, n = rounds("size", k), rounds("size", k, "@base"), rounds("ngxsize", k)
        rb = [x / y for x, y in zip(o, b) if y > 0] if o and b else None
        rn = [x / y for x, y in zip(o, n) if y > 0] if o and n else None
        print("| %d KiB | %s | %s | %s | %s | %s |" % (k, span(o), span(b), span(n), span(rb), span(rn)))
EOF
