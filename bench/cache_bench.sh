#!/bin/sh
# cache_bench.sh — the response cache's figures on one core: semantic
# lookup p50/p99 at 100k entries (plain C int8 kernels) and the exact-hit
# path's CPU per request; then, when Debian's libfaiss-dev is installed, the
# same lookup through faiss (bench/cache_faiss.cc) for comparison.
# Usage: bench/cache_bench.sh [ENTRIES] [QUERIES]   (after `make`)
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
N=${1:-100000}
Q=${2:-400}
make -s -j2 "$BUILD/libsluice.a"
mkdir -p "$BUILD/bench"
# shellcheck disable=SC2046
cc -O2 -g -std=c11 -D_GNU_SOURCE -pthread -I. $(pkg-config --cflags jansson) \
    -o "$BUILD/bench/cache_bench" bench/cache_bench.c "$BUILD/libsluice.a" \
    $(pkg-config --libs libevent libevent_pthreads libevent_openssl openssl jansson libpcre2-8 hiredis yaml-0.1) \
    -lhttp_parser -lm
# One core: pinned, so the figure is a single core's.
taskset -c 0 "$BUILD/bench/cache_bench" "$N" "$Q"
if [ -f /usr/include/faiss/IndexFlat.h ]; then
    g++ -O2 -std=c++17 -fopenmp -o "$BUILD/bench/cache_faiss" bench/cache_faiss.cc \
        -lfaiss -lblas -llapack -fopenmp
    # faiss's scans take tens of ms a query here: fewer queries.
    OMP_NUM_THREADS=1 taskset -c 0 "$BUILD/bench/cache_faiss" "$N" 100
    # HNSW (graph) only builds in reasonable time at a smaller size.
    OMP_NUM_THREADS=1 taskset -c 0 "$BUILD/bench/cache_faiss" 10000 100 | grep hnsw
else
    echo "faiss: libfaiss-dev not installed (apt-get install libfaiss-dev), skipped"
fi
