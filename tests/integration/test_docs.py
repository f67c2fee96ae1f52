"""
test_docs.py — the docs cannot drift from the code: docs/conf-reference.md
is exactly what the key table generates (and the README links it), and every
metric family a running sluice exposes is listed in the README's metrics
table.
"""
import os
import re
import subprocess

from helpers import request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def readme():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return f.read()


def test_conf_reference_matches_the_key_table(sluice):
    out = subprocess.run([sluice.bin, "--conf-reference"], capture_output=True, check=True, timeout=10)
    with open(os.path.join(ROOT, "docs", "conf-reference.md"), encoding="utf-8") as f:
        assert f.read() == out.stdout.decode(), \
            "docs/conf-reference.md is stale: run scripts/update-conf-reference.sh"
    assert "(docs/conf-reference.md)" in readme(), "README.md must link the conf reference"


def test_readme_lists_every_metric_family(sluice):
    sluice.chat("hello")  # touch the request path so lazily made families exist
    r = request("127.0.0.1", sluice.admin_port, "GET", "/metrics")
    assert r.status == 200
    families = set(re.findall(r"^# TYPE (sluice_\w+) ", r.body.decode(), re.M))
    assert len(families) >= 10, families
    text = readme()
    missing = sorted(f for f in families if "`%s`" % f not in text)
    assert not missing, "metrics missing from README.md: %s" % missing
