"""
test_core_deadlines.py — client-side deadlines (issue 2, part 2) with short
conf values: the header and body deadlines are totals, not idle timers (a
client dripping one byte at a time is still cut), a late request gets 408,
and a client that reads nothing is cut after send_timeout together with its
upstream request. Each close must come within a bound.
"""

import time

import pytest

import helpers
from helpers import bound, chat_body, raw_exchange, wait_until

HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


@pytest.fixture
def short(sluice_factory, mock):
    return sluice_factory({"limits": {"header_timeout": "1s", "body_timeout": "1s", "send_timeout": "1s"}})


def assert_408_close(res, t0, lo=0.8, hi=3.0):
    assert res.closed, "connection still open: %r" % res
    took = res.t_closed - t0
    assert lo <= took <= bound(hi), "closed after %.2fs" % took
    r = res.response()
    helpers.assert_error(r, 408, "request_timeout")


def test_partial_head_gets_408(short, mock):
    t0 = time.monotonic()
    res = raw_exchange(short.host, short.port, HEAD, timeout=bound(5))
    assert_408_close(res, t0)
    assert mock.bytes_received() == 0


def test_head_dripped_slowly_is_cut_at_the_deadline(short, mock):
    # one byte every 150 ms: each byte resets an idle timer, never a deadline
    pieces = [(HEAD[i:i + 1], 0.15) for i in range(len(HEAD))]
    t0 = time.monotonic()
    res = raw_exchange(short.host, short.port, None, timeout=bound(5), pieces=pieces)
    assert res.closed
    assert res.t_closed - t0 <= bound(2.5), "cut after %.2fs" % (res.t_closed - t0)
    if res.data:
        assert res.response().status == 408
    assert mock.bytes_received() == 0


def test_silent_new_connection_is_closed(short, mock):
    t0 = time.monotonic()
    res = raw_exchange(short.host, short.port, b"", timeout=bound(5))
    assert res.closed and res.t_closed - t0 <= bound(3)
    if res.data:  # a 408 is allowed, nothing else
        assert res.response().status == 408


def test_partial_body_gets_408(short, mock):
    t0 = time.monotonic()
    res = raw_exchange(short.host, short.port, HEAD + b"Content-Length: 100\r\n\r\n{\"model\":", timeout=bound(5))
    assert_408_close(res, t0)
    assert mock.bytes_received() == 0


def test_body_dripped_slowly_is_cut_at_the_deadline(short, mock):
    body = b'{"model":"chat-model","messages":[]}' + b" " * 64
    head = HEAD + b"Content-Length: %d\r\n\r\n" % len(body)
    pieces = [(head, 0)] + [(body[i:i + 1], 0.15) for i in range(len(body))]
    t0 = time.monotonic()
    res = raw_exchange(short.host, short.port, None, timeout=bound(5), pieces=pieces)
    assert res.closed and res.t_closed - t0 <= bound(2.5), res
    if res.data:
        assert res.response().status == 408
    assert mock.bytes_received() == 0


def test_request_in_time_is_served(short, mock):
    # pauses shorter than the deadline in all: served normally
    body = b'{"model":"chat-model","messages":[{"role":"user","content":"ok"}]}'
    head = HEAD + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
    res = raw_exchange(short.host, short.port, None, timeout=bound(5),
                       pieces=[(head[:20], 0.2), (head[20:], 0.2), (body, 0)])
    assert res.response().status == 200


@pytest.mark.timeout(120)
def test_client_that_reads_nothing_is_cut_after_send_timeout(short, mock):
    mock.script({"events": 900, "pad": 64 * 1024})
    c = short.client(timeout=bound(10), rcvbuf=32 * 1024)
    try:
        c.send_request("POST", "/v1/chat/completions", chat_body(stream=True))
        mock.wait_requests(1)
        # The client reads nothing. sluice must give up on it after about
        # send_timeout of no progress, and cancel the upstream request too.
        t0 = time.monotonic()
        conn = wait_until(
            lambda: next((x for x in mock.connections() if x["closed"]), None),
            bound(15),
            what="the upstream request to be cancelled",
        )
        assert conn["closed"] - t0 <= bound(10)
        assert mock.requests()[0]["events_sent"] < 900
        # what the client can still read ends without [DONE]
        got = b""
        while c._fill(timeout=bound(5)):
            got += c.buf
            c.buf = b""
        assert b"data: [DONE]" not in got
    finally:
        c.close()
    assert short.chat().status == 200
