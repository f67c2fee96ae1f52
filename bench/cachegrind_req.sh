#!/usr/bin/env bash
# bench/cachegrind_req.sh — instructions and cache misses per request of
# issue #16's JSON request (realistic.sh's confs), per check: "plain" (no
# checks), "full" (HS256 token, ratelimit.per_user, the 1,001-word list and
# the phone regex, output filtering), "full-1word" (full with a 1-word list),
# "full-noregex" (full without the regex). Counted by valgrind's callgrind
# with its cache simulator (I1/D1 as the host's, LL as the core's own 512 KiB
# L2, as cachegrind_scale.sh): immune to the machine's load.
#
# As callgrind_req.sh, per binary and conf sluice runs twice (a short and a
# long wrk run) and the per-request figures are the differences divided by
# the difference of sluice_requests_total, so start-up (the automaton, PCRE2
# JIT) and shutdown cancel out. With CG_FUNCS=N the N functions whose
# per-request Ir differ most between "full" and "plain" (this binary) are
# listed, with their misses: where full − plain goes. "full-sig" is full with
# every request signed (nonces in the in-process store).
#
#   SLUICE_BIN (default build/sluice), SLUICE_BASE_BIN (optional: same
#   figures for that binary, same run), CG_CONFS (default "plain full
#   full-1word full-noregex"; full-sig is full with every request signed, as
#   in callgrind_req.sh), CG_DIFF (the two confs of the CG_FUNCS table,
#   default "plain full"; "full full-sig" splits the signed path),
#   CG_SHORT / CG_LONG (wrk s, default 3 / 10),
#   CG_CONNS (default 32), CG_FUNCS (default 0), CG_SIM (default
#   "--cache-sim=yes --LL=524288,8,64"; add --branch-sim=yes for the
#   mispredicted conditional and indirect branches per request, a table of
#   their own), CG_BINS (more binaries, "name=path ...", rows after this),
#   BENCH_PORT_BASE (default 29300), BENCH_KEEP=1 keeps the callgrind files.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SLUICE_BIN=${SLUICE_BIN:-$ROOT/build/sluice}
SLUICE_BASE_BIN=${SLUICE_BASE_BIN:-}
NGINX_BIN=${NGINX_BIN:-$(command -v nginx || echo /usr/sbin/nginx)}
CONFS=${CG_CONFS:-"plain full full-1word full-noregex"}
SHORT=${CG_SHORT:-3}
LONG=${CG_LONG:-10}
CONNS=${CG_CONNS:-32}
FUNCS=${CG_FUNCS:-0}
SIM=${CG_SIM---cache-sim=yes --LL=524288,8,64}
PORT_BASE=${BENCH_PORT_BASE:-29300}
UP_PORT=$((PORT_BASE + 1))
PORT=$((PORT_BASE + 10))
ADMIN=$((PORT_BASE + 20))

for c in wrk valgrind callgrind_annotate curl python3 "$NGINX_BIN" "$SLUICE_BIN"; do
    command -v "$c" >/dev/null || { echo "bench: $c not found" >&2; exit 1; }
done

WORK=$(mktemp -d /tmp/sluice-cgreq.XXXXXX)
cp "$SLUICE_BIN" "$WORK/sluice"
BINS="this"
if [ -n "$SLUICE_BASE_BIN" ]; then
    cp "$SLUICE_BASE_BIN" "$WORK/sluice-base"
    BINS="base this"
fi
for nb in ${CG_BINS:-}; do
    cp "${nb#*=}" "$WORK/sluice-${nb%%=*}"
    BINS="$BINS ${nb%%=*}"
done
. "$ROOT/bench/lib.sh"
ports_free "$UP_PORT" "$PORT" "$ADMIN"

realistic_upstream "$UP_PORT"

export SLUICE_BENCH_UPSTREAM_KEY=upstream-key
echo forbiddenword0000x >"$WORK/words1.txt"

