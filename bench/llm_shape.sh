#!/usr/bin/env bash
# bench/llm_shape.sh — instructions per read of llm_metrics.c's kept shapes
# (docs/metrics.md, "Kept shapes") against the scan and yajl they skip,
# counted by callgrind (load-immune): build/tools/llm_shape_bench run for
# CG_N1 and CG_N2 iterations, (Ir(N2) - Ir(N1)) / (N2 - N1).
#   LSB_BIN (default build/tools/llm_shape_bench), CG_N1 / CG_N2 (1000 / 11000)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${LSB_BIN:-$ROOT/build/tools/llm_shape_bench}
N1=${CG_N1:-1000}
N2=${CG_N2:-11000}
ir() {
    valgrind --tool=callgrind --callgrind-out-file=/dev/null "$BIN" "$1" "$2" 2>&1 |
        awk '/Collected/ { gsub(",", "", $4); print $4 }'
}
echo "| mode | instructions per read |"
echo "| --- | ---: |"
for m in scan kept scan-miss kept-miss yajl kept-usage yajl-rot kept-rot; do
    a=$(ir "$N1" "$m")
    b=$(ir "$N2" "$m")
    echo "| $m | $(((b - a) / (N2 - N1))) |"
done
