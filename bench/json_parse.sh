#!/bin/sh
# json_parse.sh — instructions per parse of four inputs in yajl (as
# body_scan.c drives it, and as llm_metrics.c reads the usage object),
# jansson and, when installed, jsmn (libjsmn-dev, bench/json_parse.c),
# RapidJSON's SAX reader (rapidjson-dev, C++, bench/json_parse_rapidjson.cc)
# and simdjson (libsimdjson-dev, C++, bench/json_parse_simdjson.cc). The
# inputs: issue #16's request body (198 bytes), the same with escapes
# (body16esc: \n, \", \u00e9), an answer's usage object and a
# 16 KiB chat body (a long conversation, generated here, deterministic).
# Counted by callgrind as the difference of a 2,000- and a 1,000-parse run,
# so start-up cancels out: immune to the machine's load.
# With build/libsluice.a (make), sluice's own gw_body_scan is a row too (scan:
# parsed every time; shape: the same body through the thread's kept shape), and
# with build/tools/llm_shape_bench llm_metrics.c's usage read (yajl-usage).
# Usage: bench/json_parse.sh (after make deps; make for the sluice row)
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
B=$BUILD/bench
mkdir -p "$B"

# ---- inputs ----
printf '%s' '{"model":"chat-model","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Write one sentence about the sea, please, in plain English."}],"max_tokens":64}' >"$B/body16.json"
# the same with escapes (bench/lib.sh's realistic_esc_body): a two-line
# system prompt, \n, \" and \u00e9 in the user message
printf '%s' '{"model":"chat-model","messages":[{"role":"system","content":"You are a helpful assistant.\nAnswer in plain English."},{"role":"user","content":"Write one sentence about the sea, please.\nUse the word \"tide\" and the caf\u00e9 by the harbour."}],"max_tokens":64}' >"$B/body16esc.json"
printf '%s' '{"prompt_tokens":25,"completion_tokens":12,"total_tokens":37}' >"$B/usage.json"
# Alternating user/assistant turns built from six sentences (escaped quotes
# and \n among them), up to 16,384 bytes.
awk 'BEGIN {
    s[0] = "Write one sentence about the sea, please, in plain English."
    s[1] = "The tide came in slowly over the flat grey sand."
    s[2] = "Can you make it shorter and keep the word \\\"harbour\\\" in it?"
    s[3] = "Sure: the harbour lights flickered as the fog rolled in from the bay."
    s[4] = "Now list three facts about lighthouses, one per line."
    s[5] = "1. The first ones burned wood.\\n2. Fresnel lenses bend the light.\\n3. Many are automated now."
    head = "{\"model\":\"chat-model\",\"messages\":[{\"role\":\"system\",\"content\":\"You are a helpful assistant.\"}"
    tail = "],\"max_tokens\":256,\"stream\":false}"
    out = head
    for (i = 0; ; i++) {
        c = ""
        k = 1 + (i * 7) % 5
        for (j = 0; j < k; j++)
            c = c (j ? " " : "") s[(i + j) % 6]
        m = ",{\"role\":\"" (i % 2 ? "assistant" : "user") "\",\"content\":\"" c "\"}"
        if (length(out) + length(m) + length(tail) > 16384)
            break
        out = out m
    }
    printf "%s%s", out, tail
}' >"$B/chat16k.json"

# ---- readers ----
modes=""
if [ -f "$BUILD/libsluice.a" ]; then
    # sluice's own scan, all of it (bench/json_scan_sluice.c)
    # shellcheck disable=SC2046
    cc -O2 -std=c11 -D_GNU_SOURCE -pthread -I. -o "$B/json_scan_sluice" bench/json_scan_sluice.c \
        "$BUILD/libsluice.a" $(pkg-config --libs jansson yajl libpcre2-8) -lm
    modes="sluice-scan sluice-shape"
fi
modes="$modes yajl"
# llm_metrics.c's read of the usage object, no kept shape (make builds it)
[ -x "$BUILD/tools/llm_shape_bench" ] && modes="$modes yajl-usage"
modes="$modes jansson"
jsmn=""
if [ -f /usr/include/jsmn.h ]; then
    jsmn=-DHAVE_JSMN
    modes="$modes jsmn"
fi
# shellcheck disable=SC2046
cc -O2 -std=c11 -I. $jsmn $(pkg-config --cflags jansson yajl) -o "$B/json_parse" \
    bench/json_parse.c $(pkg-config --libs jansson yajl)
