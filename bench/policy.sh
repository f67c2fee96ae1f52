#!/usr/bin/env bash
# bench/policy.sh — what tokens, signatures and the Redis rate limiter cost
# in requests/s through sluice (issues 3 and 4), every configuration
# measured in the same run, in interleaved rounds so that machine noise hits
# all of them alike.
#
# Configurations (one sluice each, all started at once, same upstream):
#   open       no auth, no limits                          (the baseline)
#   auth       tokens + signatures, in-process nonce store   target >= 0.9 x open
#   rl_redis   no auth; the Redis limiter (per address, limit never reached)
#                                                          target >= 0.7 x open
#   rl_local   rl_redis's limit in the in-process store (no Redis)
#                                  issue 16: rl_redis >= 0.9 x rl_local
#   rl_redis_base, full_base, full_local_base, full_sig_base  the same
#              configurations run by another binary,
#              BENCH_BASE_BIN (say, a build of main): before / after in the
#              same interleaved run
#   auth_redis tokens + signatures, nonces and revocations in Redis
#   full       auth_redis + the Redis limiter per user (every per-user limit
#              set, never reached: requests, in-flight, tokens/min, tokens/day)
#   full_local tokens (no signatures: wrk sends none) + the in-process limiter
#              per user, every limit set as in full       (issue 16's "full")
#   full_sig   full_local + HMAC signatures + nonces in the in-process store
#                                                     target >= 0.95 x full_local
# Every request of every configuration is built by the same wrk script
# (bench/signed.lua: a token from a pool of 64 users minted with
# `sluice token`, and a fresh signature computed through OpenSSL via
# LuaJIT's FFI), so the load generator costs the same everywhere; a sluice
# without auth ignores the headers.
#
# Layout (2 cores): sluice (workers: 1) alone on core 1; the upstream
# (nginx answering a fixed chat.completion), redis-server and wrk -t1 on
# core 0. Per run: requests/s, p50/p99, and sluice's CPU time per request
# (utime+stime from /proc), which is the steadier figure on a shared
# machine. A run with any error or non-2xx answer fails the bench.
#
# Knobs: BENCH_CONFIGS (a subset, in this order; full_local and full_sig run
# only when named: BENCH_CONFIGS="full_local full_sig"), BENCH_DURATION (s per run, default 5), BENCH_ROUNDS (default 3),
# BENCH_CONNS (default 32), BENCH_PORT_BASE (default 28600), SLUICE_BIN,
# BENCH_BASE_BIN (the binary of the *_base configurations),
# BENCH_PROXY_CPU / BENCH_LOAD_CPU, BENCH_KEEP=1 keeps the work directory,
# BENCH_PERF=DIR records `perf record -g` of sluice during each recorded run
# into DIR/perf.CONFIG.ROUND.data (the perf process runs on the load core;
# CPU figures of a profiled run include perf's sampling cost).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SLUICE_BIN=${SLUICE_BIN:-$ROOT/build/sluice}
NGINX_BIN=${NGINX_BIN:-$(command -v nginx || echo /usr/sbin/nginx)}
REDIS_BIN=${REDIS_BIN:-$(command -v redis-server || echo /usr/bin/redis-server)}
PROXY_CPU=${BENCH_PROXY_CPU:-1}
LOAD_CPU=${BENCH_LOAD_CPU:-0}
DURATION=${BENCH_DURATION:-5}
ROUNDS=${BENCH_ROUNDS:-3}
CONNS=${BENCH_CONNS:-32}
PORT_BASE=${BENCH_PORT_BASE:-28600}
CONFIGS=${BENCH_CONFIGS:-"open auth rl_local rl_redis auth_redis full"}

UP_PORT=$((PORT_BASE + 1))
REDIS_PORT=$((PORT_BASE + 2))

for c in wrk taskset python3 "$NGINX_BIN" "$REDIS_BIN" "$SLUICE_BIN"; do
    command -v "$c" >/dev/null || { echo "bench: $c not found" >&2; exit 1; }
done

WORK=$(mktemp -d /tmp/sluice-policy-bench.XXXXXX)
RES=$WORK/results.tsv
# A private copy: a rebuild of build/sluice during the run must not touch
# the processes being measured.
cp "$SLUICE_BIN" "$WORK/sluice"
SLUICE_LABEL=$SLUICE_BIN
SLUICE_BIN=$WORK/sluice
case " $CONFIGS " in *"_base "*)
    [ -x "${BENCH_BASE_BIN:-}" ] || { echo "bench: *_base configs need BENCH_BASE_BIN" >&2; exit 1; }
    cp "$BENCH_BASE_BIN" "$WORK/sluice-base"
    SLUICE_LABEL="$SLUICE_LABEL (base: $BENCH_BASE_BIN)"
    ;;
