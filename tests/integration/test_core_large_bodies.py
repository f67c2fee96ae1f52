"""
test_core_large_bodies.py — request bodies past 16 KiB (issue 21.3): they
land in one block (gateway/body_store.c), are spliced by reference (the
alias's model) and shared with the upstream's output buffer, not copied.
What must hold: the upstream gets the client's bytes with only the splice
changed, at every size and however the body arrives (one write, many small
pieces, chunked); a retry resends the same bytes after the first attempt's
buffer is gone; a body cut short or refused costs nothing after it (the next
request on a new connection is served), and ASan sees no leak or misuse.
"""

import json
import socket
import time

import fallback_helpers as fh
import helpers
from helpers import bound

CHAT = "/v1/chat/completions"
SIZES = (20 * 1024, 300 * 1024, 2 * 1024 * 1024 + 17)


def big_body(n, model="chat-model", seed="The sea is vast and so calm. "):
    """A chat body of exactly n bytes (compact JSON), its user message long."""
    head = {"model": model, "max_tokens": 16, "temperature": 0.5,
            "messages": [{"role": "system", "content": "be brief"},
                         {"role": "user", "content": ""}]}
    empty = len(json.dumps(head, separators=(",", ":")).encode())
    text = (seed * (n // len(seed) + 1))[: n - empty]
    head["messages"][1]["content"] = text
    b = json.dumps(head, separators=(",", ":")).encode()
    assert len(b) == n
    return b


def served(b):
    """What the upstream must receive: the alias spliced, nothing else."""
    out = b.replace(b'"model":"chat-model"', b'"model":"Qwen2.5-7B-Instruct"', 1)
    assert out != b
    return out


def conf_over(**more):
    over = {"limits": {"max_body_bytes": "8m"}, "filters": {"input": {"max_chars": 0}}}
    return helpers.deep_merge(over, more)


def test_bodies_go_upstream_byte_for_byte(sluice_factory, mock):
    s = sluice_factory(overrides=conf_over(), upstream=mock)
    for n in SIZES:
        mock.reset()
        b = big_body(n)
        r = s.request("POST", CHAT, b, timeout=bound(20))
        assert r.status == 200, (n, r)
        reqs = mock.requests()
        assert len(reqs) == 1
        got = reqs[0]["body"].encode()
        assert len(got) == len(served(b)), n
        assert got == served(b), "the body changed beyond the splice (%d bytes)" % n
        assert helpers.header_values(reqs[0]["headers"], "content-length") == [str(len(got))]


def test_unaliased_body_is_not_rewritten(sluice_factory, mock):
    s = sluice_factory(overrides=conf_over(), upstream=mock)
    b = big_body(300 * 1024, model="plain-model")
    r = s.request("POST", CHAT, b, timeout=bound(20))
    assert r.status == 200, r
    assert mock.requests()[0]["body"].encode() == b


def test_body_in_small_pieces_and_chunked(sluice_factory, mock):
    s = sluice_factory(overrides=conf_over(), upstream=mock)
    b = big_body(200 * 1024 + 3)
    # Content-Length, the body in 1,000-byte writes with pauses: the block
    # fills over many reads
    head = ("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Content-Length: %d\r\n\r\n" % (CHAT, len(b))).encode()
    with s.client(timeout=bound(20)) as c:
        c.send(head)
        for i in range(0, len(b), 1000):
            c.send(b[i:i + 1000])
            if i % 50000 == 0:
                time.sleep(0.01)  # separate reads, not synchronisation
        r = c.read_response()
    assert r.status == 200, r
    # chunked: no declared length, the evbuffer path
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(b[i:i + 7000]), b[i:i + 7000])
                      for i in range(0, len(b), 7000)) + b"0\r\n\r\n"
    head = ("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n" % CHAT).encode()
    with s.client(timeout=bound(20)) as c:
        c.send(head + chunks)
        r2 = c.read_response()
    assert r2.status == 200, r2
    reqs = mock.requests()
    assert [q["body"].encode() for q in reqs] == [served(b), served(b)]


def test_retry_resends_the_same_large_body(sluice_factory, mock):
    over = conf_over(**fh.chain(retry={"attempts": 2, "backoff": "10ms",
                                       "budget_percent": 100, "budget_min": 100},
                                template=False))
    s = sluice_factory(overrides=over, upstream=mock)
    for n in (300 * 1024, 2 * 1024 * 1024):
        mock.reset()
        mock.script({"status": 503}, {"status": 502})
        b = big_body(n)
        r = s.request("POST", CHAT, b, timeout=bound(30))
        assert r.status == 200, r
        reqs = mock.requests()
        assert [q["status"] for q in reqs] == [503, 502, 200]
        for q in reqs:
            assert q["body"].encode() == served(b), "attempt %d sent other bytes" % q["id"]