realistic_conf plain "$PORT" "$ADMIN" plain
realistic_conf full "$PORT" "$ADMIN" full
sed "s|$WORK/words.txt|$WORK/words1.txt|" "$WORK/full.yaml" >"$WORK/full-1word.yaml"
sed '/^  regex:/,/name: phone/d' "$WORK/full.yaml" >"$WORK/full-noregex.yaml"
for c in full-1word full-noregex; do
    "$SLUICE_BIN" -t -c "$WORK/$c.yaml" >/dev/null 2>&1 || { "$SLUICE_BIN" -t -c "$WORK/$c.yaml"; exit 1; }
done
sed 's/signing: { required: false,/signing: { required: true,/' "$WORK/full.yaml" >"$WORK/full-sig.yaml"
grep -q 'required: true' "$WORK/full-sig.yaml" || { echo "bench: full-sig conf" >&2; exit 1; }
read -r TOKEN SIGNING_KEY <<<"$("$WORK/sluice" token --sub bench-user --ttl 1h -c "$WORK/full.yaml" |
    awk '/^access_token:/ { t = $2 } /^signing_key:/ { k = $2 } END { print t, k }')"
read -r DIFF_A DIFF_B <<<"${CG_DIFF:-plain full}"

# One run: $1 binary, $2 conf, $3 wrk seconds; prints "requests Ir I1mr D1mr
# D1mw ILmr DLmr DLmw Bcm Bim" (totals of the run; 0 for an event not
# simulated).
one() {
    local out=$WORK/cg.$1.$2.$3 tok="" key="" n bin=$WORK/sluice
    case $2 in full*) tok=$TOKEN ;; esac
    [ "$2" != full-sig ] || key=$SIGNING_KEY
    [ "$1" = this ] || bin=$WORK/sluice-$1
    # shellcheck disable=SC2086
    spawn valgrind --tool=callgrind $SIM --callgrind-out-file="$out" "$bin" -c "$WORK/$2.yaml" \
        2>"$out.log"
    local pid=$LAST
    wait_admin_slow "$ADMIN" "$pid"
    BENCH_TOKEN=$tok BENCH_SIGNING_KEY=$key wrk -t1 -c"$CONNS" -d"$3"s --timeout 30s -s "$ROOT/bench/realistic.lua" \
        "http://127.0.0.1:$PORT/v1/chat/completions" >"$out.wrk"
    grep -q 'errors=0 non2xx=0' "$out.wrk" || { cat "$out.wrk" >&2; exit 1; }
    n=$(curl -sf "http://127.0.0.1:$ADMIN/metrics" |
        awk '/^sluice_requests_total/ { s += $NF } END { printf "%d", s }')
    stop "$pid"
    awk -v n="$n" '
        /^events:/ { for (i = 2; i <= NF; i++) col[$i] = i - 1 }
        /^totals:/ {
            printf "%d", n
            split("Ir I1mr D1mr D1mw ILmr DLmr DLmw Bcm Bim", ev, " ")
            for (k = 1; k <= 9; k++) printf " %d", (ev[k] in col) ? $(col[ev[k]] + 1) : 0
            printf "\n"
        }' "$out"
}

echo "callgrind + cache sim per request: $(date -u '+%Y-%m-%d %H:%M UTC'), commit" \
    "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'), wrk -c$CONNS," \
    "${SHORT}s and ${LONG}s runs, $SIM"
echo
echo "| binary | conf | requests (short / long) | Ir | I1 misses | D1 read misses | D1 write misses | LL misses |"
echo "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"
for c in $CONFS; do
    for b in $BINS; do
        read -r n1 a1 b1 c1 d1 e1 f1 g1 h1 i1 <<<"$(one "$b" "$c" "$SHORT")"
        read -r n2 a2 b2 c2 d2 e2 f2 g2 h2 i2 <<<"$(one "$b" "$c" "$LONG")"
        # a failed run exits only its $(...): stop here, not with garbage rows
        [[ "$n1 $n2" =~ ^[0-9]+\ [0-9]+$ ]] || { echo "bench: $b $c failed" >&2; exit 1; }
        awk -v n=$((n2 - n1)) -v bc=$((h2 - h1)) -v bi=$((i2 - i1)) -v b="$b" -v c="$c" \
            'BEGIN { printf "| %s | %s | %.1f | %.1f |\n", b, c, bc / n, bi / n }' >>"$WORK/branches"
        awk -v n=$((n2 - n1)) -v ir=$((a2 - a1)) -v i1=$((b2 - b1)) -v dr=$((c2 - c1)) \
            -v dw=$((d2 - d1)) -v ll=$((e2 - e1 + f2 - f1 + g2 - g1)) -v b="$b" -v c="$c" \
            -v r="$n1 / $n2" 'BEGIN {
                printf "| %s | %s | %s | %d | %.1f | %.1f | %.1f | %.2f |\n", b, c, r,
                    ir / n, i1 / n, dr / n, dw / n, ll / n }'
        echo "$n1 $n2" >"$WORK/n.$b.$c"
    done
