"""
test_core_tls_io.py — the client TLS path that wio.c reads and writes itself
(SSL_read with read-ahead into the input buffer, SSL_write from the output):
TLS records split at odd byte boundaries, many records in one TCP write
(what OpenSSL buffers must all be read before the socket goes quiet), a
large h2 answer under a small window, and a client that goes away mid-stream
with close_notify or with a reset.
"""

import json
import socket
import ssl
import struct

import pytest

import h2raw
import helpers
from helpers import bound, chat_body, client_tls, free_port


@pytest.fixture
def tls_sluice(sluice_factory, mock, tls_files):
    crt, key = tls_files.server
    conf = helpers.base_conf(free_port(), free_port(), mock.url)
    conf["listen"].append({"address": "127.0.0.1:%d" % free_port(), "tls": {"cert": str(crt), "key": str(key)}})
    conf["limits"] = {"send_timeout": "20s"}
    return sluice_factory(conf=conf)


class RawTLS:
    """A TLS client over memory BIOs: the test decides how the TLS bytes
    are cut into TCP writes."""

    def __init__(self, host, port, ctx, alpn=("http/1.1",), split=None):
        ctx.set_alpn_protocols(list(alpn))
        self.s = socket.create_connection((host, port), timeout=bound(10))
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.inb, self.outb = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.o = ctx.wrap_bio(self.inb, self.outb, server_hostname="localhost")
        while True:
            try:
                self.o.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._push(split)
                self._pull()
        self._push(split)

    def _push(self, split=None):
        data = self.outb.read()
        if not split:
            self.s.sendall(data)
            return
        i, k = 0, 0
        while i < len(data):  # cut at the sizes given, round robin
            n = split[k % len(split)]
            self.s.sendall(data[i : i + n])
            i += n
            k += 1

    def _pull(self):
        d = self.s.recv(65536)
        if not d:
            self.inb.write_eof()
        else:
            self.inb.write(d)
        return bool(d)

    def records(self, chunks, split=None):
        """Each chunk is its own TLS record; all are sent together (or cut
        at the split sizes)."""
        for c in chunks:
            self.o.write(c)
        self._push(split)

    def read_until(self, pred):
        got = b""
        while not pred(got):
            try:
                got += self.o.read(65536)
                continue
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLZeroReturnError:
                break
            if not self._pull():
                break
        return got

    def close_notify(self):
        try:
            self.o.unwrap()
        except ssl.SSLWantReadError:
            pass
        self._push()
        self.s.close()

    def reset(self):
        self.s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.s.close()


def post(text, close=False):
    body = json.dumps(chat_body(text)).encode()
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + (b"Connection: close\r\n" if close else b"")
            + b"Content-Length: %d\r\n\r\n" % len(body) + body)


@pytest.mark.parametrize("split", [[1], [2, 3, 5], [7, 1, 4093], [5, 16000]])
def test_tls_records_split_at_odd_byte_boundaries(tls_sluice, tls_files, split):
    host, port = tls_sluice.listener(1)
    t = RawTLS(host, port, client_tls(tls_files.ca_cert), split=split)
    t.records([post("split %r" % (split,), close=True)], split=split)
    got = t.read_until(lambda b: False)  # until the server closes
    assert got.startswith(b"HTTP/1.1 200"), got[:200]
    assert b"echo: split %r" % (split,) in got.replace(b"\\", b"")
    t.s.close()


def test_tls_many_records_in_one_write_are_all_answered(tls_sluice, tls_files):
    """Eight pipelined requests, each in its own record, in one TCP write:
    read-ahead takes them in one read(2) and every one must come out of
    OpenSSL, though the socket has nothing more to say."""
    host, port = tls_sluice.listener(1)
    t = RawTLS(host, port, client_tls(tls_files.ca_cert))
    n = 8
    t.records([post("record %d" % i, close=(i == n - 1)) for i in range(n)])
    got = t.read_until(lambda b: False)
    assert got.count(b"HTTP/1.1 200") == n
    for i in range(n):
        assert b"echo: record %d" % i in got
    t.s.close()


def test_h2_records_split_and_batched_over_tls(tls_sluice, tls_files):
    """The h2 preface, SETTINGS, HEADERS and DATA each in its own record,
    all in one write, and the answer read through the TLS object."""
    host, port = tls_sluice.listener(1)
    t = RawTLS(host, port, client_tls(tls_files.ca_cert), alpn=("h2",))
    assert t.o.selected_alpn_protocol() == "h2"
    body = json.dumps(chat_body("h2 in records")).encode()
    hdrs = h2raw.req_headers("POST", "/v1/chat/completions", extra=[("content-type", "application/json")])
    t.records([h2raw.PREFACE, h2raw.frame(h2raw.SETTINGS, 0, 0),
               h2raw.frame(h2raw.HEADERS, h2raw.END_HEADERS, 1, h2raw.hpack(hdrs)),
               h2raw.frame(h2raw.DATA, h2raw.END_STREAM, 1, body)])

    def data_ended(b):
        fs = frames(b)
        return any(f[0] == h2raw.DATA and f[2] == 1 and f[1] & h2raw.END_STREAM for f in fs)

    got = t.read_until(data_ended)
    payload = b"".join(f[3] for f in frames(got) if f[0] == h2raw.DATA and f[2] == 1)
    assert json.loads(payload)["choices"][0]["message"]["content"] == "echo: h2 in records"
    t.reset()


