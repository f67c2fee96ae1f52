"""
test_core_drain.py — SIGTERM (issue 2, part 7): sluice stops accepting at
once, lets open requests and streams finish, closes idle keep-alive
connections without waiting, exits 0; a stream that outlives
shutdown_timeout is cut at the deadline.
"""

import threading
import time

from helpers import bound, chat_body, connect_refused, wait_until


def test_idle_sigterm_exits_0_quickly(sluice):
    t0 = time.monotonic()
    sluice.term()
    assert sluice.wait_exit(bound(3)) == 0
    assert time.monotonic() - t0 < bound(2)


def test_open_stream_finishes_and_new_connections_are_refused(sluice_factory, mock):
    s = sluice_factory({"shutdown_timeout": "20s"})
    mock.script({"gate": True, "events": 3})
    with s.client(timeout=bound(10)) as c:
        r, evs = c.stream("POST", "/v1/chat/completions", chat_body("drain me", stream=True))
        evs = (e for e in evs if e.data is not None)
        got = [next(evs)]
        (req,) = mock.requests()
        s.term()
        wait_until(lambda: connect_refused(s.host, s.port), bound(3), what="the listener to close")
        assert s.alive(), "exited with a stream still open"
        mock.release(n=100, request=req["id"])
        got += list(evs)
        t_done = time.monotonic()
    assert got[-1].is_done and len(got) == 3 + 2
    assert s.wait_exit(bound(5)) == 0
    assert time.monotonic() - t_done < bound(3)


def test_in_flight_request_completes(sluice, mock):
    mock.script({"stall_first_byte": 0.8})
    out = {}

    def call():
        out["r"] = sluice.chat("in flight")

    t = threading.Thread(target=call)
    t.start()
    mock.wait_requests(1)
    sluice.term()
    t.join(bound(10))
    assert out["r"].status == 200
    assert out["r"].json()["choices"][0]["message"]["content"] == "echo: in flight"
    assert sluice.wait_exit(bound(5)) == 0


def test_idle_keepalive_connection_does_not_hold_the_drain(sluice_factory, mock):
    s = sluice_factory({"shutdown_timeout": "20s"})
    with s.client() as c:
        assert c.request("GET", "/v1/models").status == 200
        t0 = time.monotonic()
        s.term()
        assert c.wait_closed(bound(3)), "idle connection kept open during the drain"
        assert s.wait_exit(bound(3)) == 0
        assert time.monotonic() - t0 < bound(3)


def test_stream_cut_at_shutdown_timeout(sluice_factory, mock):
    s = sluice_factory({"shutdown_timeout": "1s"})
    mock.script({"gate": True})
    with s.client(timeout=bound(10)) as c:
        r, evs = c.stream("POST", "/v1/chat/completions", chat_body(stream=True))
        next(evs)
        t0 = time.monotonic()
        s.term()
        rest = list(evs)  # ends when sluice gives up on the stream
        took = time.monotonic() - t0
    assert not any(e.is_done for e in rest)
    assert 0.8 <= took <= bound(4), took
    rc = s.wait_exit(bound(5))
    assert rc is not None, "still running after shutdown_timeout"
    s.expected_rc = rc  # past the deadline, any orderly exit code will do
    assert rc >= 0, "killed by signal %d" % -rc
