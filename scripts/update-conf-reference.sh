#!/bin/sh
# Regenerates docs/conf-reference.md from the key table
# (build/sluice --conf-reference). tests/integration/test_docs.py and the
# conf unit test fail when they drift apart.
set -eu
cd "$(dirname "$0")/.."
BIN=${1:-build/sluice}
"$BIN" --conf-reference > docs/conf-reference.md.tmp
mv docs/conf-reference.md.tmp docs/conf-reference.md
