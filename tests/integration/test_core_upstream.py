"""
test_core_upstream.py — upstream failures and pools (issue 2, part 3):
connect errors (502), first-byte and total timeouts (504), connect timeouts,
broken upstream framing, ejection of a failing server and its return,
503 when no server is left, weighted round robin and least-connections.
"""

import socket
import threading
import time

import pytest

from helpers import assert_error, bound, chat_body, free_port, wait_until


def served_by(r):
    return r.json().get("system_fingerprint")


def test_connect_refused_502(sluice_factory):
    s = sluice_factory(upstream="http://127.0.0.1:%d" % free_port())
    t0 = time.monotonic()
    assert_error(s.chat(), 502, "upstream_error", "server_error")
    assert_error(s.chat(stream=True), 502, "upstream_error", "server_error")
    assert time.monotonic() - t0 < bound(3)
    m = s.metrics()
    assert m.value("sluice_upstream_errors_total", upstream="main") >= 2
    assert any(l.get("code") == "5xx" for _, l, _ in m.find("sluice_requests_total"))


@pytest.mark.parametrize("stream", [False, True], ids=["non_stream", "stream"])
def test_first_byte_timeout_504(sluice_factory, mock, stream):
    s = sluice_factory({"upstreams": {"main": {"timeouts": {"first_byte": "500ms"}}}}, upstream=mock)
    mock.script({"stall_first_byte": True})
    t0 = time.monotonic()
    r = s.chat(stream=stream)
    took = time.monotonic() - t0
    assert_error(r, 504, "upstream_timeout", "server_error")
    assert 0.4 <= took <= bound(3), took
    # and the upstream request is abandoned: its connection closed
    wait_until(lambda: all(c["closed"] for c in mock.connections()), bound(2), what="upstream connection closed")
    assert s.metrics().value("sluice_upstream_errors_total", upstream="main") >= 1


def test_first_byte_timeout_after_quick_requests(sluice_factory, mock):
    # A cached request struct keeps its upstream timer set for an earlier
    # request's deadline (proxy.c, gw_proxy_arm_at): it fires early, finds
    # a later deadline due and re-arms for the rest. One worker, so the
    # stalled request takes a struct the quick ones used; it starts 300 ms
    # after them (not a synchronisation: that puts the stale deadline inside
    # its wait). Its 504 comes at its own first-byte deadline: not at the
    # stale one (too early), not never (no re-arm).
    s = sluice_factory({"workers": 1, "upstreams": {"main": {"timeouts": {"first_byte": "600ms"}}}}, upstream=mock)
    for _ in range(4):
        assert s.chat().status == 200
    time.sleep(0.3)
    mock.script({"stall_first_byte": True})
    t0 = time.monotonic()
    r = s.chat()
    took = time.monotonic() - t0
    assert_error(r, 504, "upstream_timeout", "server_error")
    assert 0.55 <= took <= bound(3), took
    # and a quick one after it is not cut by the timer the 504 left behind
    assert s.chat().status == 200


def test_answer_after_a_slow_first_byte_within_the_limit(sluice_factory, mock):
    s = sluice_factory({"upstreams": {"main": {"timeouts": {"first_byte": "2s"}}}}, upstream=mock)
    mock.script({"stall_first_byte": 0.5})
    assert s.chat().status == 200


def test_total_timeout_cuts_a_long_stream(sluice_factory, mock):
    s = sluice_factory({"upstreams": {"main": {"timeouts": {"connect": "1s", "first_byte": "1s", "total": "1500ms"}}}}, upstream=mock)
    mock.script({"events": 20, "delay": 0.25})
    t0 = time.monotonic()
    with s.client(timeout=bound(10)) as c:
        r, evs = c.stream("POST", "/v1/chat/completions", chat_body(stream=True))
        events = [e for e in evs if e.data is not None]
    took = time.monotonic() - t0
    assert r.status == 200
    assert 1.2 <= took <= bound(4), took
    assert not any(e.is_done for e in events)
    err = events[-1].json()["error"]
    assert err["code"] in ("upstream_timeout", "upstream_truncated"), err


