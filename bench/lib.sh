# bench/lib.sh — what the bench scripts share: background processes that are
# cleaned up on exit, waiting for a port, and CPU time from /proc. Sourced
# (bash) after WORK (the scratch directory) is set.

PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    if [ "${BENCH_KEEP:-0}" = 1 ]; then echo "bench: kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Starts a background process, remembered for cleanup; its pid in $LAST.
spawn() {
    "$@" &
    LAST=$!
    PIDS+=("$LAST")
}

# Stops one process started with spawn and forgets it.
stop() {
    local p=$1 keep=() q
    kill "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
    for q in "${PIDS[@]}"; do [ "$q" = "$p" ] || keep+=("$q"); done
    PIDS=("${keep[@]}")
}

# Waits (bounded) until something accepts on 127.0.0.1:$1 and $2 is alive.
wait_port() {
    local _
    for _ in $(seq 200); do
        kill -0 "$2" 2>/dev/null || { echo "bench: process $2 died (port $1)" >&2; exit 1; }
        if (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null; then return 0; fi
        sleep 0.05
    done
    echo "bench: nothing listens on port $1" >&2
    exit 1
}

# utime+stime in clock ticks, summed over the given processes (all threads).
cpu_ticks() {
    local p t=0 v
    for p in "$@"; do
        v=$(awk '{ sub(/^.*\) /, ""); printf "%d\n", $12 + $13 }' "/proc/$p/stat")
        t=$((t + v))
    done
    echo "$t"
}
