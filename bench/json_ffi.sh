#!/bin/sh
# json_ffi.sh — what linking simdjson (C++) into a C program costs besides
# the parse: bench/json_ffi.c built as plain C (libc only, no parse), with
# yajl's tree (what a C program links today) and with simdjson through the
# extern "C" shim bench/json_ffi_shim.cc. Per build: the stripped binary's
# size, the shared objects it maps and their sizes on disk, start-up
# instructions (callgrind, whole process with 0 parses: the loader, static
# constructors, simdjson's kernel pick), the first parse (1 − 0: parser
# buffers allocated) and one steady parse ((2,001 − 1) / 2,000), minor
# page faults and peak RSS (GNU time). Counts, not clock: load-immune.
# Usage: bench/json_ffi.sh (needs libsimdjson-dev, libyajl-dev)
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
B=$BUILD/bench
mkdir -p "$B"
[ -f /usr/include/simdjson.h ] || {
    echo "simdjson: libsimdjson-dev not installed"
    exit 0
}
cc -O2 -std=c11 -DNO_PARSE -o "$B/ffi_c" bench/json_ffi.c
# shellcheck disable=SC2046
cc -O2 -std=c11 $(pkg-config --cflags yajl) -o "$B/ffi_yajl" bench/json_ffi.c $(pkg-config --libs yajl)
cc -O2 -std=c11 -DUSE_SIMDJSON -c -o "$B/ffi_sj.o" bench/json_ffi.c
g++ -O2 -std=c++17 -c -o "$B/ffi_shim.o" bench/json_ffi_shim.cc
# linked by cc, as sluice's Makefile would: libstdc++ named explicitly
cc -o "$B/ffi_sj" "$B/ffi_sj.o" "$B/ffi_shim.o" -lsimdjson -lstdc++
for b in ffi_c ffi_yajl ffi_sj; do strip -o "$B/$b.stripped" "$B/$b"; done

ir() {
    out=$(mktemp)
    valgrind --tool=callgrind --callgrind-out-file="$out" "$@" >/dev/null 2>&1
    awk '/^summary:/ {print $2}' "$out"
    rm -f "$out"
}
libs() {
    ldd "$1" | awk '$3 ~ /^\// {print $3}' | while read -r l; do
        printf '%s %s\n' "$(basename "$l")" "$(stat -L -c %s "$l")"
    done
}
echo "| build | binary (stripped) | shared objects (bytes on disk) | start-up instr | first parse | steady parse | minor faults | peak RSS KiB |"
echo "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |"
for b in ffi_c ffi_yajl ffi_sj; do
    bin=$B/$b
    size=$(stat -c %s "$bin.stripped")
    so=$(libs "$bin" | awk '{printf "%s%s %d", sep, $1, $2; sep=", "}')
    s0=$(ir "$bin" 0)
    if [ "$b" = ffi_c ]; then
        first="" steady=""
    else
        s1=$(ir "$bin" 1)
        s2=$(ir "$bin" 2001)
        first=$((s1 - s0))
        steady=$(((s2 - s1) / 2000))
    fi
    tv=$(mktemp)
    /usr/bin/time -f '%R %M' -o "$tv" "$bin" 0 >/dev/null
    read -r faults rss <"$tv"
    rm -f "$tv"
    echo "| $b | $size | $so | $s0 | $first | $steady | $faults | $rss |"
done
echo
echo "kernel picked here: $("$B/json_parse_simdjson" info 2>/dev/null | head -1 || echo '(run json_parse.sh first)')"
