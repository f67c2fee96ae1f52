"""
h2raw.py — a raw HTTP/2 client for the hardening tests: frames written with
struct.pack, header blocks as HPACK literals without indexing (RFC 7541
6.2.2, no Huffman), so a test can send exactly the frames an attacker would.
Response header blocks are not decoded: tests look at frame types, flags,
stream ids and error codes.
"""

import socket
import struct
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, REFUSED_STREAM, CANCEL, ENHANCE_YOUR_CALM = 0, 1, 2, 7, 8, 11


def _int(v, prefix_bits, first=0):
    top = (1 << prefix_bits) - 1
    if v < top:
        return bytes([first | v])
    out = [first | top]
    v -= top
    while v >= 128:
        out.append((v & 127) | 128)
        v >>= 7
    out.append(v)
    return bytes(out)


def hpack(headers):
    out = b""
    for k, v in headers:
        k, v = k.encode(), v.encode()
        out += b"\x00" + _int(len(k), 7) + k + _int(len(v), 7) + v
    return out


def frame(ftype, flags, sid, payload=b""):
    return struct.pack(">I", len(payload))[1:] + struct.pack(">BBI", ftype, flags, sid) + payload


def req_headers(method, path, authority="localhost", extra=()):
    return [(":method", method), (":scheme", "http"), (":path", path), (":authority", authority)] + list(extra)


class H2Conn:
    def __init__(self, host, port, timeout=5.0, settings=b""):
        self.s = socket.create_connection((host, port), timeout=timeout)
        self.buf = b""
        self.send(PREFACE + frame(SETTINGS, 0, 0, settings))

    def send(self, data):
        self.s.sendall(data)

    def headers(self, sid, headers, end_stream=True):
        self.send(frame(HEADERS, END_HEADERS | (END_STREAM if end_stream else 0), sid, hpack(headers)))

    def data(self, sid, payload, end_stream=True):
        self.send(frame(DATA, END_STREAM if end_stream else 0, sid, payload))

    def rst(self, sid, code=CANCEL):
        self.send(frame(RST_STREAM, 0, sid, struct.pack(">I", code)))

    def read_frame(self, timeout=5.0):
        """(type, flags, sid, payload), or None when the peer closed."""
        deadline = time.monotonic() + timeout
        while True:
            if len(self.buf) >= 9:
                n = struct.unpack(">I", b"\x00" + self.buf[:3])[0]
                if len(self.buf) >= 9 + n:
                    t, fl, sid = struct.unpack(">BBI", self.buf[3:9])
                    p = self.buf[9 : 9 + n]
                    self.buf = self.buf[9 + n :]
                    return t, fl, sid & 0x7FFFFFFF, p
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no frame in %.1fs" % timeout)
            self.s.settimeout(left)
            try:
                d = self.s.recv(65536)
            except ConnectionResetError:
                return None
            if not d:
                return None
            self.buf += d

    def frames_until(self, pred, timeout=5.0):
        """Frames read until pred(frame) is true (that one included) or the
        peer closed (then None ends the list)."""
        out = []
        deadline = time.monotonic() + timeout
        while True:
            f = self.read_frame(max(0.01, deadline - time.monotonic()))
            out.append(f)
            if f is None or pred(f):
                return out

    def goaway(self, timeout=5.0):
        """The GOAWAY's error code, reading until it comes; None if the peer
        closed without one."""
        fs = self.frames_until(lambda f: f[0] == GOAWAY, timeout)
        f = fs[-1]
        return None if f is None else struct.unpack(">I", f[3][4:8])[0]

    def close(self):
        self.s.close()


def send_body_flow_controlled(c, sid, total, chunk=16000, timeout=10.0):
    """Sends `total` body bytes on stream sid within the server's windows
    (65535 each at first, then its WINDOW_UPDATEs), stopping early when the
    server answers the stream (HEADERS). Returns the frames read meanwhile."""
    conn_win = stream_win = 65535
    sent, seen = 0, []
    deadline = time.monotonic() + timeout
    while sent < total and time.monotonic() < deadline:
        n = min(chunk, total - sent, conn_win, stream_win)
        if n > 0:
            c.data(sid, b"a" * n, end_stream=False)
            sent += n
            conn_win -= n
            stream_win -= n
            continue
        f = c.read_frame(max(0.01, deadline - time.monotonic()))
        seen.append(f)
        if f is None:
            break
        if f[0] == WINDOW_UPDATE:
            inc = struct.unpack(">I", f[3][:4])[0] & 0x7FFFFFFF
            if f[2] == 0:
                conn_win += inc
            elif f[2] == sid:
                stream_win += inc
        elif f[0] == SETTINGS and not f[1] & ACK:
            c.send(frame(SETTINGS, ACK, 0))
        elif f[2] == sid and f[0] in (HEADERS, RST_STREAM):
            break
    return seen