done
case $SIM in *--branch-sim=yes*)
    echo
    echo "Mispredicted branches per request (valgrind's simple predictor):"
    echo
    echo "| binary | conf | conditional | indirect |"
    echo "| --- | --- | ---: | ---: |"
    cat "$WORK/branches"
    ;;
esac

# Per function: (long - short) / requests, DIFF_B minus DIFF_A, this binary.
if [ "$FUNCS" -gt 0 ] && [ -f "$WORK/n.this.$DIFF_B" ] && [ -f "$WORK/n.this.$DIFF_A" ]; then
    for c in "$DIFF_A" "$DIFF_B"; do
        for s in "$SHORT" "$LONG"; do
            callgrind_annotate --inclusive=no --tree=none --auto=no --threshold=100 \
                --show=Ir,I1mr,D1mr,D1mw,ILmr,DLmr,DLmw "$WORK/cg.this.$c.$s" >"$WORK/ann.$c.$s"
        done
    done
    echo
    echo "$DIFF_B − $DIFF_A by function (this binary, per request; self cost):"
    echo
    python3 - "$WORK" "$SHORT" "$LONG" "$FUNCS" "$DIFF_A" "$DIFF_B" <<'EOF'
import re, sys
work, short, long_, top = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
conf_a, conf_b = sys.argv[5], sys.argv[6]
pct = re.compile(r'\(\s*[\d.]+%\)')
def load(path):
    out = {}
    for line in open(path):
        t = pct.sub(' ', line).split()
        if len(t) < 8 or not all(re.fullmatch(r'[\d,]+|\.', x) for x in t[:7]):
            continue
        name = ' '.join(t[7:])
        if name == 'PROGRAM TOTALS' or name.startswith('=>'):
            continue
        name = re.sub(r' \[.*\]$', '', name)
        name = name.split(':', 1)[1] if ':' in name else name
        v = out.setdefault(name, [0] * 7)
        for i in range(7):
            v[i] += 0 if t[i] == '.' else int(t[i].replace(',', ''))
    return out
def per_req(conf):
    n1, n2 = map(int, open(f'{work}/n.this.{conf}').read().split())
    a, b = load(f'{work}/ann.{conf}.{short}'), load(f'{work}/ann.{conf}.{long_}')
    return {k: [(b[k][i] - a.get(k, [0] * 7)[i]) / (n2 - n1) for i in range(7)] for k in b}
p, f = per_req(conf_a), per_req(conf_b)
keys = set(p) | set(f)
diff = {k: [f.get(k, [0] * 7)[i] - p.get(k, [0] * 7)[i] for i in range(7)] for k in keys}
print('| function | Ir | I1 misses | D1 read misses | D1 write misses | LL misses |')
print('| --- | ---: | ---: | ---: | ---: | ---: |')
tot = [sum(v[i] for v in diff.values()) for i in range(7)]
for k in sorted(keys, key=lambda k: -abs(diff[k][0]))[:top]:
    v = diff[k]
    print(f'| {k} | {v[0]:.0f} | {v[1]:.1f} | {v[2]:.1f} | {v[3]:.1f} | {v[4] + v[5] + v[6]:.2f} |')
print(f'| (all) | {tot[0]:.0f} | {tot[1]:.1f} | {tot[2]:.1f} | {tot[3]:.1f} | {tot[4] + tot[5] + tot[6]:.2f} |')
EOF
fi
