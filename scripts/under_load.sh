#!/bin/sh
# under_load.sh — runs integration tests N times while busy loops load the
# cores, and counts the runs that failed: a test that only passes on an idle
# machine is a flaky test (or a sluice timer that is too tight).
#
#   scripts/under_load.sh [-n RUNS] [-l LOOPS] [-o DIR] PYTEST_ARGS...
#   scripts/under_load.sh -n 30 -l 4 tests/integration/test_chaos_queue.py -k drill_redis
#
# RUNS (default 30) runs of `pytest PYTEST_ARGS`, each with its own
# --basetemp DIR/run-K (kept for failed runs, removed for passed ones, so
# the failing logs stay to be read); LOOPS (default 4) `while :; do :; done`
# shell loops at nice 0 for the whole time, killed by their pids on exit
# (also on ^C). SLUICE_BIN defaults to build/sluice. Prints one line per run
# and "failed F of RUNS" with the load average at the start and the end.
set -eu

runs=30
loops=4
out=/tmp/sluice-under-load
while getopts n:l:o: opt; do
    case $opt in
    n) runs=$OPTARG ;;
    l) loops=$OPTARG ;;
    o) out=$OPTARG ;;
    *) echo "usage: $0 [-n RUNS] [-l LOOPS] [-o DIR] PYTEST_ARGS..." >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ $# -gt 0 ] || { echo "$0: name the tests (pytest arguments)" >&2; exit 2; }

root=$(cd "$(dirname "$0")/.." && pwd)
: "${SLUICE_BIN:=$root/build/sluice}"
: "${PYTHON:=/usr/bin/python3}"
export SLUICE_BIN

pids=""
stop_loops() {
    for p in $pids; do kill "$p" 2>/dev/null || true; done
    pids=""
}
trap stop_loops EXIT
trap 'stop_loops; exit 130' INT TERM

mkdir -p "$out"
i=0
while [ "$i" -lt "$loops" ]; do
    nice -n 0 sh -c 'while :; do :; done' &
    pids="$pids $!"
    i=$((i + 1))
done
echo "busy loops:$pids; load at start: $(cut -d' ' -f1-3 /proc/loadavg)"

failed=0
k=1
while [ "$k" -le "$runs" ]; do
    dir=$out/run-$k
    rm -rf "$dir"
    if "$PYTHON" -m pytest -q -p no:cacheprovider --basetemp="$dir" "$@" >"$out/run-$k.log" 2>&1; then
        echo "run $k: passed"
        rm -rf "$dir" "$out/run-$k.log"
    else
        failed=$((failed + 1))
        echo "run $k: FAILED (log $out/run-$k.log, files $dir)"
    fi
    k=$((k + 1))
done
echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
stop_loops
echo "failed $failed of $runs"
