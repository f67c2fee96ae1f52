"""
test_obs_contrib.py — the Grafana dashboard and the alert rules in contrib/
cannot drift from the metrics (issue 14):

- every query of contrib/grafana/sluice.json is valid PromQL (each is handed
  to `promtool check rules` as a recording rule, Grafana's variables replaced
  by what they expand to);
- every metric the dashboard and contrib/prometheus/alerts.yml use is
  documented: in docs/metrics.md (the contract) or the README's metrics
  table;
- the dashboard is importable as such: unique panel ids, a data source input,
  every panel with a query, nothing overlapping on the grid.

(`promtool check rules` / `promtool test rules` on alerts.yml itself run in
`make promtool-test`.)
"""

import json
import os
import re
import shutil
import subprocess

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DASH = os.path.join(ROOT, "contrib", "grafana", "sluice.json")
ALERTS = os.path.join(ROOT, "contrib", "prometheus", "alerts.yml")


def read(*parts):
    with open(os.path.join(ROOT, *parts), encoding="utf-8") as f:
        return f.read()


def dashboard():
    with open(DASH, encoding="utf-8") as f:
        return json.load(f)


def panels(d):
    for p in d["panels"]:
        yield p
        for q in p.get("panels", []):
            yield q


def dashboard_exprs(d):
    out = []
    for p in panels(d):
        for t in p.get("targets", []):
            out.append(t["expr"])
    for a in d.get("annotations", {}).get("list", []):
        if a.get("expr"):
            out.append(a["expr"])
    return out


def expand(expr):
    """Grafana's variables as Prometheus would see them."""
    expr = expr.replace("$__rate_interval", "5m").replace("$__interval", "1m")
    return re.sub(r"\$(job|instance|model)\b", ".*", expr)


def metric_names(expr):
    names = set()
    for m in re.finditer(r"\b((?:sluice|process)_[a-z0-9_]+)\b", expr):
        n = m.group(1)
        for suffix in ("_bucket", "_count", "_sum"):
            if n.endswith(suffix) and not n.endswith("_total"):
                n = n[: -len(suffix)]
        names.add(n)
    return names


def test_dashboard_queries_are_valid_promql(tmp_path):
    exprs = dashboard_exprs(dashboard())
    assert len(exprs) >= 30, len(exprs)
    rules = ["groups:", "  - name: dashboard", "    rules:"]
    for i, e in enumerate(exprs):
        rules.append("      - record: dashboard:q%d" % i)
        rules.append("        expr: %s" % json.dumps(expand(e)))
    f = tmp_path / "dashboard_rules.yml"
    f.write_text("\n".join(rules) + "\n")
    p = subprocess.run([shutil.which("promtool"), "check", "rules", str(f)], capture_output=True,
                       timeout=30)
    out = (p.stdout + p.stderr).decode()
    assert p.returncode == 0, out
    assert "SUCCESS: %d rules found" % len(exprs) in out, out


def test_every_metric_used_is_documented():
    docs = read("docs", "metrics.md") + read("README.md")
    used = set()
    for e in dashboard_exprs(dashboard()):
        used |= metric_names(e)
    alerts = read("contrib", "prometheus", "alerts.yml")
    alert_names = metric_names(alerts)
    used |= alert_names
    assert {"sluice_time_to_first_token_seconds", "sluice_tokens_total", "sluice_queue_depth",
            "sluice_circuit_state", "process_open_fds", "process_max_fds"} <= used, used
    missing = sorted(n for n in used if "`%s`" % n not in docs)
    assert not missing, "used but not documented in docs/metrics.md or README.md: %s" % missing
    # every alert the docs name exists, and the other way round
    rules = set(re.findall(r"^\s*- alert: (\w+)", alerts, re.M))
    assert len(rules) == 9, rules
    for r in rules:
        assert "`%s`" % r in read("docs", "metrics.md"), r


def test_dashboard_is_importable():
    d = dashboard()
    assert d["uid"] and d["title"]
    assert [i["name"] for i in d["__inputs"]] == ["DS_PROMETHEUS"]
    ids = [p["id"] for p in panels(d)]
    assert len(ids) == len(set(ids)), ids
    cells = {}
    for p in panels(d):
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, (p["title"], cells.get((x, y)))
                cells[(x, y)] = p["title"]
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${DS_PROMETHEUS}", p["title"]
        assert p.get("targets"), p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
    titles = " ".join(p["title"] for p in panels(d))
    for want in ("Time to first token", "Tokens / s", "Breaker", "Queue depth", "5xx"):
        assert want in titles, want