def test_invalid_large_body_is_a_json_error(sluice_factory, mock):
    s = sluice_factory(overrides=conf_over(), upstream=mock)
    b = big_body(100 * 1024)
    for bad in (b[:-1],                       # cut: not a whole document
                b[:50000] + b"\xff" + b[50001:],  # invalid UTF-8 inside the long string
                b.replace(b'"temperature"', b'"max_tokens"', 1)):  # duplicate key
        r = s.request("POST", CHAT, bad, timeout=bound(20))
        helpers.assert_error(r, 400, "invalid_json", "invalid_request_error")
    assert mock.requests() == []


def test_body_cut_short_then_served(sluice_factory, mock):
    s = sluice_factory(overrides=conf_over(limits={"body_timeout": "500ms"}), upstream=mock)
    b = big_body(500 * 1024)
    head = ("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Content-Length: %d\r\n\r\n" % (CHAT, len(b))).encode()
    for _ in range(3):  # the client leaves half way: its block goes back
        c = socket.create_connection((s.host, s.port), timeout=bound(5))
        c.sendall(head + b[: len(b) // 2])
        c.close()
    # one that stalls until the body deadline (408, its block freed)
    with s.client(timeout=bound(10)) as c:
        c.send(head + b[:1000])
        r = c.read_response()
    assert r.status == 408, r
    r = s.request("POST", CHAT, b, timeout=bound(20))
    assert r.status == 200, r
    assert [q["body"].encode() for q in mock.requests()] == [served(b)]


def test_pipelined_request_after_a_large_body(sluice_factory, mock):
    # The body is read straight from the socket (conn.c): never past its
    # end, so the request behind it in the same write is answered too.
    s = sluice_factory(overrides=conf_over(), upstream=mock)
    b = big_body(400 * 1024)
    small = json.dumps(helpers.chat_body("second", max_tokens=16), separators=(",", ":")).encode()
    req = lambda body: ("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"  # noqa: E731
                        "Content-Length: %d\r\n\r\n" % (CHAT, len(body))).encode() + body
    with s.client(timeout=bound(20)) as c:
        c.send(req(b) + req(small) + req(b))
        rs = [c.read_response() for _ in range(3)]
    assert [r.status for r in rs] == [200, 200, 200], rs
    bodies = [q["body"].encode() for q in mock.requests()]
    assert bodies == [served(b), served(small), served(b)]


def store_bytes(s, state):
    return s.metrics().value("sluice_body_store_bytes", state=state)


def test_slow_bodies_hold_what_they_sent(sluice_factory, mock):
    # Clients that declare 8 MiB and send 100 KiB hold blocks of about what
    # they sent (body_store.c grows a block with the bytes), not 8 MiB each;
    # two of them then finish and go upstream byte for byte, the others
    # leave and everything they held comes back.
    s = sluice_factory(overrides=conf_over(), upstream=mock)
    n, sent = 40, 100 * 1024
    b = big_body(8 * 1024 * 1024)
    head = ("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Content-Length: %d\r\n\r\n" % (CHAT, len(b))).encode()
    assert store_bytes(s, "held") == 0
    socks = []
    try:
        for _ in range(n):
            c = socket.create_connection((s.host, s.port), timeout=bound(10))
            c.sendall(head + b[:sent])
            socks.append(c)
        # read by sluice: each block holds at least what its client sent
        helpers.wait_until(lambda: store_bytes(s, "held") >= n * sent, timeout=bound(10),
                           what="the slow bodies read")
        held = store_bytes(s, "held")
        assert held <= n * 128 * 1024, "%d bytes held for %d bodies of %d bytes sent" % (held, n, sent)
        for c in socks[:2]:  # two finish: their blocks grow to 8 MiB as the rest comes
            c.sendall(b[sent:])
        for c in socks[:2]:
            c.settimeout(bound(20))
            got = b""
            while b"\r\n\r\n" not in got:
                got += c.recv(65536)
            assert got.startswith(b"HTTP/1.1 200"), got[:200]
    finally:
        for c in socks:
            c.close()
    assert [q["body"].encode() for q in mock.requests()] == [served(b), served(b)]
    helpers.wait_until(lambda: store_bytes(s, "held") == 0, timeout=bound(10),
                       what="the blocks given back")
    assert store_bytes(s, "idle") <= 8 * 1024 * 1024  # the cache's bound
