#!/usr/bin/python3
"""
h2_ttfe.py — time to first SSE event, for bench/h2_bench.sh: on one warm
connection per target, interleaved samples of "request written -> first
DATA frame (h2) / first 'data:' bytes (h1) of the answer", in microseconds.

    h2_ttfe.py SAMPLES BODYFILE direct=http://127.0.0.1:P/path \
               nginx=https://127.0.0.1:Q/path sluice=https://127.0.0.1:R/path

A target with an https URL is spoken to as h2 over TLS (ALPN h2, raw frames
from tests/integration/h2raw.py); an http URL as HTTP/1.1 keep-alive. Prints
one line per target: "NAME median_us p90_us".
"""

import socket
import ssl
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration"))
import h2raw  # noqa: E402


class H1:
    def __init__(self, url, body):
        u = urlsplit(url)
        self.s = socket.create_connection((u.hostname, u.port), timeout=10)
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.req = (
            "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
            "Content-Length: %d\r\n\r\n" % (u.path, u.netloc, len(body))
        ).encode() + body

    def once(self):
        t0 = time.perf_counter()
        self.s.sendall(self.req)
        buf = b""
        t1 = None
        while True:
            d = self.s.recv(65536)
            if not d:
                raise RuntimeError("closed")
            if t1 is None and b"data:" in buf + d:
                t1 = time.perf_counter()
            buf += d
            if b"data: [DONE]" in buf and buf.endswith(b"0\r\n\r\n"):
                return (t1 - t0) * 1e6


class H2:
    def __init__(self, url, body):
        u = urlsplit(url)
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.set_alpn_protocols(["h2"])
        raw = socket.create_connection((u.hostname, u.port), timeout=10)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s = ctx.wrap_socket(raw, server_hostname="localhost")
        assert s.selected_alpn_protocol() == "h2", url
        self.c = h2raw.H2Conn.__new__(h2raw.H2Conn)
        self.c.s, self.c.buf = s, b""
        self.c.send(h2raw.PREFACE + h2raw.frame(h2raw.SETTINGS, 0, 0))
        self.hdrs = h2raw.req_headers("POST", u.path, extra=[("content-type", "application/json")])
        self.body = body
        self.sid = 1

    def once(self):
        sid, self.sid = self.sid, self.sid + 2
        t0 = time.perf_counter()
        self.c.send(
            h2raw.frame(h2raw.HEADERS, h2raw.END_HEADERS, sid, h2raw.hpack(self.hdrs))
            + h2raw.frame(h2raw.DATA, h2raw.END_STREAM, sid, self.body)
        )
        t1 = None
        while True:
            f = self.c.read_frame(10)
            if f is None:
                raise RuntimeError("closed")
            t, fl, s, p = f
            if t == h2raw.SETTINGS and not fl & h2raw.ACK:
                self.c.send(h2raw.frame(h2raw.SETTINGS, h2raw.ACK, 0))
            if s == sid and t == h2raw.DATA:
                if t1 is None and p:
                    t1 = time.perf_counter()
                if fl & h2raw.END_STREAM:
                    # keep the connection window open for the next samples
                    self.c.send(h2raw.frame(h2raw.WINDOW_UPDATE, 0, 0, (1 << 20).to_bytes(4, "big")))
                    return (t1 - t0) * 1e6
            if s == sid and t == h2raw.RST_STREAM:
                raise RuntimeError("reset")


def main():
    n = int(sys.argv[1])
    body = Path(sys.argv[2]).read_bytes()
    targets = [a.split("=", 1) for a in sys.argv[3:]]
    conns = {name: (H2 if url.startswith("https") else H1)(url, body) for name, url in targets}
    for c in conns.values():  # warm
        c.once()
    got = {name: [] for name, _ in targets}
    for _ in range(n):
        for name, _ in targets:
            got[name].append(conns[name].once())
    for name, _ in targets:
        v = sorted(got[name])
        print("%s %.0f %.0f" % (name, statistics.median(v), v[int(len(v) * 0.9) - 1]))


if __name__ == "__main__":
    main()
