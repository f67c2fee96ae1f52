"""
test_core_metrics.py — operations (issue 2, part 6): /metrics passes
`promtool check metrics`, every listed metric exists and counts what it
says (exact deltas, histogram consistency, gauges up and down, bounded label
cardinality), and the access log is JSON lines with no secrets or bodies.
"""

import json
import math
import uuid

import helpers
from helpers import UPSTREAM_KEY, bound, chat_body, raw_exchange, route_is, wait_until

TRUE = {"true", "yes", "1"}
FALSE = {"false", "no", "0"}

LISTED = [
    "sluice_requests_total",
    "sluice_request_duration_seconds_bucket",
    "sluice_request_duration_seconds_sum",
    "sluice_request_duration_seconds_count",
    "sluice_upstream_ttfb_seconds_bucket",
    "sluice_upstream_ttfb_seconds_count",
    "sluice_connections_active",
    "sluice_streams_active",
    "sluice_upstream_errors_total",
    "sluice_upstream_connections_total",
    "sluice_bytes_total",
    "sluice_http_parse_errors_total",
    "sluice_config_reloads_total",
]


def route_value(samples, name, route, **labels):
    return sum(v for _, l, v in samples.find(name, **labels) if route_is(l.get("route"), route))


def exercise(s, mock):
    """Traffic that touches every metric."""
    assert s.chat().status == 200
    with s.client() as c:
        events = [e for e in c.stream("POST", "/v1/chat/completions", chat_body(stream=True))[1] if e.data]
        assert events[-1].is_done
    assert s.request("GET", "/v1/models").status == 200
    assert s.chat(model="nope").status == 404
    mock.script({"cut_after": 1})
    with s.client() as c:
        list(c.stream("POST", "/v1/chat/completions", chat_body(stream=True))[1])
    raw_exchange(s.host, s.port, b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", timeout=bound(3))
    n = s.metrics().value("sluice_config_reloads_total")
    s.reload()
    wait_until(lambda: s.metrics().value("sluice_config_reloads_total") > n, bound(5), what="reload counted")


def test_promtool_accepts_metrics(sluice, mock, promtool):
    exercise(sluice, mock)
    text = sluice.metrics_text()
    ok, out = helpers.promtool_check(text)
    assert ok, out + "\n" + text[:3000]
    # sluice_ and, like every exporter, process_ (docs/metrics.md)
    assert all(ln.startswith(("sluice_", "process_")) or ln.startswith("#") or not ln.strip()
               for ln in text.splitlines()), "a metric without the sluice_ prefix"


def test_every_listed_metric_present(sluice, mock):
    exercise(sluice, mock)
    text = sluice.metrics_text()
    m = helpers.parse_prometheus(text)
    missing = [n for n in LISTED if not m.find(n)]
    assert not missing, "missing: %s" % missing
    for name, kind in (("sluice_requests_total", "counter"), ("sluice_request_duration_seconds", "histogram"),
                       ("sluice_upstream_ttfb_seconds", "histogram"), ("sluice_connections_active", "gauge"),
                       ("sluice_streams_active", "gauge")):
        assert "# TYPE %s %s" % (name, kind) in text, name
    dirs = {l.get("direction") for _, l, _ in m.find("sluice_bytes_total")}
    assert {"client_in", "client_out", "upstream_in", "upstream_out"} <= dirs, dirs
    codes = {l.get("code") for _, l, _ in m.find("sluice_requests_total")}
    # the classes, and 499 for a client that left (docs/metrics.md)
    assert codes <= {"1xx", "2xx", "3xx", "4xx", "499", "5xx"} and {"2xx", "4xx"} <= codes, codes


def test_request_counts_and_duration_histogram(sluice, mock):
    before = sluice.metrics()
    for _ in range(3):
        assert sluice.chat().status == 200
    for _ in range(2):
        assert sluice.chat(model="nope").status == 404
    assert sluice.request("GET", "/v1/models").status == 200
    after = sluice.metrics()

    def delta(name, route, **labels):
        return route_value(after, name, route, **labels) - route_value(before, name, route, **labels)

    assert delta("sluice_requests_total", "chat/completions", code="2xx") == 3
    assert delta("sluice_requests_total", "chat/completions", code="4xx") == 2
    assert delta("sluice_requests_total", "models", code="2xx") == 1
    assert delta("sluice_request_duration_seconds_count", "chat/completions") == 5
    # the histogram is consistent: cumulative buckets, +Inf == count
    buckets = [(float(l["le"]), v) for _, l, v in after.find("sluice_request_duration_seconds_bucket")
               if route_is(l.get("route"), "chat/completions")]
    buckets.sort()
    assert buckets and math.isinf(buckets[-1][0])
    assert all(a[1] <= b[1] for a, b in zip(buckets, buckets[1:])), buckets
    assert buckets[-1][1] == route_value(after, "sluice_request_duration_seconds_count", "chat/completions")


def test_ttfb_histogram_sees_a_slow_upstream(sluice, mock):
    before = sluice.metrics()
    mock.script({"stall_first_byte": 0.3})
    assert sluice.chat().status == 200
    after = sluice.metrics()
    d_count = after.value("sluice_upstream_ttfb_seconds_count", upstream="main") - before.value(
        "sluice_upstream_ttfb_seconds_count", upstream="main")
    d_sum = after.value("sluice_upstream_ttfb_seconds_sum", upstream="main") - before.value(
        "sluice_upstream_ttfb_seconds_sum", upstream="main")
    assert d_count == 1 and 0.25 <= d_sum <= bound(2), (d_count, d_sum)


def test_active_gauges_go_up_and_down(sluice, mock):
    mock.script({"gate": True})
    base_conns = sluice.metrics().value("sluice_connections_active")
    idle = [sluice.client() for _ in range(3)]
    c = sluice.client(timeout=bound(5))
    try:
        for i in idle:
            assert i.request("GET", "/healthz").status == 200
        r, evs = c.stream("POST", "/v1/chat/completions", chat_body(stream=True))
        next(evs)
        m = sluice.metrics()
        assert m.value("sluice_streams_active") == 1
        assert m.value("sluice_connections_active") >= base_conns + 4
        mock.release(n=100)
        assert [e for e in evs if e.data][-1].is_done
    finally:
        for x in idle + [c]:
            x.close()
    wait_until(lambda: sluice.metrics().value("sluice_streams_active") == 0, bound(3), what="streams_active 0")
    wait_until(lambda: sluice.metrics().value("sluice_connections_active") <= base_conns, bound(3),
               what="connections_active back down")


def test_bytes_counted_in_every_direction(sluice, mock):
    before = sluice.metrics()
    prompt = "b" * 5000
    r = sluice.chat(prompt)
    assert r.status == 200
    after = sluice.metrics()
    d = {k: after.value("sluice_bytes_total", direction=k) - before.value("sluice_bytes_total", direction=k)
         for k in ("client_in", "client_out", "upstream_in", "upstream_out")}
    assert d["client_in"] >= 5000 and d["upstream_out"] >= 5000, d
    assert d["upstream_in"] >= len(r.body) and d["client_out"] >= len(r.body), d


def test_upstream_connection_reuse_counted(sluice_factory, mock):
    s = sluice_factory({"workers": 1})
    for _ in range(4):
        assert s.chat().status == 200
    m = s.metrics()
    series = m.find("sluice_upstream_connections_total", upstream="main")
    new = sum(v for _, l, v in series if l.get("reused") in FALSE)
    reused = sum(v for _, l, v in series if l.get("reused") in TRUE)
    assert (new, reused) == (1, 3), series


def test_parse_errors_counted_by_reason(sluice, mock):
    before = sluice.metrics().value("sluice_http_parse_errors_total")
    raw_exchange(sluice.host, sluice.port, b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", timeout=bound(3))
    raw_exchange(sluice.host, sluice.port, b"GET / HTTP/1.1\nHost: a\r\n\r\n", timeout=bound(3))
    m = sluice.metrics()
    assert m.value("sluice_http_parse_errors_total") == before + 2
    reasons = {l.get("reason") for _, l, _ in m.find("sluice_http_parse_errors_total")}
    assert reasons and all(reasons), reasons


def test_label_cardinality_is_bounded(sluice, mock):
    for i in range(25):
        sluice.request("GET", "/random/%s" % uuid.uuid4().hex)
        sluice.chat(model="model-%s" % uuid.uuid4().hex)
    text = sluice.metrics_text()
    assert "/random/" not in text and "model-" not in text
    routes = {l.get("route") for _, l, _ in helpers.parse_prometheus(text).find("sluice_requests_total")}
    assert len(routes) <= 12, routes  # a fixed set of route names


def test_access_log_json_lines_without_secrets(sluice, mock):
    marker = "prompt-marker-%s" % uuid.uuid4().hex
    client_secret = "client-secret-%s" % uuid.uuid4().hex
    assert sluice.chat(marker, headers={"Authorization": "Bearer " + client_secret}).status == 200
    with sluice.client() as c:
        list(c.stream("POST", "/v1/chat/completions", chat_body(marker, stream=True),
                      headers={"Authorization": "Bearer " + client_secret})[1])
    assert sluice.chat(model="nope").status == 404

    def lines():
        out = sluice.access_log()
        return out if len(out) >= 3 else None

    entries = wait_until(lines, bound(5), what="3 access log lines on stdout")
    blob = sluice.stdout_text()
    for secret in (marker, client_secret, UPSTREAM_KEY):
        assert secret not in blob, "%s... leaked into the access log" % secret[:14]
    values = [json.dumps(e) for e in entries]
    assert sum("/v1/chat/completions" in v for v in values) >= 3
    statuses = [v for e in entries for k, v in e.items() if k in ("status", "code", "status_code")]
    assert 200 in statuses and 404 in statuses, entries
    for line in blob.splitlines():
        if line.strip():
            assert isinstance(json.loads(line), dict), "stdout line is not a JSON object: %r" % line
