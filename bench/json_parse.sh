#!/bin/sh
# json_parse.sh — instructions per parse of issue #16's 207-byte request
# body in yajl (as body_scan.c drives it), jansson and, when libjsmn-dev is
# installed, jsmn (bench/json_parse.c). Counted by callgrind as the
# difference of a 2,000- and a 1,000-parse run, so start-up cancels out:
# immune to the machine's load. Usage: bench/json_parse.sh (after make deps)
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
mkdir -p "$BUILD/bench"
modes="yajl jansson"
jsmn=""
if [ -f /usr/include/jsmn.h ]; then
    jsmn=-DHAVE_JSMN
    modes="$modes jsmn"
fi
# shellcheck disable=SC2046
cc -O2 -std=c11 $jsmn $(pkg-config --cflags jansson yajl) -o "$BUILD/bench/json_parse" \
    bench/json_parse.c $(pkg-config --libs jansson yajl)
ir() {
    out=$(mktemp)
    valgrind --tool=callgrind --callgrind-out-file="$out" "$BUILD/bench/json_parse" "$1" "$2" \
        >/dev/null 2>&1
    awk '/^summary:/ {print $2}' "$out"
    rm -f "$out"
}
echo "| reader | instructions per parse |"
echo "| --- | ---: |"
for m in $modes; do
    a=$(ir "$m" 1000)
    b=$(ir "$m" 2000)
    echo "| $m | $(((b - a) / 1000)) |"
done
[ -n "$jsmn" ] || echo "jsmn: libjsmn-dev not installed, skipped"
