"""
test_core_malformed.py — request smuggling shapes and size limits (issue 2,
part 8): each malformed request gets its 4xx as an OpenAI-style JSON error,
the connection is closed, the upstream receives zero bytes, and the next
connection is served. Requests just under each limit pass.
"""

import json

import pytest

import helpers
from helpers import bound, raw_exchange

BODY = json.dumps({"model": "chat-model", "messages": [{"role": "user", "content": "x"}]}).encode()
CL = b"Content-Length: %d\r\n" % len(BODY)
POST = b"POST /v1/chat/completions HTTP/1.1\r\n"
HOST = b"Host: sluice.test\r\n"
CT = b"Content-Type: application/json\r\n"


def chunked(body, size_line=None):
    first = size_line if size_line is not None else b"%x" % len(body)
    return first + b"\r\n" + body + b"\r\n0\r\n\r\n"


TE = b"Transfer-Encoding: chunked\r\n"

# (id, bytes, status or (statuses), error code or None when not specified)
CASES = [
    ("cl_and_te", POST + HOST + CT + CL + TE + b"\r\n" + chunked(BODY), 400, "bad_request"),
    ("te_and_cl", POST + HOST + CT + TE + CL + b"\r\n" + chunked(BODY), 400, "bad_request"),
    ("two_cl_same", POST + HOST + CT + CL + CL + b"\r\n" + BODY, 400, "bad_request"),
    ("two_cl_differ", POST + HOST + CT + CL + b"Content-Length: 3\r\n\r\n" + BODY, 400, "bad_request"),
    ("cl_list", POST + HOST + CT + b"Content-Length: %d, %d\r\n\r\n" % (len(BODY), len(BODY)) + BODY, 400, "bad_request"),
    ("cl_plus", POST + HOST + CT + b"Content-Length: +%d\r\n\r\n" % len(BODY) + BODY, 400, "bad_request"),
    ("cl_not_digits", POST + HOST + CT + b"Content-Length: 3x\r\n\r\n" + BODY, 400, "bad_request"),
    ("chunk_size_0x", POST + HOST + CT + TE + b"\r\n" + chunked(BODY, b"0x%x" % len(BODY)), 400, "bad_request"),
    ("chunk_size_plus", POST + HOST + CT + TE + b"\r\n" + chunked(BODY, b"+%x" % len(BODY)), 400, "bad_request"),
    ("chunk_size_space", POST + HOST + CT + TE + b"\r\n" + chunked(BODY, b" %x" % len(BODY)), 400, "bad_request"),
    ("chunk_size_overflow", POST + HOST + CT + TE + b"\r\n" + chunked(BODY, b"1" + b"0" * 20), (400, 413), None),
    ("te_chunked_twice", POST + HOST + CT + b"Transfer-Encoding: chunked, chunked\r\n\r\n" + chunked(BODY), 400, "bad_request"),
    ("te_unknown", POST + HOST + CT + b"Transfer-Encoding: gzip\r\n\r\n" + BODY, (400, 501), None),
    ("obs_fold", POST + HOST + CT + b"X-Folded: a\r\n  b\r\n" + CL + b"\r\n" + BODY, 400, "bad_request"),
    ("obs_fold_tab", POST + HOST + CT + b"X-Folded: a\r\n\tb\r\n" + CL + b"\r\n" + BODY, 400, "bad_request"),
    ("bare_cr_in_value", POST + HOST + CT + b"X-A: 1\r2\r\n" + CL + b"\r\n" + BODY, 400, "bad_request"),
    ("bare_cr_line_end", POST + HOST + CT + b"X-A: 1\rX-B: 2\r\n" + CL + b"\r\n" + BODY, 400, "bad_request"),
    ("bare_lf_header", POST + HOST + CT + b"X-A: 1\nX-B: 2\r\n" + CL + b"\r\n" + BODY, 400, "bad_request"),
    ("bare_lf_request_line", b"POST /v1/chat/completions HTTP/1.1\n" + HOST + CT + CL + b"\r\n" + BODY, 400, "bad_request"),
    ("bare_lf_everywhere", (POST + HOST + CT + CL + b"\r\n").replace(b"\r\n", b"\n") + BODY, 400, "bad_request"),
    ("missing_host", POST + CT + CL + b"\r\n" + BODY, 400, "bad_request"),
    ("double_host", POST + HOST + HOST + CT + CL + b"\r\n" + BODY, 400, "bad_request"),
    ("double_host_differ", POST + HOST + b"Host: evil.test\r\n" + CT + CL + b"\r\n" + BODY, 400, "bad_request"),
    ("space_before_colon", POST + b"Host : sluice.test\r\n" + CT + CL + b"\r\n" + BODY, 400, "bad_request"),
    ("nul_in_value", POST + HOST + CT + b"X-A: a\0b\r\n" + CL + b"\r\n" + BODY, 400, "bad_request"),
    ("absolute_form", b"POST http://sluice.test/v1/chat/completions HTTP/1.1\r\n" + HOST + CT + CL + b"\r\n" + BODY, 400, "bad_request"),
    ("bad_method_token", b"P@ST /v1/chat/completions HTTP/1.1\r\n" + HOST + CT + CL + b"\r\n" + BODY, (400, 501), None),
    ("http_2_0", b"POST /v1/chat/completions HTTP/2.0\r\n" + HOST + CT + CL + b"\r\n" + BODY, (400, 505), None),
    ("uri_too_long", b"POST /v1/chat/completions?pad=" + b"a" * 9000 + b" HTTP/1.1\r\n" + HOST + CT + CL + b"\r\n" + BODY, 414, "uri_too_long"),
    ("header_too_large", POST + HOST + CT + b"X-Big: " + b"b" * 17000 + b"\r\n" + CL + b"\r\n" + BODY, 431, "headers_too_large"),
    ("headers_too_large_sum", POST + HOST + CT + b"".join(b"X-Pad-%d: %s\r\n" % (i, b"p" * 900) for i in range(20)) + CL + b"\r\n" + BODY, 431, "headers_too_large"),
    ("too_many_header_lines", POST + HOST + CT + b"".join(b"X-L-%d: v\r\n" % i for i in range(101)) + CL + b"\r\n" + BODY, 431, "headers_too_large"),
    ("body_too_large_cl", POST + HOST + CT + b"Content-Length: %d\r\n\r\n" % (1024 * 1024 + 1), 413, "request_too_large"),
]