esac
bin_of() { # the binary that runs config $1
    case $1 in *_base) echo "$WORK/sluice-base" ;; *) echo "$SLUICE_BIN" ;; esac
}
. "$ROOT/bench/lib.sh"

port_of() {
    local i=0 c
    for c in $CONFIGS; do
        [ "$c" = "$1" ] && { echo $((PORT_BASE + 10 + i)); return; }
        i=$((i + 1))
    done
    echo $((PORT_BASE + 9)) # a conf only `sluice token` reads
}

ports_free "$UP_PORT" "$REDIS_PORT" $(for c in $CONFIGS; do port_of "$c"; done)

# ---- the upstream: nginx answering every POST with one fixed chat.completion
nginx_fixed_upstream "$UP_PORT" "$LOAD_CPU"

spawn taskset -c "$LOAD_CPU" "$REDIS_BIN" --port "$REDIS_PORT" --bind 127.0.0.1 --save "" \
    --appendonly no --dir "$WORK" --daemonize no --loglevel warning --logfile "$WORK/redis.log"
wait_port "$REDIS_PORT" "$LAST"

# ---- secrets, confs, tokens
export SLUICE_BENCH_ADMIN_KEY=bench-admin-key-0123456789

write_conf() { # $1 config
    local c=$1 f=$WORK/$1.yaml
    bench_sluice_conf "$(port_of "$c")" "$UP_PORT" >"$f"
    case $c in full_local | full_local_base)
        bench_auth_conf false >>"$f"
        ;;
    esac
    case $c in auth | auth_redis | full | full_base | full_sig | full_sig_base)
        bench_auth_conf true "  admin_key_env: SLUICE_BENCH_ADMIN_KEY" >>"$f"
        ;;
    esac
    case $c in rl_redis | rl_redis_base | auth_redis | full | full_base)
        # A deadline of 1 s, not the default 50 ms: on a shared 2-core box a
        # busy core 0 can hold Redis's answer past 50 ms, and a run with
        # store_unavailable answers would measure fast failures instead.
        printf 'redis: { url: "redis://127.0.0.1:%s/0", timeout: 1s }\n' "$REDIS_PORT" >>"$f"
        ;;
    esac
    case $c in
    rl_redis | rl_redis_base | rl_local)
        printf 'ratelimit:\n  per_ip: { requests_per_minute: 1000000 }\n' >>"$f"
        ;;
    full | full_base | full_local | full_sig | full_local_base | full_sig_base)
        cat >>"$f" <<EOF
ratelimit:
  per_user: { requests_per_minute: 1000000, concurrent: 10000, tokens_per_minute: 1000000000, tokens_per_day: 1000000000000 }
EOF
        ;;
    esac
    "$(bin_of "$c")" -t -c "$f" >/dev/null 2>&1 || { "$(bin_of "$c")" -t -c "$f"; exit 1; }
}

for c in $CONFIGS; do write_conf "$c"; done
case " $CONFIGS " in *" auth "*) ;; *) write_conf auth ;; esac # for `sluice token`

TOKENS=$WORK/tokens.txt
for i in $(seq 64); do
    "$SLUICE_BIN" token --sub "bench-user-$i" --ttl 1h -c "$WORK/auth.yaml" |
        awk '/^access_token:/ { t = $2 } /^signing_key:/ { k = $2 } END { print t, k }'
done >"$TOKENS"
[ "$(awk 'NF == 2' "$TOKENS" | wc -l)" = 64 ] || { echo "bench: sluice token failed" >&2; exit 1; }

declare -A SPID
for c in $CONFIGS; do
    spawn taskset -c "$PROXY_CPU" "$(bin_of "$c")" -c "$WORK/$c.yaml" 2>"$WORK/$c.err"
    SPID[$c]=$LAST
    wait_port "$(port_of "$c")" "$LAST"
done