def frames(b):
    out = []
    while len(b) >= 9:
        n = struct.unpack(">I", b"\x00" + b[:3])[0]
        if len(b) < 9 + n:
            break
        t, fl, sid = struct.unpack(">BBI", b[3:9])
        out.append((t, fl, sid & 0x7FFFFFFF, b[9 : 9 + n]))
        b = b[9 + n :]
    return out


class H2TLS(h2raw.H2Conn):
    """h2raw's connection over a TLS socket (ALPN h2)."""

    def __init__(self, host, port, ctx, settings=b""):
        ctx.set_alpn_protocols(["h2"])
        raw = socket.create_connection((host, port), timeout=bound(10))
        self.s = ctx.wrap_socket(raw, server_hostname="localhost")
        assert self.s.selected_alpn_protocol() == "h2"
        self.buf = b""
        self.send(h2raw.PREFACE + h2raw.frame(h2raw.SETTINGS, 0, 0, settings))


def test_h2_large_answer_under_a_small_window_over_tls(tls_sluice, mock, tls_files):
    """A 1 KiB window: the answer leaves in window-sized pieces, each sent
    once the client opens the window again; every event arrives, in order."""
    host, port = tls_sluice.listener(1)
    nev = 400
    mock.script({"events": nev}, {"events": nev})
    # the same answer over plain HTTP/1.1 first: what every event must be
    with tls_sluice.client() as p:
        r, evs = p.stream("POST", "/v1/chat/completions", chat_body("window", stream=True))
        want = [e.data for e in evs if e.data]
    c = H2TLS(host, port, client_tls(tls_files.ca_cert), settings=b"\x00\x04\x00\x00\x04\x00")
    c.headers(1, h2raw.req_headers("POST", "/v1/chat/completions", extra=[("content-type", "application/json")]),
              end_stream=False)
    c.data(1, json.dumps(chat_body("window", stream=True)).encode())
    body, ended = b"", False
    while not ended:
        f = c.read_frame(timeout=bound(10))
        assert f is not None, "connection closed mid-answer"
        t, fl, sid, p = f
        if t == h2raw.SETTINGS and not fl & h2raw.ACK:
            c.send(h2raw.frame(h2raw.SETTINGS, h2raw.ACK, 0))
        if t == h2raw.DATA and sid == 1:
            assert len(p) <= 1024
            body += p
            ended = bool(fl & h2raw.END_STREAM)
            if p:
                inc = len(p).to_bytes(4, "big")
                c.send(h2raw.frame(h2raw.WINDOW_UPDATE, 0, 0, inc) + h2raw.frame(h2raw.WINDOW_UPDATE, 0, 1, inc))
        assert t != h2raw.RST_STREAM and t != h2raw.GOAWAY, f
    events = [e[len(b"data: "):].decode() for e in body.split(b"\n\n") if e.startswith(b"data: ")]
    assert events[-1] == "[DONE]" and len(events) == len(want) > nev
    assert [json.loads(e)["choices"] for e in events[:-1]] == [json.loads(e)["choices"] for e in want[:-1]]
    assert len(body) > 20 * 1024
    c.close()


@pytest.mark.parametrize("how", ["close_notify", "reset"])
def test_tls_client_gone_mid_stream(tls_sluice, mock, tls_files, how):
    """A client that goes away mid-stream (close_notify, or a reset): the
    upstream is let go and the listener goes on serving."""
    mock.script({"gate": True, "events": 3})
    host, port = tls_sluice.listener(1)
    t = RawTLS(host, port, client_tls(tls_files.ca_cert))
    body = json.dumps(chat_body("gone", stream=True)).encode()
    t.records([b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n" % len(body) + body])
    got = t.read_until(lambda b: b"data: " in b)
    assert got.startswith(b"HTTP/1.1 200")
    getattr(t, how)()
    helpers.wait_until(lambda: mock.requests()[0]["outcome"] == "peer_closed",
                       timeout=bound(5), what="the upstream stream to be let go")
    mock.release(n=10)
    with tls_sluice.client(tls=client_tls(tls_files.ca_cert), server_hostname="localhost", listener=1) as c:
        r = c.request("POST", "/v1/chat/completions", chat_body("after"))
        assert r.status == 200 and r.json()["choices"][0]["message"]["content"] == "echo: after"
