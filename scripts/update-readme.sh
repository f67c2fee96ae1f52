#!/bin/sh
# Regenerates the conf reference inside README.md (between the
# conf-reference markers) from the key table: build/sluice --conf-reference.
# tests/integration/test_docs.py fails when they drift apart.
set -eu
cd "$(dirname "$0")/.."
BIN=${1:-build/sluice}
ref=$(mktemp)
"$BIN" --conf-reference > "$ref"
awk -v ref="$ref" '
    /<!-- conf-reference:begin -->/ { print; while ((getline l < ref) > 0) print l; skip = 1; next }
    /<!-- conf-reference:end -->/   { skip = 0 }
    !skip { print }
' README.md > README.md.tmp
mv README.md.tmp README.md
rm -f "$ref"
