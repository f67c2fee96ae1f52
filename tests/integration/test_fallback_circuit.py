"""
test_fallback_circuit.py — the circuit breaker and the local tier through
the real binary (issue 6, tiers 2 and 3): consecutive failures open a
server's circuit (sluice_circuit_state, sluice_circuit_opened_total,
/readyz), traffic then goes to the local pool (fallback.local.upstream, a
second mock) with X-Sluice-Fallback: local without touching the open
server, to the template when the local pool fails too, and back to the
model's own server once a half-open probe succeeds (a failing probe opens
it again). upstreams.*.max_fails / eject are the per-upstream breaker
settings.
"""

import time

import fallback_helpers as fh
import helpers
from helpers import bound, mock_upstream

EJECT = bound(2.0)  # s the main server's circuit stays open; section 3 must fit in it


def state(s, mock, upstream="main"):
    return fh.metric(s, "sluice_circuit_state", upstream=upstream, server=mock.url)


def readyz(s):
    r = s.admin("GET", "/readyz")
    return r.status, r.json()


def test_opens_goes_local_then_template_and_recovers(sluice_factory, mock_factory):
    a = mock_factory(name="main")
    b = mock_factory(name="local")
    over = fh.merge(
        fh.chain(local="local"),
        {"upstreams": {"main": {"max_fails": 3, "eject": "%dms" % int(EJECT * 1000)}}},
        fh.second_upstream("local", b, max_fails=3, eject="1h"),
    )
    s = sluice_factory(overrides=over, upstream=a)
    assert readyz(s) == (200, {"status": "ready", "upstreams": {"main": {"servers": 1, "in_service": 1},
                                                                "local": {"servers": 1, "in_service": 1}}})
    a.set_default({"status": 503})

    # 1. Three failures, each answered by the local pool.
    # The cooldown runs from the breaker's opening, inside the third
    # request: the clock is read before it, so that time since then bounds
    # the cooldown from below however late the answer reaches us.
    for i in range(3):
        if i == 2:
            t_open = time.monotonic()
        r = s.chat("f%d" % i)
        assert r.status == 200 and r.header("X-Sluice-Fallback") == "local", r
        j = r.json()
        assert j["system_fingerprint"] == "local"  # the mock named "local" answered
        assert j["choices"][0]["message"]["content"] == mock_upstream.reply_text("f%d" % i)
    assert len(a.requests()) == 3
    assert state(s, a) == 2
    assert fh.metric(s, "sluice_circuit_opened_total", upstream="main", server=a.url) == 1
    st, j = readyz(s)
    assert st == 503 and j["status"] == "not_ready", j
    assert j["upstreams"]["main"] == {"servers": 1, "in_service": 0}, j
    assert j["upstreams"]["local"] == {"servers": 1, "in_service": 1}, j
    assert s.request("GET", "/readyz").status == 503  # the main listener says so too

    # 2. Open: straight to the local pool, the main server untouched.
    for i in range(5):
        r = s.chat("open%d" % i, stream=True)  # streams go local as they are
        assert r.status == 200 and r.header("X-Sluice-Fallback") == "local", r
        assert b"data: [DONE]" in r.body
    # 3. The local pool fails too: template; its breaker opens after 3.
    b.set_default({"status": 500})
    for i in range(5):
        fh.assert_template_json(s.chat("both down %d" % i))
    assert time.monotonic() - t_open < EJECT, "too slow for the cooldown: the asserts below need it open"
    assert len(a.requests()) == 3
    assert len(b.requests()) == 3 + 5 + 3
    assert state(s, b, "local") == 2
    m = s.metrics()
    assert m.value("sluice_fallback_total", tier="local") == 3 + 5  # what it served
    assert m.value("sluice_fallback_total", tier="template") == 5
    assert m.value("sluice_upstream_errors_total", upstream="main", kind="unavailable") == 5 + 5
    assert readyz(s)[1]["upstreams"]["local"]["in_service"] == 0

    # 4. Half-open after the cooldown: one probe; it fails, so it opens again.
    helpers.wait_until(lambda: state(s, a) == 1, bound(EJECT + 2), what="half-open")
    assert time.monotonic() - t_open >= EJECT - 0.1
    t_reopen = time.monotonic()  # before the probe whose failure reopens it
    fh.assert_template_json(s.chat("probe fails"))
    assert len(a.requests()) == 4
    assert state(s, a) == 2
    assert fh.metric(s, "sluice_circuit_opened_total", upstream="main", server=a.url) == 2

    # 5. The server is back: the next probe closes the circuit.
    a.set_default({})
    helpers.wait_until(lambda: state(s, a) == 1, bound(EJECT + 2), what="half-open again")
    assert time.monotonic() - t_reopen >= EJECT - 0.1
    r = s.chat("probe ok")
    assert r.status == 200 and r.header("X-Sluice-Fallback") is None, r.headers
    assert r.json()["system_fingerprint"] == "main"
    assert state(s, a) == 0
    for i in range(5):
        assert s.chat("ok%d" % i).header("X-Sluice-Fallback") is None
    assert len(a.requests()) == 4 + 1 + 5
    st, j = readyz(s)
    assert j["upstreams"]["main"] == {"servers": 1, "in_service": 1}
    assert st == 503  # the local pool is still out for its hour


