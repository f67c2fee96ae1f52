#!/usr/bin/env bash
# bench/pgo_train.sh — the training load of a profile-guided build (issue
# #16's layout ceiling; `make PGO=gen`, then this, then `make PGO=use`, see
# docs/gateway.md, "Build flags"). Runs SLUICE_BIN (an -fprofile-generate
# build) on realistic.sh's confs in turn: "plain", "full" (HS256 token,
# ratelimit.per_user, the 1,001-word list and the regex, output filtering)
# and "full-sse" (full, "stream":true against build/tools/bench_upstream's 8
# events), PGO_SECONDS of wrk -t1 -c32 each, and stops it with SIGTERM so its
# exit writes the .gcda files beside the objects.
#
#   SLUICE_BIN (default build/sluice), PGO_SECONDS (default 5),
#   PGO_CONFS (default "plain full full-sse"), BENCH_PORT_BASE (default 29700).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SLUICE_BIN=${SLUICE_BIN:-$ROOT/build/sluice}
NGINX_BIN=${NGINX_BIN:-$(command -v nginx || echo /usr/sbin/nginx)}
SECONDS_EACH=${PGO_SECONDS:-5}
CONFS=${PGO_CONFS:-"plain full full-sse"}
PORT_BASE=${BENCH_PORT_BASE:-29700}
UP_PORT=$((PORT_BASE + 1))
SSE_UP_PORT=$((PORT_BASE + 3))
PORT=$((PORT_BASE + 10))
ADMIN=$((PORT_BASE + 20))
# the ordinary build's upstream tool: one of the instrumented build would
# write its own profile into the library objects' .gcda files
SSE_UP_BIN=${SSE_UP_BIN:-$ROOT/build/tools/bench_upstream}

for c in wrk curl "$NGINX_BIN" "$SLUICE_BIN" "$SSE_UP_BIN"; do
    command -v "$c" >/dev/null || { echo "pgo_train: $c not found" >&2; exit 1; }
done

WORK=$(mktemp -d /tmp/sluice-pgo.XXXXXX)
. "$ROOT/bench/lib.sh"
ports_free "$UP_PORT" "$SSE_UP_PORT" "$PORT" "$ADMIN"

realistic_trio "$PORT" "$ADMIN" "$CONFS"

for c in $CONFS; do
    realistic_req "$c"
    spawn "$SLUICE_BIN" -c "$WORK/$c.yaml"
    pid=$LAST
    wait_admin_slow "$ADMIN" "$pid"
    BENCH_TOKEN=$REQ_TOKEN BENCH_BODY_FILE=$REQ_BODY wrk -t1 -c32 -d"$SECONDS_EACH"s \
        -s "$ROOT/bench/realistic.lua" "http://127.0.0.1:$PORT/v1/chat/completions" >"$WORK/$c.wrk"
    grep -q 'errors=0 non2xx=0' "$WORK/$c.wrk" || { cat "$WORK/$c.wrk" >&2; exit 1; }
    echo "pgo_train: $c: $(sed -n 's/^BENCH requests=\([0-9]*\).*/\1/p' "$WORK/$c.wrk") requests"
    stop "$pid"
done
