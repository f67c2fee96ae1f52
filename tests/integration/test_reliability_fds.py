"""
test_reliability_fds.py — issue 15 item 9 and issue 13 item 8: running out
of file descriptors.

- A worker that cannot accept sheds its oldest idle keep-alive connections
  (then those that never sent a byte), so a new client is served at once
  instead of after the idle ones' timeouts; the warning is logged once per
  interval, not once per second per worker.
- The admin listener keeps a reserve: /healthz answers while the workers
  are out of descriptors.
- A local failure to open an upstream socket (EMFILE) is not the upstream's
  fault: it does not count against the server's circuit breaker.

The descriptor limit is lowered on the running sluice (prlimit), to what it
has open plus a small margin.
"""

import os
import resource
import threading
import time

from helpers import HTTPClient, bound, wait_until


def _limit_fds(s, margin):
    pid = s.p.proc.pid
    n = len(os.listdir("/proc/%d/fd" % pid))
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (n + margin, n + margin))
    return n + margin


def _accept_warnings(s):
    return [l for l in s.stderr_text().splitlines() if "accept:" in l]


def test_out_of_fds_sheds_idle_keepalive_connections(sluice_factory, mock):
    s = sluice_factory(
        {"workers": 1, "limits": {"keepalive_timeout": "60s", "header_timeout": "30s"}},
        upstream=mock,
    )
    limit = _limit_fds(s, 24)
    clients = []
    try:
        # Three times the limit of keep-alive clients, one after the other,
        # each served once and left idle. Before the fix the first client
        # past the limit waited for an idle one's 60 s timeout.
        for i in range(3 * limit // 2):
            c = HTTPClient(s.host, s.port, timeout=bound(3))
            clients.append(c)
            t0 = time.monotonic()
            r = c.request("GET", "/v1/models")
            assert r.status == 200, (i, r.status)
            assert time.monotonic() - t0 < bound(2), (i, time.monotonic() - t0)
        # the oldest idle ones were closed to make room
        assert clients[0].wait_closed(bound(2))
        # once per interval, not a line per accept or per second
        assert 1 <= len(_accept_warnings(s)) <= 2, _accept_warnings(s)
    finally:
        for c in clients:
            c.close()


def test_admin_answers_and_breaker_stays_closed_when_out_of_fds(sluice_factory, mock):
    s = sluice_factory(
        {"workers": 1, "upstreams": {"main": {"timeouts": {"first_byte": "20s"}}}},
        upstream=mock,
    )
    mock.set_default({"stall_first_byte": bound(3)})
    _limit_fds(s, 20)
    results = []
    lock = threading.Lock()
    flood = 25
    # The flood's clients connect, then all send together once sluice is
    # seen out of descriptors (the test thread is the last party).
    gate = threading.Barrier(flood + 1)

    def one(gated):
        try:
            with HTTPClient(s.host, s.port, timeout=bound(20)) as c:
                if gated:
                    gate.wait(bound(10))
                r = c.request(
                    "POST", "/v1/chat/completions",
                    body={"model": "chat-model", "messages": [{"role": "user", "content": "flood"}]},
                )
            st = r.status
        except Exception as e:  # a client never accepted in time
            st = repr(e)
        with lock:
            results.append(st)

    busy = [threading.Thread(target=one, args=(False,)) for _ in range(5)]
    rest = [threading.Thread(target=one, args=(True,)) for _ in range(flood)]
    released = False
    try:
        # Five busy requests first: each holds a client and an upstream
        # descriptor until the mock's stall ends (none of them can be shed).
        # Started with the flood, they raced its clients for the 20 spare
        # descriptors: on a loaded machine clients that had connected but
        # not yet sent their request held so many that only 4 ever reached
        # the mock.
        for t in busy:
            t.start()
        wait_until(lambda: len(mock.requests()) >= 5, timeout=bound(5), what="busy requests")
        # The flood's silent connections take the other 10 descriptors:
        # sluice cannot accept the rest.
        for t in rest:
            t.start()
        wait_until(lambda: "accept: Too many open files" in s.stderr_text(), timeout=bound(5),
                   what="sluice out of descriptors")
        t0 = time.monotonic()
        h = s.admin("GET", "/healthz", timeout=bound(2))
        assert h.status == 200
        assert time.monotonic() - t0 < bound(1.5)
        # The accepted ones send their requests: no descriptor is left for
        # their upstream sockets.
        gate.wait(bound(10))
        released = True
    finally:
        if not released:
            gate.abort()  # the test failed: the waiting threads go on at once
        for t in busy + rest:
            if t.ident is not None:  # started
                t.join(bound(30))
    # some requests found no descriptor for their upstream socket; a client
    # whose connection waited silent past the shed age may have been closed
    # to make room (an exception here), but no other status is right
    statuses = [r for r in results if isinstance(r, int)]
    shown = "; ".join(str(r) for r in results)
    assert 502 in statuses, shown
    assert all(r in (200, 502) for r in statuses), shown
    assert statuses.count(200) >= 5, shown  # the busy ones were served
    # ...which is not the server's fault: its breaker did not open
    mock.set_default("normal")
    r = s.chat("after the flood")
    assert r.status == 200, (r.status, r.body[:200])
    m = s.metrics()
    assert m.value("sluice_upstream_errors_total", upstream="main", kind="connect") == 0
    assert m.value("sluice_upstream_errors_total", upstream="main", kind="internal") >= 1
