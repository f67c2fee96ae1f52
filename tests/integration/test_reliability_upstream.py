"""
test_reliability_upstream.py — issue 15, items 1 and 5: what sluice commits
to the client and what it puts back in the upstream pool.

1. A non-streamed answer is committed only once whole and validly framed:
   a 200 head followed by bad chunking, a short Content-Length body or a
   reset is an ordinary failure (a clean 502 here, retry and the fallback
   tiers elsewhere), not a 200 with a cut body. An answer above the hold
   limit (2 MiB) still arrives whole.
5. An upstream connection goes back to the pool only when the request was
   written whole and the answer read whole: a server that answers before
   reading the request body must not get the next client's request on it.
"""

import json
import socket
import threading
import time

import pytest

from helpers import assert_error, bound, chat_body

JSON_HEAD = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"

BROKEN = [
    ("bad_chunk_size", JSON_HEAD + "Transfer-Encoding: chunked\r\n\r\nzz\r\n", False),
    ("chunked_cut", JSON_HEAD + 'Transfer-Encoding: chunked\r\n\r\n20\r\n{"id":"x",', False),
    ("short_content_length", JSON_HEAD + 'Content-Length: 100\r\n\r\n{"id":"x",', False),
    ("reset_after_head", JSON_HEAD + "Content-Length: 100\r\n\r\n", True),
    ("bad_chunk_after_data", JSON_HEAD + 'Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\nzz\r\n', False),
]


@pytest.mark.parametrize("name,raw,rst", BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_answer_after_200_head_is_a_clean_502(sluice, mock, name, raw, rst):
    mock.script({"raw_response": raw, "cut_rst": rst})
    r = sluice.chat("broken")
    assert_error(r, 502, "upstream_error", "server_error")
    # the connection to the client is still good for the next request
    ok = sluice.chat("after")
    assert ok.status == 200
    assert ok.json()["choices"][0]["message"]["content"] == "echo: after"


def test_body_cut_mid_answer_is_a_502(sluice, mock):
    mock.script({"cut_after": 1})
    assert_error(sluice.chat("cut"), 502, "upstream_error", "server_error")


@pytest.mark.parametrize("beh", [
    {"cut_after": 1},
    {"raw_response": JSON_HEAD + "Transfer-Encoding: chunked\r\n\r\nzz\r\n"},
], ids=["cut", "bad_chunk"])
def test_broken_held_answer_is_retried(sluice_factory, mock, beh):
    retry = {"attempts": 1, "backoff": "10ms", "budget_percent": 100, "budget_min": 100}
    s = sluice_factory({"fallback": {"retry": retry}}, upstream=mock)
    mock.script(beh)
    r = s.chat("again")
    assert r.status == 200, (r.status, r.body[:200])
    assert r.json()["choices"][0]["message"]["content"] == "echo: again"
    assert len(mock.requests()) == 2


def test_cut_answer_goes_to_the_template_tier(sluice_factory, mock):
    s = sluice_factory({"fallback": {"template": {"enabled": True}}}, upstream=mock)
    mock.script({"cut_after": 1})
    r = s.chat("cut")
    # not the upstream's 200 with half a body: the chain answered instead
    body = r.json()
    assert r.header("X-Sluice-Fallback") or "error" in body, (r.status, body)
    if "error" not in body:
        assert body["choices"][0]["message"]["content"]


def test_answer_above_the_hold_limit_arrives_whole(sluice_factory, mock):
    s = sluice_factory({"limits": {"max_body_bytes": 8 << 20}}, upstream=mock)
    text = "y" * (3 << 20)
    mock.script({"text": text})
    r = s.chat("big")
    assert r.status == 200
    assert r.json()["choices"][0]["message"]["content"] == text


class EarlyAnswerUpstream:
    """A raw-socket upstream that answers a large request before reading
    its body, then never reads that connection again (a server that
    rejects early and keeps the connection). Small requests are read whole
    and answered. Records per connection what it received."""

    def __init__(self):
        self.lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # small receive buffers, so the unread body stays in sluice
        self.lst.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.lst.bind(("127.0.0.1", 0))
        self.lst.listen(16)
        self.port = self.lst.getsockname()[1]
        self.conns = []  # per connection: list of (path, content_length)
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.socks = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stop.is_set():
            try:
                c, _ = self.lst.accept()
            except OSError:
                return
            with self.lock:
                rec = []
                self.conns.append(rec)
                self.socks.append(c)
            threading.Thread(target=self._serve, args=(c, rec), daemon=True).start()

    def _serve(self, c, rec):
        buf = b""
        try:
            while not self.stop.is_set():
                while b"\r\n\r\n" not in buf:
                    b = c.recv(65536)
                    if not b:
                        return
                    buf += b
                head, buf = buf.split(b"\r\n\r\n", 1)
                lines = head.split(b"\r\n")
                path = lines[0].split(b" ")[1].decode()
                cl = 0
                for ln in lines[1:]:
                    k, _, v = ln.partition(b":")
                    if k.strip().lower() == b"content-length":
                        cl = int(v.strip())
                with self.lock:
                    rec.append((path, cl))
                body = json.dumps({"id": "x", "object": "chat.completion", "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "early %d" % cl},
                     "finish_reason": "stop"}]}).encode()
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                          b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                if cl > 65536:
                    self.stop.wait()  # never reads this connection again
                    return
                while len(buf) < cl:
                    b = c.recv(65536)
                    if not b:
                        return
                    buf += b
                buf = buf[cl:]
        except OSError:
            return

    def close(self):
        self.stop.set()
        self.lst.close()
        with self.lock:
            for c in self.socks:
                c.close()


def test_connection_answered_before_the_request_was_written_is_not_pooled(sluice_factory):
    up = EarlyAnswerUpstream()
    try:
        s = sluice_factory(
            {
                "workers": 1,
                "limits": {"max_body_bytes": 16 << 20},
                "upstreams": {"main": {"timeouts": {"first_byte": "2s"}}},
            },
            upstream="http://127.0.0.1:%d" % up.port,
        )
        big = chat_body("big one", pad="z" * (6 << 20))
        r = s.request("POST", "/v1/chat/completions", body=big, timeout=bound(20))
        assert r.status == 200
        assert r.json()["choices"][0]["message"]["content"].startswith("early ")
        t0 = time.monotonic()
        r2 = s.chat("small one")
        took = time.monotonic() - t0
        # Before the fix the small request went out behind the unsent rest
        # of the big body on the pooled connection: never answered (504).
        assert r2.status == 200, (r2.status, r2.body[:200])
        assert took < bound(1.5), took
        with up.lock:
            conns = [list(c) for c in up.conns]
        assert len(conns) == 2, conns
        assert conns[1][0][1] < 65536, conns  # the small request, on a new connection
    finally:
        up.close()