if [ -f /usr/include/rapidjson/reader.h ]; then
    g++ -O2 -DRAPIDJSON_SSE42 -msse4.2 -o "$B/json_parse_rapidjson" bench/json_parse_rapidjson.cc
    modes="$modes rapidjson-utf8 rapidjson"
fi
sj=""
if [ -f /usr/include/simdjson.h ]; then
    # The portable build (On-Demand's stage 2 compiled for any x86-64: the
    # fallback kernel), and one for AVX2 machines only (-march=haswell).
    g++ -O2 -std=c++17 -o "$B/json_parse_simdjson" bench/json_parse_simdjson.cc -lsimdjson
    g++ -O2 -std=c++17 -march=haswell -o "$B/json_parse_simdjson_hsw" bench/json_parse_simdjson.cc \
        -lsimdjson
    sj=1
    modes="$modes sj-dom sj-dom-fallback sj-od sj-od-skip sj-od-hsw sj-od-skip-hsw"
fi

# ir MODE FILE N: instructions of N parses of FILE (empty: the mode does
# not apply to that input).
ir() {
    usage=""
    case $2 in *usage.json) usage=usage ;; esac
    force=""
    case $1 in
    yajl-usage) [ -n "$usage" ] || return 0 ;;
    sluice-scan | sluice-shape) [ -z "$usage" ] || return 0 ;;
    esac
    case $1 in
    sluice-scan) set -- "$B/json_scan_sluice" "$2" "$3" parse ;;
    sluice-shape) set -- "$B/json_scan_sluice" "$2" "$3" ;;
    yajl-usage) set -- "$BUILD/tools/llm_shape_bench" "$3" yajl "$2" ;;
    yajl | jansson | jsmn) set -- "$B/json_parse" "$1" "$3" "$2" ;;
    rapidjson-utf8) set -- "$B/json_parse_rapidjson" utf8 "$3" "$2" ;;
    rapidjson) set -- "$B/json_parse_rapidjson" plain "$3" "$2" ;;
    sj-dom) set -- "$B/json_parse_simdjson" dom "$2" "$3" $usage ;;
    sj-dom-fallback)
        force=fallback
        set -- "$B/json_parse_simdjson" dom "$2" "$3" $usage
        ;;
    sj-od) set -- "$B/json_parse_simdjson" od "$2" "$3" $usage ;;
    sj-od-skip) set -- "$B/json_parse_simdjson" od-skip "$2" "$3" $usage ;;
    sj-od-hsw) set -- "$B/json_parse_simdjson_hsw" od "$2" "$3" $usage ;;
    sj-od-skip-hsw) set -- "$B/json_parse_simdjson_hsw" od-skip "$2" "$3" $usage ;;
    esac
    out=$(mktemp)
    if [ -n "$force" ]; then
        SIMDJSON_FORCE_IMPLEMENTATION=$force valgrind --tool=callgrind --callgrind-out-file="$out" \
            "$@" >/dev/null 2>&1
    else
        valgrind --tool=callgrind --callgrind-out-file="$out" "$@" >/dev/null 2>&1
    fi
    awk '/^summary:/ {print $2}' "$out"
    rm -f "$out"
}
per() {
    a=$(ir "$1" "$2" 1000)
    [ -n "$a" ] || {
        printf ' |'
        return 0
    }
    b=$(ir "$1" "$2" 2000)
    printf ' %s |' $(((b - a) / 1000))
}
inputs="$B/body16.json $B/body16esc.json $B/usage.json $B/chat16k.json"
printf '| reader |'
for f in $inputs; do printf ' %s (%s B) |' "$(basename "$f" .json)" "$(wc -c <"$f")"; done
printf '\n| --- | ---: | ---: | ---: | ---: |\n'
for m in $modes; do
    printf '| %s |' "$m"
    for f in $inputs; do per "$m" "$f"; done
    printf '\n'
done
[ -n "$jsmn" ] || echo "jsmn: libjsmn-dev not installed, skipped"
[ -f /usr/include/rapidjson/reader.h ] || echo "rapidjson: rapidjson-dev not installed, skipped"
if [ -n "$sj" ]; then
    echo
    echo "simdjson kernels, native:"
    "$B/json_parse_simdjson" info
    echo "under valgrind (the counts above):"
    valgrind -q "$B/json_parse_simdjson" info
    echo
    echo "What each simdjson mode refuses:"
    "$B/json_parse_simdjson" check
    if [ -x "$B/json_scan_sluice" ]; then
        echo
        "$B/json_scan_sluice" check
    fi
else
    echo "simdjson: libsimdjson-dev not installed, skipped"
fi
