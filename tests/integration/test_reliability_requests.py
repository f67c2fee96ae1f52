"""
test_reliability_requests.py — issue 15, items 2, 4 and 6, with raw requests:

2. A second Authorization, X-Sluice-Signature, X-Sluice-Nonce,
   X-Sluice-Timestamp, Idempotency-Key or X-Request-Id is refused with 400
   (a proxy in front that reads the last one would see other credentials),
   and nothing reaches the upstream.
4. Optional whitespace is SP or HTAB on both sides of every value, the
   framing headers included; any other byte still fails closed.
6. After an early error (431, 413) with request bytes unread, sluice shuts
   its write side and drains input for a bounded time, so the client reads
   the error instead of a reset.
"""

import json
import socket
import time

import pytest

import helpers
from helpers import bound, raw_exchange

BODY = json.dumps({"model": "chat-model", "messages": [{"role": "user", "content": "ows"}]}).encode()
POST = b"POST /v1/chat/completions HTTP/1.1\r\nHost: sluice.test\r\nContent-Type: application/json\r\n"
CL = b"Content-Length: %d\r\n" % len(BODY)

DUPS = [
    ("authorization", b"Authorization: Bearer a\r\nAuthorization: Bearer b\r\n"),
    ("authorization_case", b"Authorization: Bearer a\r\nauthorization: Bearer a\r\n"),
    ("signature", b"X-Sluice-Signature: a\r\nX-Sluice-Signature: b\r\n"),
    ("nonce", b"X-Sluice-Nonce: n1\r\nX-Other: 1\r\nX-Sluice-Nonce: n2\r\n"),
    ("timestamp", b"X-Sluice-Timestamp: 1\r\nX-Sluice-Timestamp: 2\r\n"),
    ("idempotency_key", b"Idempotency-Key: k1\r\nIdempotency-Key: k2\r\n"),
    ("request_id", b"X-Request-Id: r1\r\nX-Request-Id: r2\r\n"),
]


@pytest.mark.parametrize("name,hdrs", DUPS, ids=[d[0] for d in DUPS])
def test_duplicate_credential_header_is_400(sluice, mock, name, hdrs):
    res = raw_exchange(sluice.host, sluice.port, POST + hdrs + CL + b"\r\n" + BODY, timeout=bound(5))
    assert res.data, "no answer"
    r = res.response()
    helpers.assert_error(r, 400, "bad_request", "invalid_request_error")
    assert "duplicate_header" in r.json()["error"]["message"]
    assert res.closed
    assert mock.requests() == [] and mock.bytes_received() == 0


OWS_OK = [
    ("cl_tabs", b"Content-Length: \t%d\t\r\n" % len(BODY), BODY),
    ("cl_tab_space_mix", b"Content-Length:\t %d \t\r\n" % len(BODY), BODY),
    ("te_trailing_tab", b"Transfer-Encoding: chunked\t\r\n", b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)),
    ("te_leading_tab", b"Transfer-Encoding:\tchunked\r\n", b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)),
    ("te_trailing_space", b"Transfer-Encoding: chunked \r\n", b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)),
]


@pytest.mark.parametrize("name,hdr,body", OWS_OK, ids=[o[0] for o in OWS_OK])
def test_ows_sp_and_htab_on_both_sides(sluice, mock, name, hdr, body):
    res = raw_exchange(
        sluice.host, sluice.port, POST + hdr + b"Connection: close\r\n\r\n" + body, timeout=bound(5)
    )
    r = res.response()
    assert r.status == 200, (r.status, r.body[:200])
    assert r.json()["choices"][0]["message"]["content"] == "echo: ows"
    assert json.loads(mock.requests()[0]["body"])["messages"] == json.loads(BODY)["messages"]


OWS_BAD = [
    ("cl_vtab", b"Content-Length: \x0b%d\r\n" % len(BODY), BODY),
    ("cl_formfeed", b"Content-Length: %d\x0c\r\n" % len(BODY), BODY),
    ("cl_nbsp", b"Content-Length: \xa0%d\r\n" % len(BODY), BODY),
    ("cl_inner_tab", b"Content-Length: 1\t%d\r\n" % len(BODY), BODY),
    ("te_vtab", b"Transfer-Encoding: chunked\x0b\r\n", b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)),
]


@pytest.mark.parametrize("name,hdr,body", OWS_BAD, ids=[o[0] for o in OWS_BAD])
def test_other_whitespace_fails_closed(sluice, mock, name, hdr, body):
    res = raw_exchange(sluice.host, sluice.port, POST + hdr + b"\r\n" + body, timeout=bound(5))
    r = res.response()
    assert r.status in (400, 501), (r.status, r.body[:200])
    assert res.closed
    assert mock.requests() == []


def _early_error_exchange(sluice, head, body_bytes):
    """Sends head + body_bytes in one go (a client that does not wait for
    100 Continue), then reads until EOF."""
    return raw_exchange(sluice.host, sluice.port, head + b"x" * body_bytes, timeout=bound(8))


LINGER = [
    ("413_content_length", POST + b"Content-Length: %d\r\n\r\n" % (2 << 20), 2 << 20, 413, "request_too_large"),
    ("431_header", POST + b"X-Big: " + b"b" * 17000 + b"\r\nContent-Length: 400000\r\n\r\n", 400000, 431, "headers_too_large"),
]


@pytest.mark.parametrize("name,head,nbody,status,code", LINGER, ids=[x[0] for x in LINGER])
def test_early_error_is_read_by_the_client_not_reset(sluice, mock, name, head, nbody, status, code):
    res = _early_error_exchange(sluice, head, nbody)
    assert not res.reset, "the client got a reset (%d bytes of answer read)" % len(res.data)
    assert res.closed
    r = res.response()
    helpers.assert_error(r, status, code, "invalid_request_error")
    assert mock.requests() == []


def test_lingering_is_bounded_in_time(sluice, mock):
    """A client that keeps sending after the error is cut after the
    lingering time (2 s), not served for ever."""
    s = socket.create_connection((sluice.host, sluice.port), timeout=bound(10))
    try:
        s.sendall(POST + b"Content-Length: %d\r\n\r\n" % (64 << 20))
        t0 = time.monotonic()
        got = b""
        s.setblocking(False)
        end = t0 + bound(10)
        closed_at = None
        while time.monotonic() < end:
            try:
                s.send(b"y" * 16384)
            except BlockingIOError:
                pass
            except (BrokenPipeError, ConnectionResetError):
                closed_at = time.monotonic()
                break
            try:
                b = s.recv(65536)
                if not b:
                    pass  # our read side ended: the answer is complete
                got += b
            except BlockingIOError:
                pass
            except ConnectionResetError:
                closed_at = time.monotonic()
                break
            # pacing the writer, not synchronising: 16 KiB per ms at most
            time.sleep(0.001)
        assert closed_at is not None, "still accepted bytes after %.1f s" % (time.monotonic() - t0)
        assert closed_at - t0 < bound(4), closed_at - t0
        assert got.startswith(b"HTTP/1.1 413"), got[:100]
    finally:
        s.close()
