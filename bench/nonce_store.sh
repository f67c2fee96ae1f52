#!/usr/bin/env bash
# bench/nonce_store.sh — what one insert into the in-process nonce store
# costs with 10 Ki, 1 Mi and 4 Mi nonces held (build/tools/nonce_bench: a
# steady stream of fresh nonces kept for a 300 s window, as bench/policy.sh
# signs them), per binary:
#   - CPU ns per insert (this thread's CPU time; a shared machine makes it
#     noisy: read it as a ratio within one run),
#   - instructions, D1 misses and LL misses per insert, from callgrind with
#     its cache simulator (LL as the core's own 512 KiB L2, as
#     cachegrind_req.sh), counting only the measured inserts (nonce_bench
#     toggles collection around them): load-immune.
#
#   NB_BIN (default build/tools/nonce_bench), NB_BASE_BIN (optional: the
#   same tool built against another tree, e.g. the branch point; rows
#   first), NB_LIVE (default "10000 1000000 4000000"), NB_INSERTS (measured
#   inserts, default 1000000 natively, NB_CG_INSERTS under callgrind,
#   default 200000), NB_CG=0 skips callgrind.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
NB_BIN=${NB_BIN:-$ROOT/build/tools/nonce_bench}
LIVE=${NB_LIVE:-"10000 1000000 4000000"}
INSERTS=${NB_INSERTS:-1000000}
CG_INSERTS=${NB_CG_INSERTS:-200000}
WORK=$(mktemp -d /tmp/sluice-noncebench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

BINS=()
[ -z "${NB_BASE_BIN:-}" ] || BINS+=("base=$NB_BASE_BIN")
BINS+=("this=$NB_BIN")

echo "nonce store insert: $(date -u '+%Y-%m-%d %H:%M UTC'), commit" \
    "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'), window 300 s," \
    "$INSERTS inserts natively, $CG_INSERTS under callgrind --cache-sim=yes --LL=524288,8,64"
echo
echo "| binary | nonces held | CPU ns / insert | Ir / insert | D1 misses / insert | LL misses / insert |"
echo "| --- | ---: | ---: | ---: | ---: | ---: |"
for l in $LIVE; do
    for b in "${BINS[@]}"; do
        name=${b%%=*} bin=${b#*=}
        ns=$("$bin" "$l" "$INSERTS" | sed -n 's/.*cpu_ns_per_insert=\([0-9.]*\).*/\1/p')
        cg="- | - | -"
        if [ "${NB_CG:-1}" = 1 ]; then
            out=$WORK/cg.$name.$l
            valgrind --tool=callgrind --collect-atstart=no --cache-sim=yes --LL=524288,8,64 \
                --callgrind-out-file="$out" "$bin" "$l" "$CG_INSERTS" >/dev/null 2>"$out.log"
            cg=$(awk -v n="$CG_INSERTS" '
                /^events:/ { for (i = 2; i <= NF; i++) col[$i] = i }
                /^totals:/ {
                    printf "%.0f | %.2f | %.2f", $col["Ir"] / n,
                        ($col["D1mr"] + $col["D1mw"]) / n,
                        ($col["DLmr"] + $col["DLmw"]) / n
                }' "$out")
        fi
        echo "| $name | $l | $ns | $cg |"
    done
done
