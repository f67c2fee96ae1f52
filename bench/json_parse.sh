#!/bin/sh
# json_parse.sh — instructions per parse of issue #16's 207-byte request
# body in yajl (as body_scan.c drives it), jansson and, when installed,
# jsmn (libjsmn-dev, bench/json_parse.c) and RapidJSON's SAX reader
# (rapidjson-dev, C++, bench/json_parse_rapidjson.cc). Counted by callgrind as the
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
rj=""
if [ -f /usr/include/rapidjson/reader.h ]; then
    g++ -O2 -DRAPIDJSON_SSE42 -msse4.2 -o "$BUILD/bench/json_parse_rapidjson" bench/json_parse_rapidjson.cc
    rj="rapidjson-utf8 rapidjson"
fi
ir() {
    out=$(mktemp)
    case $1 in
    rapidjson-utf8) set -- "$BUILD/bench/json_parse_rapidjson" utf8 "$2" ;;
    rapidjson) set -- "$BUILD/bench/json_parse_rapidjson" plain "$2" ;;
    *) set -- "$BUILD/bench/json_parse" "$1" "$2" ;;
    esac
    valgrind --tool=callgrind --callgrind-out-file="$out" "$@" >/dev/null 2>&1
    awk '/^summary:/ {print $2}' "$out"
    rm -f "$out"
}
echo "| reader | instructions per parse |"
echo "| --- | ---: |"
for m in $modes $rj; do
    a=$(ir "$m" 1000)
    b=$(ir "$m" 2000)
    echo "| $m | $(((b - a) / 1000)) |"
done
[ -n "$jsmn" ] || echo "jsmn: libjsmn-dev not installed, skipped"
[ -n "$rj" ] || echo "rapidjson: rapidjson-dev not installed, skipped"