@pytest.mark.parametrize("beh", [{}, {"stall_after_headers": 0.7}], ids=["head_with_event", "head_alone"])
def test_first_byte_timeout_ends_with_the_head(sluice_factory, mock, beh):
    # Once the head is in, only the total deadline applies (re-armed after
    # the read holding the head is written): gaps longer than first_byte
    # between events do not cut the stream.
    s = sluice_factory({"upstreams": {"main": {"timeouts": {"first_byte": "300ms", "total": "20s"}}}}, upstream=mock)
    mock.script(dict(beh, events=3, delay=0.7))
    with s.client(timeout=bound(10)) as c:
        r, evs = c.stream("POST", "/v1/chat/completions", chat_body("gaps", stream=True))
        events = [e for e in evs if e.data is not None]
    assert r.status == 200
    assert events and events[-1].is_done, [e.raw for e in events]
    assert not any("error" in e.json() for e in events if not e.is_done), [e.raw for e in events]
    assert (s.metrics().value("sluice_upstream_errors_total", upstream="main") or 0) == 0


def test_connect_timeout(sluice_factory):
    # A listener whose accept queue is full: the kernel drops new SYNs, so a
    # connect neither succeeds nor fails until the client gives up.
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(0)
    port = lst.getsockname()[1]
    fillers = []
    try:
        for _ in range(4):
            f = socket.socket()
            f.setblocking(False)
            f.connect_ex(("127.0.0.1", port))
            fillers.append(f)
        probe = socket.socket()
        probe.settimeout(0.3)
        try:
            probe.connect(("127.0.0.1", port))
            pytest.skip("this kernel completes connects to a full accept queue; no black hole to test with")
        except (socket.timeout, TimeoutError):
            pass
        finally:
            probe.close()
        s = sluice_factory(
            {"upstreams": {"main": {"timeouts": {"connect": "500ms"}}}},
            upstream="http://127.0.0.1:%d" % port,
        )
        t0 = time.monotonic()
        r = s.chat()
        took = time.monotonic() - t0
        assert r.status in (502, 504), r
        assert_error(r, r.status, "upstream_timeout" if r.status == 504 else "upstream_error", "server_error")
        assert 0.4 <= took <= bound(3), took
    finally:
        for f in fillers:
            f.close()
        lst.close()


@pytest.mark.parametrize(
    "raw",
    [
        "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        "HTTP/1.1 200 OK\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
        "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
        "NOT HTTP AT ALL\r\n\r\n",
        "HTTP/1.1 200 OK\r\nX-A: 1\r\n b\r\nContent-Length: 2\r\n\r\n{}",
    ],
    ids=["cl_and_te", "bare_lf", "two_cl", "garbage", "obs_fold"],
)
def test_broken_upstream_response_502(sluice, mock, raw):
    mock.script({"raw_response": raw})
    assert_error(sluice.chat(), 502, "upstream_error", "server_error")
    assert sluice.chat().status == 200


def test_failing_server_is_ejected(sluice_factory, mock_factory):
    bad, good = mock_factory("bad"), mock_factory("good")
    bad.set_default({"status": 503})
    s = sluice_factory(
        {
            "workers": 1,
            "upstreams": {"main": {
                "servers": [{"url": bad.url, "weight": 1}, {"url": good.url, "weight": 1}],
                "max_fails": 2, "eject": "30s",
            }},
        },
        upstream=good,
    )
    statuses = [s.chat("r%d" % i).status for i in range(12)]
    nbad = len(bad.requests())
    assert 1 <= nbad <= 2, "bad server got %d requests: %s" % (nbad, statuses)
    assert statuses.count(503) == nbad
    assert statuses[-8:] == [200] * 8
    assert len(good.requests()) == 12 - nbad


