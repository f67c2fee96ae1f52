#!/usr/bin/env bash
# run-demo.sh BIN — what `make run` starts: the bundled demo upstream
# (tests/mock_upstream.py --demo, a model server that streams a friendly reply
# one word per SSE event, ~50 ms apart, on 127.0.0.1:8000) and sluice BIN with
# conf/sluice.yaml, which points model `chat-model` at it. It prints a curl
# command to paste, and stops the demo upstream when sluice exits (Ctrl-C
# stops both).
set -u

BIN=${1:?usage: scripts/run-demo.sh PATH-TO-SLUICE-BINARY}
cd "$(dirname "$0")/.." || exit 1
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3

UP_PORT=8000
LISTEN=http://127.0.0.1:8080
ADMIN=http://127.0.0.1:9090

mock_pid=""
sluice_pid=""
cleanup() {
    [ -n "$sluice_pid" ] && kill -TERM "$sluice_pid" 2>/dev/null
    [ -n "$mock_pid" ] && kill -TERM "$mock_pid" 2>/dev/null
    wait 2>/dev/null
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Polls url until it answers 2xx, while pid lives; up to $3 tenths of a second.
wait_http() {
    local url=$1 pid=$2 tries=$3
    while [ "$tries" -gt 0 ]; do
        kill -0 "$pid" 2>/dev/null || return 1
        curl -sf -o /dev/null --max-time 1 "$url" && return 0
        sleep 0.1
        tries=$((tries - 1))
    done
    return 1
}

# The mock prints {"listening": PORT} once it accepts; wait for that line
# from this very process (another server on the port must not fool us).
mock_out=$(mktemp)
"$PY" tests/mock_upstream.py --demo --host 127.0.0.1 --port "$UP_PORT" --name demo \
    --models demo-model >"$mock_out" &
mock_pid=$!
tries=50
until grep -q '"listening"' "$mock_out" 2>/dev/null; do
    tries=$((tries - 1))
    if [ "$tries" -le 0 ] || ! kill -0 "$mock_pid" 2>/dev/null; then
        rm -f "$mock_out"
        echo "run-demo: the demo upstream did not start on 127.0.0.1:$UP_PORT (port in use?)" >&2
        exit 1
    fi
    sleep 0.1
done
rm -f "$mock_out"

"$BIN" -c conf/sluice.yaml &
sluice_pid=$!
if ! wait_http "$ADMIN/healthz" "$sluice_pid" 100; then
    wait "$sluice_pid" 2>/dev/null
    rc=$?
    sluice_pid=""
    echo "run-demo: sluice did not become ready (exit code $rc)" >&2
    exit 1
fi

cat <<EOF

  sluice is running on $LISTEN (metrics: $ADMIN/metrics), in front of a demo
  upstream on 127.0.0.1:$UP_PORT. Ctrl-C stops both. Try:

  curl -N $LISTEN/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"model": "chat-model", "stream": true, "messages": [{"role": "user", "content": "Hello, sluice!"}]}'

EOF

wait "$sluice_pid"
rc=$?
sluice_pid=""
exit "$rc"