run() { # $1 config, $2 round ("warm" = not recorded)
    local port pid t0 t1 out line
    port=$(port_of "$1")
    pid=${SPID[$1]}
    local rs0 rs1
    rs0=$(redis_stats)
    t0=$(cpu_ticks "$pid")
    local perf_pid=
    if [ -n "${BENCH_PERF:-}" ] && [ "$2" != warm ]; then
        # the profile of this config's recorded runs (appended per round)
        perf record -q -g -p "$pid" -o "$BENCH_PERF/perf.$1.$2.data" -- sleep "$DURATION" \
            >/dev/null 2>&1 &
        perf_pid=$!
    fi
    local sign=1
    case $1 in full_local | full_local_base) sign=0 ;; esac # tokens only: a signature sent is checked
    out=$(BENCH_TOKENS=$TOKENS BENCH_SIGN=$sign taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" \
        -d"$DURATION"s --latency -s "$ROOT/bench/signed.lua" "http://127.0.0.1:$port/v1/chat/completions")
    t1=$(cpu_ticks "$pid")
    [ -z "$perf_pid" ] || wait "$perf_pid" || true
    rs1=$(redis_stats)
    line=$(grep '^BENCH ' <<<"$out") || { echo "$out" >&2; exit 1; }
    if ! grep -q 'errors=0 non2xx=0' <<<"$line"; then
        echo "bench: $1 had errors or non-2xx answers: $line" >&2
        exit 1
    fi
    [ "$2" = warm ] && return 0
    local rsd
    rsd=$(echo "$rs0 $rs1" | awk '{ printf "revalsha=%d rusec=%d", $3 - $1, $4 - $2 }')
    echo "$1 $2 $line ticks=$((t1 - t0)) $rsd" >>"$RES"
    echo "  round $2 $1: ${line#BENCH } cpu_ticks=$((t1 - t0)) $rsd"
}

# Redis's EVALSHA totals from INFO commandstats: calls, usec (a script's
# own commands are counted inside its usec, and again on their own lines:
# only the EVALSHA line is read). Only this bench talks to this Redis, so a
# delta over a run belongs to that run's sluice.
redis_stats() {
    redis-cli -p "$REDIS_PORT" INFO commandstats | tr -d '\r' | awk -F'[:=,]' '
        $1 == "cmdstat_evalsha" { e = $3; u = $5 }
        END { printf "%d %d\n", e, u }'
}

echo "sluice policy bench: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores," \
    "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
echo "commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'), $SLUICE_LABEL," \
    "wrk -t1 -c$CONNS, ${DURATION}s runs, $ROUNDS rounds, load average $(cut -d' ' -f1-3 /proc/loadavg)"
for c in $CONFIGS; do run "$c" warm; done
for r in $(seq "$ROUNDS"); do
    for c in $CONFIGS; do run "$c" "$r"; done
done

python3 - "$RES" "$(getconf CLK_TCK)" <<'EOF'
import statistics, sys
rows, tck = {}, int(sys.argv[2])
for ln in open(sys.argv[1]):
    f = ln.split()
    kv = dict(x.split("=") for x in f[3:])
    n, us = int(kv["requests"]), int(kv["duration_us"])
    rows.setdefault(f[0], []).append({
        "rps": n / (us / 1e6), "p50": int(kv["p50_us"]), "p99": int(kv["p99_us"]),
        "cpu_us": int(kv["ticks"]) / tck * 1e6 / n,
        "revalsha": int(kv.get("revalsha", 0)) / n, "rusec": int(kv.get("rusec", 0)) / n})
med = lambda c, k: statistics.median(r[k] for r in rows[c])  # noqa: E731
print("\n| configuration | requests/s (median) | per round | p50 / p99 ms | sluice CPU µs/request | Redis: EVALSHA / script CPU µs, per request |")
print("| --- | --- | --- | --- | --- | --- |")
for c in rows:
    print("| %s | %.0f | %s | %.2f / %.2f | %.1f | %.3f / %.1f |" % (
        c, med(c, "rps"), ", ".join("%.0f" % r["rps"] for r in rows[c]),
        med(c, "p50") / 1e3, med(c, "p99") / 1e3, med(c, "cpu_us"),
        med(c, "revalsha"), med(c, "rusec")))
def ratio(a, b):
    # per round (same moment of the machine), then the median of those
    rs = [x["rps"] / y["rps"] for x, y in zip(rows[a], rows[b])]
    cs = [y["cpu_us"] / x["cpu_us"] for x, y in zip(rows[a], rows[b])]
    return statistics.median(rs), min(rs), max(rs), statistics.median(cs)
print("\n| ratio | requests/s (median of rounds, min–max) | by CPU per request | target |")
print("| --- | --- | --- | --- |")
for a, b, t in (("auth", "open", "≥ 0.9"), ("rl_redis", "open", "≥ 0.7"),
                ("rl_redis", "rl_local", "≥ 0.9"), ("rl_local", "open", ""),
                ("rl_redis_base", "rl_local", ""), ("rl_redis", "rl_redis_base", ""),
                ("full", "full_base", ""), ("full_base", "auth_redis", ""),
                ("auth_redis", "open", ""), ("full", "auth_redis", ""),
                ("full_sig", "full_local", "≥ 0.95"),
                ("full_sig_base", "full_local_base", "")):
    if a not in rows or b not in rows:
        continue
    m, lo, hi, c = ratio(a, b)
    print("| %s / %s | %.2f (%.2f–%.2f) | %.2f | %s |" % (a, b, m, lo, hi, c, t))
EOF