def test_ejected_server_returns_after_cooldown(sluice_factory, mock_factory):
    a, b = mock_factory("a"), mock_factory("b")
    s = sluice_factory(
        {
            "workers": 1,
            "upstreams": {"main": {
                "servers": [{"url": a.url}, {"url": b.url}],
                "max_fails": 1, "eject": "1s",
            }},
        },
        upstream=b,
    )
    a.set_default({"status": 500})
    # round robin: within two requests one reaches a and fails: ejected.
    # The cooldown runs from the ejection, inside that request: the clock is
    # read before each one, so time since then bounds it from below however
    # late the answer and the mock's count reach us.
    sent = []

    def a_hit():
        sent.append(time.monotonic())
        s.chat()
        return len(a.requests()) >= 1

    wait_until(a_hit, bound(5), what="a request at a")
    t_eject = sent[-1]
    a.set_default({})
    a.reset()
    for _ in range(3):
        assert s.chat().status == 200  # all to b while a rests
    assert a.requests() == [] or time.monotonic() - t_eject >= 0.9
    wait_until(lambda: (s.chat(), len(a.requests()) >= 1)[1], bound(6), interval=0.1, what="a back in rotation")
    assert time.monotonic() - t_eject >= 0.9


def test_no_server_left_503(sluice_factory):
    s = sluice_factory(
        {"workers": 1, "upstreams": {"main": {"max_fails": 1, "eject": "30s"}}},
        upstream="http://127.0.0.1:%d" % free_port(),
    )
    assert_error(s.chat(), 502, "upstream_error", "server_error")
    t0 = time.monotonic()
    r = s.chat()
    assert_error(r, 503, "upstream_unavailable", "server_error")
    assert time.monotonic() - t0 < bound(1)


def test_weighted_round_robin(sluice_factory, mock_factory):
    a, b = mock_factory("a"), mock_factory("b")
    s = sluice_factory(
        {"workers": 1, "upstreams": {"main": {"servers": [{"url": a.url, "weight": 3}, {"url": b.url, "weight": 1}]}}},
        upstream=a,
    )
    got = [served_by(s.chat("w%d" % i)) for i in range(40)]
    assert abs(got.count("a") - 30) <= 1 and abs(got.count("b") - 10) <= 1, got
    # spread, not 30 in a row
    longest, run = 0, 0
    for x in got:
        run = run + 1 if x == "a" else 0
        longest = max(longest, run)
    assert longest <= 6, got


def test_least_conn_avoids_the_busy_server(sluice_factory, mock_factory):
    a, b = mock_factory("a"), mock_factory("b")
    for m in (a, b):
        m.script({"gate": True})
    s = sluice_factory(
        {"workers": 1, "upstreams": {"main": {"balance": "least_conn", "servers": [{"url": a.url}, {"url": b.url}]}}},
        upstream=a,
    )
    c = s.client()
    try:
        r, evs = c.stream("POST", "/v1/chat/completions", chat_body(stream=True))
        first = next(e for e in evs if e.data)
        busy = first.json()["system_fingerprint"]
        idle = {"a": b, "b": a}[busy]
        idle.reset()
        for _ in range(3):
            r2 = s.chat()
            assert served_by(r2) == idle.name, "least_conn sent a request to the busy server"
    finally:
        for m in (a, b):
            m.release(n=100)
        c.close()


def test_concurrent_streams_across_two_servers(sluice_factory, mock_factory):
    a, b = mock_factory("a"), mock_factory("b")
    s = sluice_factory({"upstreams": {"main": {"servers": [{"url": a.url}, {"url": b.url}]}}}, upstream=a)
    out = {}

    def one(i):
        with s.client() as c:
            evs = [e for e in c.stream("POST", "/v1/chat/completions", chat_body("c%d" % i, stream=True))[1] if e.data]
            out[i] = evs[-1].is_done

    ts = [threading.Thread(target=one, args=(i,)) for i in range(10)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(bound(20))
    assert out == {i: True for i in range(10)}
    assert len(a.requests()) + len(b.requests()) == 10
    assert a.requests() and b.requests()