def test_breaker_with_two_servers_keeps_serving(sluice_factory, mock_factory):
    """One of two servers failing: its circuit opens and the pool keeps
    answering from the other, no fallback tier needed, readiness kept."""
    a = mock_factory(name="a")
    b = mock_factory(name="b")
    a.set_default({"status": 503})
    over = fh.merge(
        fh.chain(retry={"attempts": 1, "backoff": "10ms"}, circuit={"failures": 2, "cooldown": "1h"}),
        {"upstreams": {"main": {"servers": [{"url": a.url}, {"url": b.url}]}}},
    )
    s = sluice_factory(overrides=over, upstream=a)
    rs = [s.chat("x%d" % i) for i in range(20)]
    assert all(r.status == 200 and r.header("X-Sluice-Fallback") is None for r in rs)
    assert len(a.requests()) == 2  # two failures opened it; nothing more went there
    assert len(b.requests()) == 20
    assert state(s, a) == 2 and state(s, b) == 0
    st, j = readyz(s)
    assert st == 200 and j["upstreams"]["main"] == {"servers": 2, "in_service": 1}, j


def test_failure_ratio_opens_it(sluice_factory, mock):
    """failure_percent over the window, once min_requests results are in,
    opens the circuit even without a run of consecutive failures."""
    over = fh.chain(circuit={"failures": 0, "failure_percent": 50, "min_requests": 10, "window": "10s",
                             "cooldown": "1h"})
    s = sluice_factory(overrides=over, upstream=mock)
    # alternate ok / fail: never two failures in a row, half of them failing
    mock.script(*([{}, {"status": 503}] * 5))
    for i in range(10):
        r = s.chat("r%d" % i)
        assert r.status == 200
    assert state(s, mock) == 2
    fh.assert_template_json(s.chat("now open"))
    assert len(mock.requests()) == 10


def test_local_tier_counts_only_what_it_served(sluice_factory, mock_factory):
    """sluice_fallback_total{tier="local"} counts what the local pool served,
    not every hand-over to it (a local attempt ending in the template is a
    template)."""
    a = mock_factory(name="main")
    b = mock_factory(name="local")
    a.set_default({"status": 503})
    b.script({}, {"status": 503})
    s = sluice_factory(overrides=fh.merge(fh.chain(local="local"), fh.second_upstream("local", b)),
                       upstream=a)
    assert s.chat("served locally").header("X-Sluice-Fallback") == "local"
    fh.assert_template_json(s.chat("local fails too"))
    m = s.metrics()
    assert m.value("sluice_fallback_total", tier="template") == 1
    assert m.value("sluice_fallback_total", tier="local") == 1


def test_open_circuit_goes_to_the_next_tier_at_once(sluice_factory, mock):
    """Every circuit of the pool open: no retry is scheduled (no backoff
    waited, no budget spent, nothing counted), the next tier answers now."""
    over = fh.chain(retry={"attempts": 1, "backoff": "1s", "backoff_max": "2s"},
                    circuit={"failures": 1, "cooldown": "1h"})
    s = sluice_factory(overrides=over, upstream=mock)
    mock.set_default({"status": 503})
    fh.assert_template_json(s.chat("opens it"))
    assert state(s, mock) == 2
    m0 = fh.Metrics(s)
    t0 = time.monotonic()
    fh.assert_template_json(s.chat("circuit open"))
    took = time.monotonic() - t0
    assert len(mock.requests()) == 1
    assert m0.delta("sluice_retries_total", upstream="main") == 0
    assert took < bound(0.3), "the template came %.2fs late: a retry of an open pool was waited for" % took
