"""
test_core_edge_reads.py — reads that an edge-triggered reader gets wrong.
Sockets are registered level-triggered (docs/gateway.md, "How the loop
registers sockets"); an EV_ET read event (tried on branch etpoll, not kept)
is reported once per arrival, so a reader that stops before the kernel's
queue is empty, or that reads the data of a segment carrying a FIN and not
the FIN, waits for an edge that never comes. Each test ends by a time bound
far below the timeout that would otherwise end it (body 30 s, upstream
total 60 s, keep-alive 60 s); on that branch each failed on a build
without the rule it checks (the client ones with the read event EV_ET, the
upstream one with the upstream's too).
"""

import json
import socket
import threading
import time

from helpers import bound, chat_body

CHAT = "/v1/chat/completions"


def req(body, extra=b""):
    return (b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%s"
            b"Content-Length: %d\r\n\r\n%s" % (CHAT.encode(), extra, len(body), body))


def test_pipelined_bodies_larger_than_a_read_in_one_write(sluice, mock):
    """Three requests of ~40 KiB (a read takes at most 16 KiB) in one
    write: the reader goes on after every read that filled its space, or
    the last bytes wait in the kernel until the body timeout (30 s)."""
    bodies = [json.dumps(chat_body("r%d" % i, pad=("%d" % i) * 40_000)).encode() for i in range(3)]
    t0 = time.monotonic()
    with sluice.client(timeout=bound(10)) as c:
        c.send(b"".join(req(b) for b in bodies))
        rs = [c.read_response() for _ in bodies]
    took = time.monotonic() - t0
    assert [r.status for r in rs] == [200, 200, 200], rs
    assert [r.json()["choices"][0]["message"]["content"] for r in rs] == ["echo: r0", "echo: r1", "echo: r2"]
    assert [json.loads(q["body"])["pad"] for q in mock.requests()] == [("%d" % i) * 40_000 for i in range(3)]
    assert took < bound(5), took


def one_segment(sock, data):
    """data and a FIN in one TCP segment: corked, the FIN rides on the
    queued data (tcp_send_fin), so both arrive in one wake-up."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
    sock.sendall(data)
    sock.shutdown(socket.SHUT_WR)


def test_request_and_fin_in_one_segment(sluice, mock):
    """A request and the client's FIN in one segment: the EOF is seen (a
    client gone before its answer: the request is dropped and the
    connection closed at once, as before), not left in the kernel while the
    answer is sent and the connection idles to the keep-alive timeout."""
    body = json.dumps(chat_body("fin")).encode()
    s = socket.create_connection((sluice.host, sluice.port), timeout=bound(10))
    try:
        t0 = time.monotonic()
        one_segment(s, req(body))
        got = b""
        while True:
            b = s.recv(65536)
            if not b:
                break
            got += b
        took = time.monotonic() - t0
    finally:
        s.close()
    assert got == b"", got[:200]
    assert took < bound(3), took


def test_upstream_close_delimited_answer_with_its_fin(sluice_factory):
    """An upstream connection kept alive for a first answer; the second
    answer is HTTP/1.0, its body ending at the EOF, and the server writes
    it and its FIN in one segment. Answered in full at once, not when the
    upstream total timeout (60 s) cuts it."""

    def answer(text):
        return json.dumps({"id": "c1", "object": "chat.completion", "created": 0, "model": "m",
                           "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                        "finish_reason": "stop"}]}).encode()

    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(8)
    served = []

    def read_request(c, got):
        while b"\r\n\r\n" not in got:
            b = c.recv(65536)
            if not b:
                return None, b""
            got += b
        head, _, rest = got.partition(b"\r\n\r\n")
        n = int([ln.split(b":")[1] for ln in head.split(b"\r\n")
                 if ln.lower().startswith(b"content-length:")][0])
        while len(rest) < n:
            rest += c.recv(65536)
        return rest[:n], rest[n:]

    def serve():
        while True:
            try:
                c, _ = lsock.accept()
            except OSError:
                return
            with c:
                left = b""
                while True:
                    body, left = read_request(c, left)
                    if body is None:
                        break
                    served.append(body)
                    if len(served) == 1:
                        a = answer("first")
                        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                  b"Content-Length: %d\r\n\r\n%s" % (len(a), a))
                        continue
                    one_segment(c, b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n"
                                + answer("bye"))
                    break

    threading.Thread(target=serve, daemon=True).start()
    url = "http://127.0.0.1:%d" % lsock.getsockname()[1]
    try:
        s = sluice_factory({"workers": 1}, upstream=url)
        r1 = s.chat("one")
        t0 = time.monotonic()
        r2 = s.chat("two")
        took = time.monotonic() - t0
    finally:
        lsock.close()
    assert r1.status == 200 and r1.json()["choices"][0]["message"]["content"] == "first", r1
    assert r2.status == 200, r2
    assert r2.json()["choices"][0]["message"]["content"] == "bye"
    assert len(served) == 2, served  # the second on the kept connection
    assert took < bound(3), took
