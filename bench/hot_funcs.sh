#!/usr/bin/env bash
# bench/hot_funcs.sh — the per-request functions of sluice's own code: what
# SL_HOT (common/sl.h) marks, re-derived from a profile rather than by guess.
#
# Runs SLUICE_BIN under callgrind (workers 1) on realistic.sh's confs:
# "plain", "full" (HS256 token, ratelimit.per_user, the 1,001-word list and
# the regex, output filtering) and "full-sse" (full, "stream":true against
# build/tools/bench_upstream's 8 events), HOT_SECONDS of wrk -t1 -c32 each.
# Per function of the sluice binary itself (not libevent, libc, OpenSSL: their
# layout is not ours) it counts the calls (summed over its call sites) and
# its self instructions, both per request (sluice_requests_total). A function
# called at least HOT_MIN_CALLS times per request in one conf is hot; start-up
# and conf code runs once per process and falls far below.
#
# Prints a table (function, calls and self Ir per request per conf, where it
# is defined) and, last, the hot names alone, one a line. LTO's suffixes
# (.lto_priv.0, .isra.0, .part.0, .constprop.0, .cold) and target_clones'
# .avx2 are folded into the source name. A function LTO inlined into all its
# callers is not listed: it has no code of its own to place.
#
#   SLUICE_BIN (default build/sluice), HOT_CONFS (default "plain full
#   full-sse"), HOT_SECONDS (default 4), HOT_MIN_CALLS (default 0.5),
#   BENCH_PORT_BASE (default 29800), BENCH_KEEP=1 keeps the callgrind files.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SLUICE_BIN=${SLUICE_BIN:-$ROOT/build/sluice}
NGINX_BIN=${NGINX_BIN:-$(command -v nginx || echo /usr/sbin/nginx)}
CONFS=${HOT_CONFS:-"plain full full-sse"}
SECS=${HOT_SECONDS:-4}
MIN_CALLS=${HOT_MIN_CALLS:-0.5}
PORT_BASE=${BENCH_PORT_BASE:-29800}
UP_PORT=$((PORT_BASE + 1))
SSE_UP_PORT=$((PORT_BASE + 3))
PORT=$((PORT_BASE + 10))
ADMIN=$((PORT_BASE + 20))
SSE_UP_BIN=${SSE_UP_BIN:-$ROOT/build/tools/bench_upstream}

for c in wrk valgrind curl python3 "$NGINX_BIN" "$SLUICE_BIN" "$SSE_UP_BIN"; do
    command -v "$c" >/dev/null || { echo "hot_funcs: $c not found" >&2; exit 1; }
done

WORK=$(mktemp -d /tmp/sluice-hot.XXXXXX)
cp "$SLUICE_BIN" "$WORK/sluice"
. "$ROOT/bench/lib.sh"
ports_free "$UP_PORT" "$SSE_UP_PORT" "$PORT" "$ADMIN"

realistic_trio "$PORT" "$ADMIN" "$CONFS"

for c in $CONFS; do
    realistic_req "$c"
    spawn valgrind --tool=callgrind --dump-instr=no --callgrind-out-file="$WORK/cg.$c" \
        "$WORK/sluice" -c "$WORK/$c.yaml" 2>"$WORK/cg.$c.log"
    pid=$LAST
    wait_admin_slow "$ADMIN" "$pid"
    BENCH_TOKEN=$REQ_TOKEN BENCH_BODY_FILE=$REQ_BODY wrk -t1 -c32 -d"$SECS"s --timeout 30s \
        -s "$ROOT/bench/realistic.lua" "http://127.0.0.1:$PORT/v1/chat/completions" >"$WORK/$c.wrk"
    grep -q 'errors=0 non2xx=0' "$WORK/$c.wrk" || { cat "$WORK/$c.wrk" >&2; exit 1; }
    curl -sf "http://127.0.0.1:$ADMIN/metrics" |
        awk '/^sluice_requests_total/ { s += $NF } END { printf "%d\n", s }' >"$WORK/n.$c"
    stop "$pid"
done

python3 - "$WORK" "$ROOT" "$MIN_CALLS" $CONFS <<'EOF'
import os, re, subprocess, sys
work, root, min_calls, confs = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4:]
suffix = re.compile(r'\.(lto_priv|isra|part|constprop|cold|localalias|avx2|default)(\.\d+)?')

def base(name):
    return suffix.sub('', name.split("'")[0])

def parse(path):
    """calls into and self Ir of every function of the object named sluice"""
    names = {'ob': {}, 'fn': {}}
    calls, ir = {}, {}
    ob = fn = cob = cfn = None
    skip = False
    def ref(kind, rest):
        m = re.match(r'\((\d+)\)(?: (.*))?', rest)
        if not m:
            return rest
        if m.group(2) is not None:
            names[kind][m.group(1)] = m.group(2)
        return names[kind][m.group(1)]
    for line in open(path):
        line = line.rstrip('\n')
        key, _, rest = line.partition('=')
        if key in ('ob', 'fl', 'fi', 'fe', 'fn', 'cob', 'cfi', 'cfl', 'cfn', 'calls'):
            if key == 'ob':
                ob = ref('ob', rest)
                cob = None
            elif key == 'fn':
                fn = ref('fn', rest)
                cob = None
            elif key == 'cob':
                cob = ref('ob', rest)
            elif key == 'cfn':
                cfn = ref('fn', rest)
            elif key == 'calls':
                target = cob or ob
                if target and os.path.basename(target) == 'sluice':
                    n = int(rest.split()[0])
                    calls[base(cfn)] = calls.get(base(cfn), 0) + n
                skip = True  # the next cost line is the call's inclusive cost
                cob = None
            continue
        if line and (line[0].isdigit() or line[0] in '+-*'):
            if skip:
                skip = False
                continue
            if ob and os.path.basename(ob) == 'sluice' and fn:
                t = line.split()
                if len(t) > 1:
                    ir[base(fn)] = ir.get(base(fn), 0) + int(t[1])
    return calls, ir

per = {}
for c in confs:
    n = int(open(f'{work}/n.{c}').read())
    calls, ir = parse(f'{work}/cg.{c}')
    per[c] = ({k: v / n for k, v in calls.items()}, {k: v / n for k, v in ir.items()}, n)

hot = sorted({f for c in confs for f, v in per[c][0].items() if v >= min_calls},
             key=lambda f: -max(per[c][1].get(f, 0) for c in confs))

def where(f):
    r = subprocess.run(['grep', '-rlE', '--include=*.c', rf'^{re.escape(f)}\(|^[a-z].* \**{re.escape(f)}\(.*[^;]$',
                        root + '/common', root + '/gateway', root + '/auth', root + '/ratelimit',
                        root + '/filters', root + '/fallback', root + '/conf', root + '/cache',
                        root + '/model'], capture_output=True, text=True)
    return ' '.join(os.path.relpath(p, root) for p in r.stdout.split()) or '?'

print('requests: ' + ', '.join(f'{c} {per[c][2]}' for c in confs))
print()
print('| function | ' + ' | '.join(f'{c} calls | {c} Ir' for c in confs) + ' | defined in |')
print('| --- | ' + ' | '.join('---: | ---:' for _ in confs) + ' | --- |')
for f in hot:
    cells = ' | '.join(f'{per[c][0].get(f, 0):.2f} | {per[c][1].get(f, 0):.0f}' for c in confs)
    print(f'| {f} | {cells} | {where(f)} |')
print()
print('hot set (%d functions, called >= %g times per request in one conf):' % (len(hot), min_calls))
for f in hot:
    print(f)
EOF