def _check_rejected(sluice, mock, res, status, code):
    assert res.data, "no answer at all (closed=%s)" % res.closed
    r = res.response()
    statuses = status if isinstance(status, tuple) else (status,)
    assert r.status in statuses, "got %d, want %s: %r" % (r.status, statuses, r.body[:200])
    if code is not None:
        helpers.assert_error(r, r.status, code, "invalid_request_error")
    else:
        e = r.json()["error"]
        assert e["message"] and "type" in e and "code" in e
    assert res.closed, "connection left open after %d" % r.status
    assert r.rest == b"", "more bytes after the error answer: %r" % r.rest[:100]
    # the upstream got nothing at all
    assert mock.requests() == []
    assert mock.bytes_received() == 0
    # and the next connection is served
    ok = sluice.chat("next one")
    assert ok.status == 200 and ok.json()["choices"][0]["message"]["content"] == "echo: next one"


@pytest.mark.parametrize("name,raw,status,code", CASES, ids=[c[0] for c in CASES])
def test_malformed_request_rejected(sluice, mock, name, raw, status, code):
    res = raw_exchange(sluice.host, sluice.port, raw, timeout=bound(5))
    _check_rejected(sluice, mock, res, status, code)


def test_chunked_body_over_limit_413(sluice_factory, mock):
    s = sluice_factory({"limits": {"max_body_bytes": "4k"}})
    body = (b"400\r\n" + b"y" * 1024 + b"\r\n") * 5  # 5 KiB, over the 4 KiB limit
    raw = POST + HOST + CT + TE + b"\r\n" + body + b"0\r\n\r\n"
    res = raw_exchange(s.host, s.port, raw, timeout=bound(5))
    _check_rejected(s, mock, res, 413, "request_too_large")


def test_content_length_over_limit_413_before_the_body(sluice_factory, mock):
    s = sluice_factory({"limits": {"max_body_bytes": "4k"}})
    # Only the head is sent: the answer must not wait for a body it will refuse.
    raw = POST + HOST + CT + b"Content-Length: 5000\r\n\r\n"
    res = raw_exchange(s.host, s.port, raw, timeout=bound(3))
    _check_rejected(s, mock, res, 413, "request_too_large")


def test_conf_limits_apply(sluice_factory, mock):
    s = sluice_factory({"limits": {"request_line_bytes": 512, "header_bytes": "2k", "header_lines": 10}})
    cases = [
        (b"GET /v1/models?" + b"q" * 600 + b" HTTP/1.1\r\n" + HOST + b"\r\n", 414),
        (b"GET /v1/models HTTP/1.1\r\n" + HOST + b"X-Big: " + b"b" * 2100 + b"\r\n\r\n", 431),
        (b"GET /v1/models HTTP/1.1\r\n" + HOST + b"".join(b"X-%d: v\r\n" % i for i in range(12)) + b"\r\n", 431),
    ]
    for raw, status in cases:
        res = raw_exchange(s.host, s.port, raw, timeout=bound(5))
        assert res.closed and res.response().status == status, (status, res)
    ok = b"GET /v1/models?" + b"q" * 400 + b" HTTP/1.1\r\n" + HOST + b"".join(b"X-%d: v\r\n" % i for i in range(6)) + b"\r\n"
    res = raw_exchange(s.host, s.port, ok + b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", timeout=bound(5))
    assert res.response().status == 200


def test_just_under_default_limits_pass(sluice, mock):
    # request line ~7.9 KiB of the 8 KiB default
    r = sluice.request("GET", "/v1/models?pad=" + "a" * 7800)
    assert r.status == 200
    # ~15 KiB of headers in 90 lines (of 16 KiB / 100)
    hdrs = [("X-Pad-%d" % i, "p" * 160) for i in range(88)]
    r = sluice.chat("big head", headers=hdrs)
    assert r.status == 200, r
    # a body just under 1 MiB (padding outside the messages: a user message
    # that long would meet filters.input.max_chars, 8000 by default)
    pad = "z" * (1024 * 1024 - 1024)
    r = sluice.request("POST", "/v1/chat/completions", helpers.chat_body("hi", metadata={"pad": pad}))
    assert r.status == 200
    assert mock.requests()[-1]["json"]["metadata"]["pad"] == pad
